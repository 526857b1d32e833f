"""The host agent's own start, in CPU: boot (stage two, the modules through the compile cache)
and `bye`, nothing else, as a local process; optionally against another checkout, interleaved.

    python3 bench/agent_boot_cpu.py [--reps 15] [--rounds 3] [--python PY] SRC [SRC ...]

SRC: a checkout's `src` folder (e.g. `git archive HEAD src | tar -x -C /tmp/before`). Prints,
per round and SRC, the median/min/max CPU (user + system, `os.wait4`) of `--reps` agent
processes; a bare `PY -S -c pass` is the floor. The compile cache is warm (one run first).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile


def agent_cpu(src: str, python: str, reps: int, state: str) -> list[float]:
    code = ("import sys; sys.path.insert(0, %r); from fleetpatch import remote; "
            "sys.stdout.buffer.write(remote.boot_stream(%r) + remote.request_line({'op': 'bye'}))" % (src, state))
    stream = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    boot = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); from fleetpatch import remote; "
                           "print(remote.BOOTSTRAP)" % src], capture_output=True, text=True, check=True).stdout.strip()
    out = []
    for i in range(reps + 1):   # the first fills the compile cache
        p = subprocess.Popen([python, "-S", "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        p.stdin.write(stream)
        p.stdin.close()
        _, status, ru = os.wait4(p.pid, 0)
        err = p.stderr.read()
        p.stderr.close()
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode or err:
            raise SystemExit(f"{src}: the agent exited {p.returncode}: {err.decode(errors='replace')[-500:]}")
        if i:
            out.append(ru.ru_utime + ru.ru_stime)
    return out


def bare_cpu(python: str, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        p = subprocess.Popen([python, "-S", "-c", "pass"])
        _, _, ru = os.wait4(p.pid, 0)
        p.returncode = 0
        out.append(ru.ru_utime + ru.ru_stime)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="+")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetpatch-bootcpu-") as tmp:
        for r in range(a.rounds):
            for i, src in enumerate(a.src):
                xs = agent_cpu(os.path.abspath(src), a.python, a.reps, os.path.join(tmp, f"state{i}"))
                print(f"round {r + 1} {src}: boot + bye {1000 * statistics.median(xs):.1f} ms CPU "
                      f"(min {1000 * min(xs):.1f}, max {1000 * max(xs):.1f}, {len(xs)} processes)", flush=True)
            xs = bare_cpu(a.python, a.reps)
            print(f"round {r + 1} bare `-S -c pass`: {1000 * statistics.median(xs):.1f} ms CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
