"""`invoke <command>` in the repo runs the same tasks as the installed `fleetpatch` program,
plus the maintainer tasks (repo only): `invoke bench` (the benchmark in bench/),
`invoke engine-facts [--engine vllm] --version X` (a release's facts from its wheel) and
`invoke supported-releases` (the README's table of them)."""
import signal
import subprocess
import sys
from pathlib import Path

from invoke import task
from invoke.exceptions import Exit

from fleetpatch.cli import ns  # noqa: F401

REPO = Path(__file__).resolve().parent


@task(auto_shortflags=False, help={"sizes": "fleet sizes, comma-separated (default 1,8,32; at most 32)",
            "repeats": "runs per size, net and tool (default 3)",
            "tools": "which of fleetpatch,baseline,baseline-c25519,pyinfra,ansible (default all five)",
            "nets": "loopback and/or delay (through bench/delayproxy.py; default both, interleaved)",
            "fleets": "plain and/or container (each engine in a Docker container; fleetpatch only there): "
                      "plain,container times both in one run, into results-containers.json (default plain)",
            "delay_ms": "the delay proxy's delay each way in ms (default 25: 50 ms round trip)",
            "baseline_kex": "KexAlgorithms for the baseline's ssh, e.g. curve25519-sha256 (default: OpenSSH's)",
            "quiet_wait": "before each run wait up to S s for the machine to be <20% busy (default 60)",
            "out": "where results.json and RESULTS.md go (default bench/)",
            "instrumented": "also one instrumented fleetpatch rollout per size and net (default on)",
            "fleetpatch-before": "another fleetpatch checkout (e.g. a git worktree of an older commit), run as "
                                 "the contender fleetpatch-before: a before/after table from the same run"})
def bench(c, sizes="1,8,32", repeats="3", tools="fleetpatch,baseline,baseline-c25519,pyinfra,ansible", nets="loopback,delay",
          delay_ms="25", quiet_wait="60", baseline_kex="", out="", instrumented=True, fleetpatch_before="",
          fleets="plain"):
    """Time a full rollout on the test fleet, on loopback and through a delay proxy.

    fleetpatch against one `ssh` per host, pyinfra and Ansible."""
    argv = [sys.executable, str(REPO / "bench" / "run.py"), "--sizes", sizes, "--repeats", str(repeats),
            "--tools", tools, "--nets", nets, "--delay-ms", str(delay_ms), "--quiet-wait", str(quiet_wait),
            "--fleets", fleets]
    if baseline_kex:
        argv += ["--baseline-kex", baseline_kex]
    if fleetpatch_before:
        if "fleetpatch-before" not in tools.split(","):
            argv[argv.index("--tools") + 1] = tools + ",fleetpatch-before"
        argv += ["--fleetpatch-before", fleetpatch_before]
    if out:
        argv += ["--out", out]
    if not instrumented:
        argv.append("--no-instrumented")
    # Not c.run: on Ctrl-C Invoke would write ^C to the bench's stdin; the bench takes
    # the signal itself and must be waited for while it stops its fleet.
    proc = subprocess.Popen(argv)

    def forward(signum, frame):
        proc.send_signal(signum)

    old_term = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)   # if only we got it; the bench ignores a second one
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if code:
        raise Exit(code=128 - code if code < 0 else code)


ns.add_task(bench)


@task(auto_shortflags=False, help={"version": "the release, e.g. 0.5.24 (as on PyPI)",
                                   "wheel": "read this wheel instead of downloading it (sglang)",
                                   "engine": "sglang (default) or vllm"})
def engine_facts(c, version, wheel="", engine="sglang"):
    """Write a release's facts (src/fleetpatch/engines/<engine>_releases/VERSION.json) from its wheel.

    sglang: downloads the wheel once (pip download --no-deps; cached in ~/.cache/fleetpatch/wheels).
    vllm: fetches only the members it reads (the zip's central directory and a few MB of Python files,
    by HTTP range from PyPI's file host; cached in ~/.cache/fleetpatch/wheels/vllm-VERSION.members).
    Reads them with ast (nothing of the engine is imported), keeps the file's reviewed section (a new
    release starts from the previous release's, pending review), and prints what differs from the
    previous release."""
    from packaging.version import InvalidVersion, Version

    from fleetpatch.engines import sglang_wheel, vllm_wheel

    try:
        Version(version)
    except InvalidVersion:
        raise Exit(f"engine-facts: --version {version!r} is not a PEP 440 version (e.g. 0.5.24)", code=2)
    if engine not in ("sglang", "vllm"):
        raise Exit(f"engine-facts: --engine {engine!r}: expected sglang or vllm", code=2)
    module = sglang_wheel if engine == "sglang" else vllm_wheel
    try:
        if engine == "sglang":
            out, lines = sglang_wheel.write_release(version, wheel=Path(wheel) if wheel else None)
        else:
            out, lines = vllm_wheel.write_release(version)
    except (RuntimeError, OSError) as e:
        raise Exit(f"engine-facts: {e}", code=1)
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    print("\n".join(lines))
    reviewed = module.reviewed_for(version)
    if str(reviewed.get("status", "")).startswith("pending"):
        what = ("routing policy, worker families, which lines mean what" if engine == "sglang"
                else "the runner policy: " + ", ".join(vllm_wheel.POLICY_TEXT))
        print(f"review its 'reviewed' section ({what}), then set "
              f"its status to \"reviewed\": until then the profile does not know {version}")


@task(auto_shortflags=False, help={"engine": "sglang (default) or vllm"})
def supported_releases(c, engine="sglang"):
    """Print docs/engine-versions.md's table of supported releases (markdown), from the facts files."""
    from fleetpatch.engines import sglang_wheel, vllm_wheel

    print((vllm_wheel if engine == "vllm" else sglang_wheel).supported_table(), end="")


ns.add_task(engine_facts)
ns.add_task(supported_releases)
