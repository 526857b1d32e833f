"""Where a rollout to container hosts spends its time, host by host: every program the
rollout runs on a host, traced on that host's side.

    python bench/container_trace.py [--hosts 8] [--repeats 3] [--instrumented 5] [--out bench/container_trace.json]

Starts the bench's two fleets (run.py: h00… plain hosts, c00… container hosts on the tests'
Docker daemon, or a private one), and per repeat and fleet (order alternating) resets the
fleet as the bench does, attaches ``strace -f -e trace=execve,kill`` to every host's sshd,
runs the same ``fleetpatch rollout`` of spec-path-beacon, and checks the result with the
bench's check. From the traces, per host: when the agent started, every ``docker`` command
the agent ran on a container host (inspect, stop, start, logs) with its start and end, the
SIGTERM to a plain host's server and the start of the new one. strace (--seccomp-bpf: only
execve and kill stop the tracee) still slows every fork on the traced side, and on a plain
host the new server is the agent's child, traced too, while a container's is not: compare
the docker commands' counts and durations, not the traced runs' wall times.

Then, untraced, --instrumented times per fleet (order alternating) the bench's instrumented
rollout (bench/fp_instrumented.py: each agent round trip timed from the controller: probe,
apply = files + restart, follow = the new server's log to the verdict), for medians per op.

Needs root, strace. Writes the summary (and every host's timeline) to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("fleetpatch_bench_run", BENCH / "run.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

from fleetpatch_demo.fleet import Fleet, HostSpec  # noqa: E402

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")


def start_traces(fleet: Fleet, names, d: Path) -> list[subprocess.Popen]:
    procs = []
    for n in names:
        pid = fleet.hosts[n].sshd_pid
        procs.append(subprocess.Popen(["strace", "-q", "-f", "--seccomp-bpf", "-ttt", "-s", "256", "-e", "trace=execve,kill",
                                       "-o", str(d / f"{n}.trace"), "-p", str(pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)   # attached (strace needs a moment per process)
    return procs


def stop_traces(procs) -> None:
    for p in procs:
        p.send_signal(signal.SIGINT)   # detaches
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def parse(path: Path, t0: float) -> dict:
    """A host's timeline, in seconds since the tool's launch."""
    execs, exits, kills = {}, {}, []
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        pid, t, rest = int(m.group(1)), float(m.group(2)) - t0, m.group(3)
        if rest.startswith("execve(") and rest.rstrip().endswith("= 0"):
            argv = re.findall(r'"((?:[^"\\]|\\.)*)"', rest.split("[", 1)[1].split("]", 1)[0]) if "[" in rest else []
            execs[pid] = (t, argv)
        elif rest.startswith("+++ exited") or rest.startswith("+++ killed"):
            exits[pid] = t
        elif rest.startswith("kill(") and "SIGTERM" in rest:
            kills.append(t)
    out = {"agent_start": None, "docker": [], "server_start": None, "sigterm": kills[0] if kills else None}
    for pid, (t, argv) in sorted(execs.items(), key=lambda kv: kv[1][0]):
        prog = os.path.basename(argv[0]) if argv else ""
        if prog == "docker" and len(argv) > 1:
            sub = next((a for a in argv[1:] if not a.startswith("-")), "?")
            out["docker"].append({"cmd": sub, "start": round(t, 3), "end": round(exits.get(pid, t), 3),
                                  "s": round(exits.get(pid, t) - t, 3)})
        elif "fleetpatch-agent-boot" in " ".join(argv) and out["agent_start"] is None:
            out["agent_start"] = round(t, 3)
        elif "sglang_standin" in " ".join(argv) and out["server_start"] is None:
            out["server_start"] = round(t, 3)
    return out


def summarize(timelines: list[dict]) -> dict:
    med = bench.med
    by_cmd: dict = {}
    for tl in timelines:
        for c in tl["docker"]:
            by_cmd.setdefault(c["cmd"], []).append(c["s"])
    per_host = [len(tl["docker"]) for tl in timelines]
    out = {"hosts": len(timelines), "agent_start_s": med([tl["agent_start"] for tl in timelines]),
           "docker_calls_per_host": sorted(set(per_host)),
           "docker_by_cmd": {k: {"per_host": round(len(v) / len(timelines), 2), "median_s": round(med(v), 3),
                                 "max_s": round(max(v), 3)} for k, v in sorted(by_cmd.items())}}
    docker_serial = [sum(c["s"] for c in tl["docker"] if c["cmd"] != "logs") for tl in timelines]
    if any(docker_serial):
        out["docker_wait_per_host_s"] = round(med(docker_serial), 3)   # the agent waits on these (logs runs beside)

        def first(tl, cmd, key):
            return next((c[key] for c in tl["docker"] if c["cmd"] == cmd), None)

        out["stop_s"] = med([(first(tl, "stop", "end") or 0) - (first(tl, "stop", "start") or 0) for tl in timelines])
        out["start_s"] = med([(first(tl, "start", "end") or 0) - (first(tl, "start", "start") or 0)
                              for tl in timelines])
        out["agent_start_to_stop_s"] = med([first(tl, "stop", "start") - tl["agent_start"] for tl in timelines
                                            if tl["agent_start"] is not None and first(tl, "stop", "start")])
        out["inspects_before_stop"] = med([sum(1 for c in tl["docker"] if c["cmd"] == "inspect"
                                               and c["start"] < (first(tl, "stop", "start") or 1e9))
                                           for tl in timelines])
        out["restart_done_s"] = med([first(tl, "start", "end") for tl in timelines if first(tl, "start", "end")])
    else:
        out["agent_start_to_sigterm_s"] = med([tl["sigterm"] - tl["agent_start"] for tl in timelines
                                               if tl["sigterm"] is not None and tl["agent_start"] is not None])
        out["sigterm_to_server_start_s"] = med([tl["server_start"] - tl["sigterm"] for tl in timelines
                                                if tl["sigterm"] is not None and tl["server_start"] is not None])
        out["restart_done_s"] = med([tl["server_start"] for tl in timelines if tl["server_start"]])
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--instrumented", type=int, default=5, help="untraced instrumented rollouts per fleet")
    ap.add_argument("--out", default=str(BENCH / "container_trace.json"))
    a = ap.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("strace"):
        sys.exit("container_trace: needs root and strace")
    docker, note = bench.container_daemon()
    diff_text = bench.DIFF.read_text()
    files = bench.changed_files(diff_text)
    expect = bench.expected_shas(diff_text, files)
    root = Path(tempfile.mkdtemp(prefix="fleetpatch-ctrace-"))
    wd = root / "work"
    wd.mkdir()
    specs = {"plain": [HostSpec(f"h{i:02d}", version=bench.VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0)
                       for i in range(a.hosts)],
             "container": [HostSpec(f"c{i:02d}", version=bench.VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0,
                                    container=True) for i in range(a.hosts)]}
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "hosts": a.hosts, "repeats": a.repeats, "docker": note,
           "machine": bench.machine(), "runs": []}
    try:
        with contextlib.ExitStack() as stack:
            fleets = {fl: stack.enter_context(Fleet(root / fl, specs[fl], docker_sock=docker.sock
                                                    if fl == "container" else None)) for fl in specs}
            nets = {fl: bench.loopback_net(f) for fl, f in fleets.items()}
            for fl, f in fleets.items():   # warm-up: every host's agent compile cache
                bench.reset_keeping_agent_cache(f)
                bench.run_fleetpatch(f, f.names, wd, f"warm-{fl}", nets[fl])
            for rep in range(a.repeats):
                for fl in (["plain", "container"] if rep % 2 == 0 else ["container", "plain"]):
                    f = fleets[fl]
                    bench.reset_keeping_agent_cache(f)
                    before = bench.snapshot(f, f.names)
                    bench.wait_quiet(30)
                    d = wd / f"trace-{fl}-{rep}"
                    d.mkdir()
                    procs = start_traces(f, f.names, d)
                    try:
                        r = bench.run_fleetpatch(f, f.names, wd, f"trace-{fl}-{rep}", nets[fl])
                    finally:
                        stop_traces(procs)
                    checked = bench.check(f, f.names, before, expect)
                    tls = {n: parse(d / f"{n}.trace", r["t_launch"]) for n in f.names}
                    run = {"fleet": fl, "rep": rep, "wall_s": round(r["wall_s"], 3), "exit": r["exit"],
                           "checked_ok": sum(1 for n in f.names if not checked[n]),
                           "host_duration_s": {n: h.get("duration_s") for n, h in r["hosts"].items()},
                           "summary": summarize(list(tls.values())), "timelines": tls}
                    res["runs"].append(run)
                    print(f"[trace] {fl:9s} rep {rep}: {run['wall_s']:.2f} s (traced), exit {r['exit']}, "
                          f"check {run['checked_ok']}/{len(f.names)}: {json.dumps(run['summary'])}", flush=True)
            ins: dict = {fl: [] for fl in specs}
            for rep in range(a.instrumented):
                for fl in (["plain", "container"] if rep % 2 == 0 else ["container", "plain"]):
                    f = fleets[fl]
                    bench.reset_keeping_agent_cache(f)
                    bench.wait_quiet(30)
                    doc = bench.run_instrumented(f, f.names, wd, nets[fl])
                    ins[fl].append(bench.instrumented_summary(doc))
                    print(f"[instrumented] {fl:9s} rep {rep}: {json.dumps(ins[fl][-1])}", flush=True)
            res["instrumented"] = {fl: {
                "runs": len(xs), "wall_s": [x["wall_s"] for x in xs],
                "connect_median_s": bench.med([x["connect_median_s"] for x in xs]),
                "ops_median_s": {op: round(bench.med([x["ops"][op]["median_s"] for x in xs if op in x["ops"]]), 3)
                                 for op in xs[0]["ops"]} if xs else {},
                "ops_max_median_s": {op: round(bench.med([x["ops"][op]["max_s"] for x in xs if op in x["ops"]]), 3)
                                     for op in xs[0]["ops"]} if xs else {}}
                for fl, xs in ins.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res["summary"] = {fl: summarize([tl for run in res["runs"] if run["fleet"] == fl
                                     for tl in run["timelines"].values()]) for fl in specs}
    res["summary"]["wall_s"] = {fl: [run["wall_s"] for run in res["runs"] if run["fleet"] == fl] for fl in specs}
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["summary"], indent=1))
    print(json.dumps(res.get("instrumented"), indent=1))
    return 0 if all(run["checked_ok"] == a.hosts for run in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
