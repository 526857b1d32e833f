"""Host shapes: a 4-server host and a 2-node group against as many one-server hosts.

Wall time of deploy-patch and rollback, and the commands per host, of a host with 4
servers and of a 2-node group, each beside the same number of one-server hosts.

    python bench/shapes_bench.py --repeats 5 --out bench/shapes_results.json

One sshd test fleet (fleetpatch_demo.fleet, SGLang 0.5.9 trees, the stand-in server)
holds every host at once: m4 (HostSpec servers=4: s0..s3 on one install), s0..s3 (one
server each), n0 and n1 (node group g2, ranks 0 and 1) and p0, p1 (one server each).
Each run goes to the selected hosts only, with the installed CLI as the operator runs
it (`python3 -m fleetpatch deploy-patch --patch spec-path-beacon <selection> --report
...` from a working folder holding the fleet's hosts.yaml), and is compared with:

    servers: --hosts m4          against  --hosts s0,s1,s2,s3   (4 servers restarted each)
    nodes:   --group g2          against  --hosts p0,p1         (2 hosts each)

A variant's run is: the fleet reset to pristine (every host; fleetpatch's agent compile
cache in the state dir kept, as bench/run.py does), its commands log cleared, the
deploy-patch (timed), the commands log read and cleared, then the rollback of the same
selection (timed). The order of the two variants of a shape alternates per repeat. One
warm-up deploy to every host comes first and is not recorded (it fills every host's
agent compile cache). Every run must exit 0 with each selected host (and each of m4's
servers) verified / rolled-back, and no host outside the selection may have run a
command: anything else stops the bench with an error, never a figure.

Recorded per run: wall time (launch to exit of the CLI), the SSH commands each host ran
(counted by the fleet's sshd ForceCommand wrapper), the report's round_trips and
duration_s per host, and the load average before the run. Needs root and
/usr/sbin/sshd, like the fleet tests.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

PATCH = "spec-path-beacon"
# shape -> its two variants: (name, the CLI's selection, the hosts it selects)
SHAPES = {
    "servers": [("m4 (1 host, 4 servers)", ["--hosts", "m4"], ["m4"]),
                ("s0-s3 (4 hosts, 1 server each)", ["--hosts", "s0,s1,s2,s3"], ["s0", "s1", "s2", "s3"])],
    "nodes": [("g2 (2-node group n0,n1)", ["--group", "g2"], ["n0", "n1"]),
              ("p0,p1 (2 hosts, 1 server each)", ["--hosts", "p0,p1"], ["p0", "p1"])],
}
WANT = {"deploy-patch": "verified", "rollback": "rolled-back"}


class BenchError(RuntimeError):
    """A run that did not do what it was asked: the bench stops, no figure is written."""


def whole(flag: str):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number of 1 or more, not {text!r}")
        return n
    return parse


def load_avg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "-"


def specs():
    from fleetpatch_demo.fleet import HostSpec
    return ([HostSpec("m4", servers=4)] + [HostSpec(f"s{i}") for i in range(4)]
            + [HostSpec("n0", node_group="g2"), HostSpec("n1", node_group="g2")]
            + [HostSpec("p0"), HostSpec("p1")])


def reset_keeping_agent_cache(fleet) -> None:
    """fleet.reset_all(), with each host's state/agent-cache put aside and back (as bench/run.py)."""
    kept = []
    for h in fleet.hosts.values():
        cache = h.host_dir / "state" / "agent-cache"
        if cache.is_dir():
            aside = h.host_dir / "agent-cache.bench-keep"
            shutil.rmtree(aside, ignore_errors=True)
            cache.rename(aside)
            kept.append((aside, cache))
    try:
        fleet.reset_all()
    finally:
        for aside, cache in kept:
            cache.parent.mkdir(parents=True, exist_ok=True)
            aside.rename(cache)


def cli(work: Path, command: str, selection: list, tag: str) -> tuple:
    report = work / f"report-{tag}.json"
    report.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "fleetpatch", command, "--patch", PATCH, *selection, "--report", str(report)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "200"}
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600, env=env)
    wall = time.monotonic() - t0
    doc = json.loads(report.read_text()) if report.exists() else None
    return proc, wall, doc


def check(proc, doc, command: str, hosts: list, label: str) -> None:
    """The run did what it was asked on every selected host (and each server of m4), or BenchError."""
    want = WANT[command]
    why = []
    if proc.returncode != 0:
        why.append(f"exit {proc.returncode}")
    if doc is None:
        why.append("no report written")
    else:
        got = doc.get("hosts", {})
        if sorted(got) != sorted(hosts):
            why.append(f"report's hosts {sorted(got)}, not {sorted(hosts)}")
        for name in hosts:
            r = got.get(name) or {}
            if r.get("status") != want:
                why.append(f"{name}: {r.get('status')} ({r.get('message', '')})")
            for s, sr in (r.get("servers") or {}).items():
                if sr.get("status") != want:
                    why.append(f"{name} [{s}]: {sr.get('status')} ({sr.get('message', '')})")
    if why:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise BenchError(f"{label} {command}: " + "; ".join(why) + f"\n{tail}")


