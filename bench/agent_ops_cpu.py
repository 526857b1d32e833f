"""The host agent's CPU by request (issue 34): boot, probe, apply, follow, ... on bench hosts.

Each SRC (a checkout's `src`, e.g. `git archive HEAD src | tar -x -C /tmp/before`) is copied and
its agent given a trace: `time.process_time()` around each request, written to a file (the copy
only; the product has no such trace). Then `rollout` of the bench patch on N real sshd hosts
(loopback), probe on and `--no-probe`, the SRCs interleaved, the fleet reset as the bench resets
it (the agent's compile cache, site and package answers and `probe-code` kept; `probe-plans`
wiped: every run is a patch's first deploy). Prints per SRC and mode the median CPU of each
request and of the whole agent ("boot": at its first request; "total": at its end).

    python3 bench/agent_ops_cpu.py [--hosts 1] [--reps 4] [--containers] SRC [SRC ...]

--containers: container hosts (the engine in a Docker container, as `bench/run.py --fleets
container` has them), on the daemon that the bench uses (FLEETPATCH_TEST_DOCKER_SOCK, else the
tests' daemon, else a private one it starts and stops).
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: the fleet, its inventory and its reset)
from fleetpatch_demo.fleet import Fleet, HostSpec  # noqa: E402

TRACED = '''def dispatch(state, req):
    """Run one request; an unknown op is the laptop's bug, said plainly."""
    t0 = time.process_time()
    try:
        return _dispatch(state, req)
    finally:
        with open(%(trace)r, "a") as f:
            f.write("%%d %%s %%.6f %%.6f\\n" %% (os.getpid(), req.get("op"), t0, time.process_time() - t0))


def _dispatch(state, req):
'''
END = '''    end_session(state, how)
    with open(%(trace)r, "a") as f:
        f.write("%%d END %%.6f 0\\n" %% (os.getpid(), time.process_time()))
'''


def traced_copy(src: str, into: Path, trace: Path) -> Path:
    dest = into / "src"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    session = dest / "fleetpatch" / "agent" / "session.py"
    text = session.read_text()
    head = 'def dispatch(state, req):\n    """Run one request; an unknown op is the laptop\'s bug, said plainly."""\n'
    if head not in text or "    end_session(state, how)\n" not in text:
        raise SystemExit(f"{src}: agent/session.py has no dispatch/end_session to trace")
    text = text.replace(head, TRACED % {"trace": str(trace)}, 1)
    text = text.replace("    end_session(state, how)\n", END % {"trace": str(trace)}, 1)
    session.write_text(text)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--containers", action="store_true")
    ap.add_argument("src", nargs="+")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fp-agent-ops-"))
    trace = work / "trace.txt"
    copies = [traced_copy(s, work / f"src{i}", trace) for i, s in enumerate(a.src)]
    specs = [HostSpec("%s%02d" % ("c" if a.containers else "h", i), version=bench.VERSION, spec_v2=False,
                      startup_delay=0.0, container=a.containers) for i in range(a.hosts)]
    # the bench's daemon: FLEETPATCH_TEST_DOCKER_SOCK, the tests' one, else a private one (one line if none)
    sock = bench.container_daemon("--containers")[0].sock if a.containers else None
    res: dict = collections.defaultdict(list)
    try:
        with Fleet(work / "fleet", specs, docker_sock=sock) as fleet:
            inv = bench.write_inventory(fleet, fleet.names, work / "hosts.yaml", bench.loopback_net(fleet))
            for rep in range(a.reps + 1):          # the first round fills each copy's caches
                for i, copy in enumerate(copies):
                    for mode in ("probe", "noprobe"):
                        bench.reset_keeping_agent_cache(fleet)
                        time.sleep(0.5)
                        trace.unlink(missing_ok=True)
                        argv = [sys.executable, "-m", "fleetpatch", "rollout", "--patch", bench.PATCH, "--group", "all",
                                "--canary", "0", "--inventory", str(inv)] + (["--no-probe"] if mode == "noprobe" else [])
                        done = subprocess.run(argv, cwd=work, capture_output=True, text=True,
                                              env=dict(os.environ, PYTHONPATH=str(copy), COLUMNS="200"))
                        if done.returncode:
                            raise SystemExit(f"rollout exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                        if rep == 0:
                            continue
                        agents: dict = collections.defaultdict(dict)
                        for line in trace.read_text().splitlines():
                            pid, op, start, spent = line.split()
                            agents[pid][op] = (float(start), float(spent))
                        for ops in agents.values():
                            if "probe" not in ops or "END" not in ops:
                                continue
                            res[i, mode, "boot"].append(ops["probe"][0])
                            res[i, mode, "total"].append(ops["END"][0])
                            for op, (_, spent) in ops.items():
                                if op != "END":
                                    res[i, mode, op].append(spent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for (i, mode, op), v in sorted(res.items()):
        print("%-28s %-8s %-10s median %6.1f ms  (min %.1f, max %.1f, %d agents)" % (
            a.src[i][-28:], mode, op, 1000 * statistics.median(v), 1000 * min(v), 1000 * max(v), len(v)))


if __name__ == "__main__":
    main()
