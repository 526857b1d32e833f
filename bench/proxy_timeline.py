#!/usr/bin/env python3
"""Where each host's time goes through the delay proxy: fleetpatch against the limit, chunk by chunk.

    python3 bench/proxy_timeline.py [--hosts 8] [--repeats 4] [--delay-ms 25] [--out FILE] [--fleetpatch-before CHECKOUT]

The bench's fleet and delay proxy (bench/run.py), with the proxy's --trace on: every chunk it reads,
with its time, connection and direction. For each repeat, fleetpatch's rollout (its own venv, as in
the bench) and the baseline's one `ssh` per host run in turn on a reset fleet. Per host it reads,
from the moment the tool was launched:

- **first bytes**: the client's SSH version line (start-up, then the TCP connect, which the proxy
  holds one round trip);
- **job sent**: the first large write (over 5 KB): fleetpatch's agent with its pre-flight request,
  the baseline's script;
- **apply sent** (fleetpatch): the next large write, after the pre-flight's answer; **pre-flight**
  is from the job sent to that answer's arrival on the laptop (one round trip, the agent's start
  and its reading of the host), **laptop** from that arrival to the apply (its judgement);
- **end**: the last chunk either way.

Medians over the hosts and repeats; the whole trace goes to --out (JSON). The tools' own
results are checked by their exit codes (0 on every run, or the run is reported as failed).
"""
from __future__ import annotations

import argparse
import atexit
import collections
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench   # noqa: E402  (bench/run.py, beside this script)
from fleetpatch_demo.fleet import Fleet, HostSpec   # noqa: E402

BIG = 5000   # bytes: a write this large is the job (agent + request, script) or the apply


def host_phases(events: list, delay: float) -> dict:
    """One connection's chunks [(t, '>' or '<', bytes)], each at the time the proxy read it, ->
    its phases (seconds from the launch). A chunk from the host reaches the laptop `delay` later."""
    big_out = [t for t, d, n in events if d == ">" and n > BIG]
    phases = {"first_bytes": events[0][0], "job_sent": big_out[0] if big_out else None,
              "end": events[-1][0]}
    # the job's own write comes as a run of chunks; the apply is the next large write after it
    later = [t for t in big_out if t > big_out[0] + 0.01] if big_out else []
    if later:
        apply_t = later[0]
        answer = max(t for t, d, n in events if d == "<" and big_out[0] < t < apply_t) + delay
        phases.update(apply_sent=apply_t, preflight=answer - big_out[0], laptop=apply_t - answer)
    return phases


def connections(lines: list[str], t0: float) -> dict:
    """The trace's lines (loop time, connection, direction, bytes) -> {connection: [(t, direction,
    bytes)]}, t in seconds from `t0` (the tool's launch, on the same monotonic clock)."""
    by: dict = collections.defaultdict(list)
    for line in lines:
        t, conn, direction, n = line.split()
        by[conn].append((float(t) - t0, direction, int(n)))
    return by


