"""CPU of the agent's probe install, in-process (issue 34): `probe.install.install` for a patch on
SGLang 0.5.8's eagle_worker.py (1052 lines as patched: a line added) with eagle_worker_v2.py as its sibling, in
functions mode, the runtime's code given as install_probe gives it (the agent's per-interpreter
cache). Medians of `--reps` calls of time.process_time; each call a fresh probe dir, one
state dir for all (the module cache, where the install keeps one, warm after the first call).

    PYTHONPATH=src python3 bench/probe_install_cpu.py [--reps 10] [--mode functions|lines] [--tree DIR]

`--agent`: the agent's whole `install_probe` instead (a venv of this Python, its site-dir query
cached after the first call; each call clears the last window's probe dir and removes the last .pth).
"""
import argparse
import glob
import marshal
import os
import shutil
import statistics
import sys
import tempfile
import time

from fleetpatch.probe import install as probe_install


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--mode", default="functions")
    ap.add_argument("--tree", default=(glob.glob(os.path.expanduser(
        "~/.cache/fleetpatch/trees/*/0.5.8/sglang/srt/speculative/eagle_worker.py")) or [""])[0])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--agent", action="store_true")
    args = ap.parse_args()
    src_dir = os.path.dirname(args.tree)
    work = tempfile.mkdtemp(prefix="fp-install-cpu-")
    pkg = os.path.join(work, "pkg", "sglang", "srt", "speculative")
    os.makedirs(pkg)
    lines = open(os.path.join(src_dir, "eagle_worker.py")).read().split("\n")
    # one added line in EAGLEWorker.__init__'s body: the first line after its "def __init__"
    at = next(i for i, l in enumerate(lines) if l.strip().startswith("def __init__")) + 1
    while not lines[at].rstrip().endswith(":"):
        at += 1
    indent = len(lines[at + 1]) - len(lines[at + 1].lstrip())
    lines.insert(at + 1, " " * indent + "logger.info('fleetpatch bench: added')")
    open(os.path.join(pkg, "eagle_worker.py"), "w").write("\n".join(lines))
    shutil.copy(os.path.join(src_dir, "eagle_worker_v2.py"), pkg)
    path, twin = "sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py"
    plan = probe_install.make_plan({path: [at + 2]}, os.path.join(work, "pkg"), {twin: [path]},
                                   mode=args.mode)
    site = os.path.join(work, "site")
    os.makedirs(site)
    source = probe_install.runtime_source()
    state = os.path.join(work, "state")
    os.makedirs(state)
    if args.agent:
        return agent_bench(args, work, plan, source, state)
    times = []
    for rep in range(args.reps + 1):
        folder = os.path.join(work, "probe-%d" % rep)
        runtime_path = os.path.join(folder, probe_install.RUNTIME_NAME)
        server_code = probe_install.code_stamp() + b"\0" + marshal.dumps(compile(source, runtime_path, "exec"))
        kw = {"cache_dir": os.path.join(state, "probe-modules")} if "cache_dir" in \
            probe_install.install.__code__.co_varnames else {}
        if args.profile and rep == args.reps:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.process_time()
        probe_install.install(site, folder, "bench%d" % rep, dict(plan, python=sys.executable), source=source,
                              server_code=server_code, **kw)
        t = time.process_time() - t0
        if args.profile and rep == args.reps:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
        probe_install.remove(site)
        times.append(t)
    ready = marshal.loads(open(os.path.join(folder, probe_install.PROBE_PLAN_NAME), "rb").read())
    compiled = sorted(n for n, s in ready["modules"].items() if s.get("compiled"))
    print("mode %s, %s, first call %.1f ms, median of the next %d: %.1f ms CPU (min %.1f, max %.1f); compiled: %s"
          % (args.mode, sys.version.split()[0], times[0] * 1e3, args.reps, statistics.median(times[1:]) * 1e3,
             min(times[1:]) * 1e3, max(times[1:]) * 1e3, ", ".join(compiled) or "none"))
    shutil.rmtree(work)


def agent_bench(args, work, plan, source, state):
    import subprocess
    from fleetpatch.agent.probing import install_probe
    from fleetpatch.agent.state import Session
    from fleetpatch import protocol
    venv = os.path.join(work, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    times = []
    for rep in range(args.reps + 1):
        req = {"state_dir": state, "probe": {"token": "bench%d" % rep, "plan": plan, "python": python,
                                             "runtime": protocol.pack(source)}}
        session = Session()
        if args.profile and rep == args.reps:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.process_time()
        out = install_probe(session, req)
        t = time.process_time() - t0
        if args.profile and rep == args.reps:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
        assert out.get("installed"), out
        times.append(t)
    print("install_probe, mode %s, %s, first call %.1f ms, median of the next %d: %.1f ms CPU (min %.1f, max %.1f)"
          % (args.mode, sys.version.split()[0], times[0] * 1e3, args.reps, statistics.median(times[1:]) * 1e3,
             min(times[1:]) * 1e3, max(times[1:]) * 1e3))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
