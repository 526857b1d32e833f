"""The program ends as soon as its command is over (issue 34): its output out, its exit code as
the command set it, and no interpreter teardown after the verdict (40 ms on the bench machine),
unless a thread of it still runs; a run of main() inside another program never ends that program."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fleetpatch

SRC = str(Path(fleetpatch.__file__).resolve().parent.parent)

RUN = r"""
import atexit, sys, threading, time
mark = sys.argv[1]
atexit.register(lambda: open(mark, "w").write("teardown ran"))
if sys.argv[2] == "thread":   # lives until the program's main thread is done, however slow the machine
    threading.Thread(target=threading.main_thread().join).start()
sys.argv = ["fleetpatch"] + sys.argv[3:]
from fleetpatch.__main__ import entry
entry()
"""


def run(tmp_path, mode, *argv):
    mark = tmp_path / f"teardown-{mode}-{len(argv)}"
    done = subprocess.run([sys.executable, "-c", RUN, str(mark), mode, *argv], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=SRC), timeout=60)
    return done, mark.exists()


def test_a_finished_command_exits_with_its_code_and_output_and_no_teardown(tmp_path):
    done, torn_down = run(tmp_path, "alone", "--version")
    assert (done.returncode, done.stdout.strip(), torn_down) == (0, f"fleetpatch {fleetpatch.__version__}", False)
    done, torn_down = run(tmp_path, "alone", "rollout", "--canary", "abc")
    assert done.returncode == 2 and "--canary: expected a whole number" in done.stderr and not torn_down


def test_while_another_thread_runs_the_interpreter_ends_as_usual(tmp_path):
    done, torn_down = run(tmp_path, "thread", "--version")
    assert (done.returncode, torn_down) == (0, True)


def test_main_inside_another_program_raises_systemexit_and_leaves_it_running():
    code = ("import sys\nfrom fleetpatch.cli import main\nsys.argv = ['fleetpatch', '--version']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('still here', e.code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=SRC), timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "still here 0"
