"""What the host agent's start costs, split: the interpreter, the stdlib modules it imports, and
the rest (its own modules through the compile cache, the boot stream). Issue 34, item 2.

    python3 bench/agent_import_cpu.py [--python /usr/bin/python3] [--reps 25] [SRC]

Each case is a fresh `PY -S` process; its CPU (user + system, `os.wait4`) is taken over `--reps`
interleaved rounds, median and first quartile. The cases:

- `bare`: `-S -c pass`;
- `stage two`: the imports of agentboot.py alone (hashlib, hmac, json, zlib, ...);
- `the boot's stdlib`: every stdlib module the agent has loaded when it says `bye` (read with
  `-X importtime` from a real boot), imported and nothing else;
- `boot + bye`: the agent itself, from SRC's boot stream (the compile cache warm);
- one line per stdlib module group over `bare`, to see which weigh.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

STAGE_TWO = "import atexit, gc, hashlib, hmac, json, marshal, os, stat, sys, types, zlib"
GROUPS = ["json", "re", "enum", "subprocess", "threading", "hashlib", "hashlib, hmac", "ctypes", "ast"]


def boot_files(src: str, state: str) -> tuple[str, bytes]:
    code = ("import sys; sys.path.insert(0, %r); from fleetpatch import remote; "
            "sys.stdout.buffer.write(remote.boot_stream(%r) + remote.request_line({'op': 'bye'}))" % (src, state))
    stream = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    boot = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); from fleetpatch import remote; "
                           "print(remote.BOOTSTRAP)" % src], capture_output=True, text=True, check=True).stdout.strip()
    return boot, stream


def boot_modules(python: str, boot: str, stream: bytes) -> list[str]:
    """The stdlib modules a booted agent has imported, as `-X importtime` lists them (top level
    names that can be imported on their own)."""
    out = subprocess.run([python, "-X", "importtime", "-S", "-c", boot], input=stream, capture_output=True,
                         check=True).stderr.decode()
    names = []
    for line in out.splitlines():
        if not line.startswith("import time:") or "|" not in line or "imported package" in line:
            continue   # the header line
        name = line.rsplit("|", 1)[1].strip()
        if name and not name.startswith("_") and name not in names and name.split(".")[0] not in (
                "encodings", "genericpath", "posixpath", "msvcrt", "zipimport", "nt"):
            names.append(name)
    return names


def cpu(argv: list[str], stdin: bytes | None) -> float:
    p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if stdin is not None:
        p.stdin.write(stdin)
        p.stdin.close()
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed: {err.decode(errors='replace')[-400:]}")
    return 1000 * (ru.ru_utime + ru.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"),
                    help="the fleetpatch source tree whose agent is measured (default: this checkout's src)")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--reps", type=int, default=25)
    a = ap.parse_args()
    if not os.access(a.python, os.X_OK):
        ap.error("--python: %s is not an interpreter that can be run" % a.python)
    if not os.path.isfile(os.path.join(a.src, "fleetpatch", "__init__.py")):
        ap.error("src: %s holds no fleetpatch package (a checkout's src folder)" % a.src)
    if a.reps < 1:
        ap.error("--reps: expected 1 or more, got %d" % a.reps)
    with tempfile.TemporaryDirectory(prefix="fleetpatch-importcpu-") as tmp:
        boot, stream = boot_files(os.path.abspath(a.src), os.path.join(tmp, "state"))
        cpu([a.python, "-S", "-c", boot], stream)   # fills the compile cache
        mods = boot_modules(a.python, boot, stream)
        cases = {"bare": ("pass", None), "stage two": (STAGE_TWO, None),
                 "the boot's stdlib (%d modules)" % len(mods): ("import " + ", ".join(mods), None),
                 "boot + bye": (boot, stream)}
        cases.update(("+ " + g, ("import " + g, None)) for g in GROUPS)
        got: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(a.reps):
            for k, (code, stdin) in cases.items():
                got[k].append(cpu([a.python, "-S", "-c", code], stdin))
    bare = statistics.median(got["bare"])
    print(f"{a.python} ({subprocess.run([a.python, '-V'], capture_output=True, text=True).stdout.strip()}), "
          f"{a.reps} interleaved rounds, ms of CPU per process")
    for k, v in got.items():
        med = statistics.median(v)
        print("%-36s median %5.1f  (over bare %+5.1f)  first quartile %5.1f" % (
            k, med, med - bare, sorted(v)[len(v) // 4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
