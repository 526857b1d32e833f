"""Many runs of the command line, each still a process of its own with its own exit
code, stdout and stderr, forked from one interpreter that imported fleetpatch once.

Sixty `python -m fleetpatch ...` runs pay sixty interpreter start-ups and imports
(about 0.4 s each); forked from one parent that has imported the CLI and the modules it
imports lazily, each run costs a few milliseconds and runs the same `main()` as the installed program."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DRIVER = r'''
import importlib, json, os, pkgutil, sys, tempfile, traceback
import fleetpatch
from fleetpatch.cli import main

# The CLI imports most of its modules lazily, so each forked run would import them again
# (about 50 ms a run); imported once here, in the parent, every child finds them loaded.
# A module that fails to import is left for the run that needs it to fail on.
for mod in pkgutil.walk_packages(fleetpatch.__path__, "fleetpatch."):
    if not mod.name.endswith("__main__"):
        try:
            importlib.import_module(mod.name)
        except Exception:
            pass

cases = json.loads(sys.stdin.read())
folder = tempfile.mkdtemp(prefix="fleetpatch-forkcli-")
results = []
for i, argv in enumerate(cases):
    out, err = os.path.join(folder, "%d.out" % i), os.path.join(folder, "%d.err" % i)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT, 0o600), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT, 0o600), 2)
            sys.argv = [sys.argv[0]] + argv
            try:
                main()
            except SystemExit as e:
                if isinstance(e.code, str):
                    sys.stderr.write(e.code + "\n")
                    code = 1
                else:
                    code = e.code or 0
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    with open(out) as o, open(err) as e:
        results.append([os.waitstatus_to_exitcode(status), o.read(), e.read()])
    os.unlink(out)
    os.unlink(err)
os.rmdir(folder)
print(json.dumps(results))
'''


def run_many(cases: list[list[str]], cwd: Path, env: dict, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Each argv of `cases` run as `fleetpatch ARGV` in `cwd` with `env`, stdin closed."""
    parent = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(cases), cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout)
    if parent.returncode != 0:
        raise AssertionError(f"the CLI's fork parent failed: {parent.stderr[-2000:]}")
    results = json.loads(parent.stdout)
    assert len(results) == len(cases), f"{len(cases)} runs asked, {len(results)} answered"
    return [subprocess.CompletedProcess(["fleetpatch", *argv], code, out, err)
            for argv, (code, out, err) in zip(cases, results)]
