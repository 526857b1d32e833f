"""`invoke <command>` in the repo runs the same tasks as the installed `fleetpatch` program,
plus `invoke bench` (repo only: the benchmark in bench/)."""
import shlex
import sys
from pathlib import Path

from invoke import task

from fleetpatch.cli import ns  # noqa: F401

REPO = Path(__file__).resolve().parent


@task(help={"sizes": "fleet sizes, comma-separated (default 1,8,32; at most 32)",
            "repeats": "runs per size and tool (default 3)",
            "tools": "which of fleetpatch,baseline,ansible (default all three)",
            "out": "where results.json and RESULTS.md go (default bench/)",
            "instrumented": "also one instrumented fleetpatch rollout per size (default on)"})
def bench(c, sizes="1,8,32", repeats=3, tools="fleetpatch,baseline,ansible", out="", instrumented=True):
    """Benchmark a full rollout on the local sshd test fleet: fleetpatch vs one `ssh` per host vs Ansible."""
    argv = [sys.executable, str(REPO / "bench" / "run.py"), "--sizes", sizes, "--repeats", str(repeats),
            "--tools", tools]
    if out:
        argv += ["--out", out]
    if not instrumented:
        argv.append("--no-instrumented")
    c.run(" ".join(shlex.quote(a) for a in argv), pty=False)


ns.add_task(bench)