def one(fleet, work: Path, shape: str, variant: int, repeat: int) -> list:
    label, selection, hosts = SHAPES[shape][variant]
    reset_keeping_agent_cache(fleet)
    fleet.clear_commands()
    rows = []
    for command in ("deploy-patch", "rollback"):
        load = load_avg()
        proc, wall, doc = cli(work, command, selection, f"{shape}-{variant}-{repeat}-{command}")
        check(proc, doc, command, hosts, label)
        cmds = {n: len(fleet.commands(n)) for n in fleet.names}
        stray = {n: c for n, c in cmds.items() if c and n not in hosts}
        if stray:
            raise BenchError(f"{label} {command}: hosts outside the selection ran commands: {stray}")
        fleet.clear_commands()
        rep = doc["hosts"]
        rows.append({
            "shape": shape, "variant": label, "selection": " ".join(selection), "command": command,
            "repeat": repeat, "wall_s": round(wall, 3), "loadavg_before": load,
            "commands": {n: cmds[n] for n in hosts},
            "round_trips": {n: rep[n]["round_trips"] for n in hosts},
            "duration_s": {n: rep[n]["duration_s"] for n in hosts},
            "servers_restarted": sum(len(rep[n].get("servers") or {}) or 1 for n in hosts),
        })
        r = rows[-1]
        print(f"[{time.strftime('%H:%M:%S')}] {shape:7s} {command:12s} {label:32s} rep {repeat}: "
              f"{r['wall_s']:6.2f} s  commands {r['commands']}  round_trips {r['round_trips']}  load {load}",
              flush=True)
    return rows


def spread(values: list) -> dict | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def summarize(runs: list) -> list:
    out = []
    for shape, variants in SHAPES.items():
        for command in WANT:
            for label, selection, hosts in variants:
                rs = [r for r in runs if r["shape"] == shape and r["variant"] == label and r["command"] == command]
                if not rs:
                    continue
                per_host = sorted({c for r in rs for c in r["commands"].values()})
                trips = sorted({c for r in rs for c in r["round_trips"].values()})
                out.append({"shape": shape, "command": command, "variant": label, "selection": " ".join(selection),
                            "runs": len(rs), "servers_restarted": rs[0]["servers_restarted"],
                            "wall_s": spread([r["wall_s"] for r in rs]),
                            "commands_per_host": per_host, "round_trips_per_host": trips,
                            "host_duration_s": spread([d for r in rs for d in r["duration_s"].values()]),
                            "loadavg_1m": spread([float(r["loadavg_before"].split()[0]) for r in rs
                                                  if r["loadavg_before"] != "-"])})
    return out


def table(summary: list) -> str:
    lines = ["| shape | command | variant | servers restarted | wall s, median (min-max) | commands / host "
             "| round trips / host | load (1 min) before, median (min-max) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in summary:
        w, ld = s["wall_s"], s["loadavg_1m"] or {"median": 0.0, "min": 0.0, "max": 0.0}
        lines.append(f"| {s['shape']} | {s['command']} | {s['variant']} | {s['servers_restarted']} | "
                     f"{w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | "
                     f"{', '.join(map(str, s['commands_per_host']))} | "
                     f"{', '.join(map(str, s['round_trips_per_host']))} | "
                     f"{ld['median']:.2f} ({ld['min']:.2f}-{ld['max']:.2f}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=whole("--repeats"), default=5,
                    help="runs of each variant (default 5); the order of a shape's two variants alternates per repeat")
    ap.add_argument("--out", default=str(REPO / "bench" / "shapes_results.json"),
                    help="the JSON written: every run, and the summary (default bench/shapes_results.json)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if not out.parent.is_dir():
        ap.error(f"--out: no folder {str(out.parent)!r}")

    from fleetpatch_demo.fleet import Fleet

    started = time.time()
    load_start = load_avg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="shapesbench-") as tmp:
        tmp = Path(tmp)
        work = tmp / "work"
        work.mkdir()
        print(f"starting a fleet of 9 hosts (load {load_start})", flush=True)
        with Fleet(tmp / "fleet", specs()) as fleet:
            fleet.write_inventory(work / "hosts.yaml")
            # warm-up, not recorded: every host's agent compile cache filled once
            proc, wall, doc = cli(work, "deploy-patch", ["--group", "all"], "warmup")
            check(proc, doc, "deploy-patch", fleet.names, "warm-up")
            print(f"warm-up deploy to all 9 hosts: {wall:.2f} s (not recorded)", flush=True)
            for repeat in range(a.repeats):
                for shape in SHAPES:
                    order = (0, 1) if repeat % 2 == 0 else (1, 0)
                    for variant in order:
                        runs.extend(one(fleet, work, shape, variant, repeat))
    summary = summarize(runs)
    doc = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
           "bench_s": round(time.time() - started, 1), "repeats": a.repeats, "patch": PATCH,
           "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
                       "loadavg_start": load_start, "loadavg_end": load_avg()},
           "commit": git_commit(), "summary": summary, "runs": runs}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(summary))
    print(f"load average at start {load_start}, at end {doc['machine']['loadavg_end']}; wrote {out}")
    return 0


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "-"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"shapes_bench: a run failed, no figures written:\n{e}", file=sys.stderr)
        sys.exit(1)