def at_least(minimum, kind=int):
    """An argparse type: a number of `kind` (int or float), `minimum` or more."""
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None
        if not x >= minimum:   # nan too
            raise argparse.ArgumentTypeError(f"must be {minimum} or more (got {text})")
        return x
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=at_least(1), default=8, help="how many of the fleet's hosts (8)")
    ap.add_argument("--repeats", type=at_least(1), default=4, help="runs of each tool, interleaved (4)")
    ap.add_argument("--delay-ms", type=at_least(0, float), default=25.0, help="each way (25: the bench's 50 ms round trip)")
    ap.add_argument("--out", type=Path, help="the whole trace and the per-host phases, as JSON")
    ap.add_argument("--fleetpatch-before", type=Path, metavar="CHECKOUT",
                    help="also run another checkout's fleetpatch (its src first on the path), interleaved")
    a = ap.parse_args()
    if a.out is not None and (a.out.is_dir() or not a.out.parent.is_dir()):   # found out now, not after the runs
        ap.error(f"--out {a.out}: give a file in a folder that exists")
    before_src = bench.checkout_src(a.fleetpatch_before) if a.fleetpatch_before is not None else None
    if a.fleetpatch_before is not None and before_src is None:
        ap.error(f"--fleetpatch-before {a.fleetpatch_before}: not a fleetpatch checkout (no src/fleetpatch in it)")
    diff_text = bench.DIFF.read_text()
    files = bench.changed_files(diff_text)
    bench.install_fleetpatch(True)
    root = Path(tempfile.mkdtemp(prefix="fleetpatch-timeline-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)   # by then the fleet's context has stopped it
    wd = root / "work"
    wd.mkdir(parents=True)
    specs = [HostSpec(f"h{i:02d}", version=bench.VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0)
             for i in range(a.hosts)]
    runners = {"fleetpatch": lambda fleet, names, tag, net: bench.run_fleetpatch(fleet, names, wd, tag, net),
               "baseline": lambda fleet, names, tag, net: bench.run_baseline(fleet, names, wd, tag, diff_text, files,
                                                                             net)}
    if before_src is not None:
        print(bench.compile_fleetpatch(before_src / "fleetpatch"), flush=True)
        runners["fleetpatch-before"] = lambda fleet, names, tag, net: bench.run_fleetpatch(fleet, names, wd, tag, net,
                                                                                           src=before_src)
    runs = []
    trace = wd / "trace.txt"
    with Fleet(root / "fleet", specs) as fleet, \
            bench.DelayProxy(fleet, wd, a.delay_ms, 3600, trace=trace) as net:
        names = list(fleet.hosts)
        for tool, go in runners.items():   # warm-up, not recorded (bytecode, the agent's compile cache)
            bench.reset_keeping_agent_cache(fleet)
            go(fleet, names, "warm", net)
        for rep in range(a.repeats):
            for tool in (list(runners) if rep % 2 == 0 else list(runners)[::-1]):
                bench.reset_keeping_agent_cache(fleet)
                time.sleep(0.5)
                offset = trace.stat().st_size
                t0 = time.monotonic()   # the proxy's clock is the loop's: time.monotonic()
                r = runners[tool](fleet, names, f"{tool}-{rep}", net)
                time.sleep(0.3)   # the last chunks are written
                with open(trace) as f:
                    f.seek(offset)
                    lines = f.read().splitlines()
                chunks = connections(lines, t0)
                hosts = [host_phases(ev, a.delay_ms / 1000) for ev in chunks.values()]
                runs.append({"tool": tool, "repeat": rep, "wall_s": r["wall_s"], "exit": r["exit"], "hosts": hosts,
                             "chunks": chunks})
                print(f"{tool:10s} repeat {rep}: {r['wall_s']:.2f} s, exit {r['exit']}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"hosts": a.hosts, "delay_ms": a.delay_ms, "runs": runs}, indent=1))
    print(f"\n{a.hosts} hosts, {a.repeats} repeats, {2 * a.delay_ms:g} ms round trip; medians over hosts and repeats "
          "(s from the launch)\n")
    keys = ("first_bytes", "job_sent", "apply_sent", "preflight", "laptop", "end")
    print("| tool | wall | " + " | ".join(k.replace("_", " ") for k in keys) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in keys) + " |")
    for tool in runners:
        mine = [r for r in runs if r["tool"] == tool]
        failed = sum(1 for r in mine if r["exit"])
        cells = []
        for k in keys:
            xs = [h[k] for r in mine for h in r["hosts"] if h.get(k) is not None]
            cells.append(f"{statistics.median(xs):.3f}" if xs else "-")
        wall = statistics.median(r["wall_s"] for r in mine)
        print(f"| {tool}{f' ({failed} failed)' if failed else ''} | {wall:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, bench._interrupted)   # as bench/run.py: a second Ctrl-C cannot cut the clean-up
    signal.signal(signal.SIGTERM, bench._interrupted)
    try:
        main()
    except KeyboardInterrupt:
        print("proxy_timeline: interrupted; the test fleet and the delay proxy were stopped, nothing written",
              file=sys.stderr)
        sys.exit(130)
