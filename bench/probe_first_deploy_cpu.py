"""CPU of the agent's probe install on a patch's first deploy (issue 34): `install_probe` for an added
line in each SGLang 0.5.9 worker, with the laptop's splice hints, on a host seen before (its site
dir and the runtime's code known: a warm-up install first), the plan cache empty; each run in a
fresh interpreter (the hosts' Debian python3 where there is one) after the agent's usual imports,
phases timed by wrappers (install, spliced_module, each atomic write by file kind and size, ...).

    python3 bench/probe_first_deploy_cpu.py [--python /usr/bin/python3] [--reps 12]

Prints the medians (ms of CPU). Needs the 0.5.9 tree in the wheel cache (any test run or the demo
fills it)."""
import argparse, glob, json, os, shutil, statistics, subprocess, sys, tempfile
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
sys.path.insert(0, SRC)
ap = argparse.ArgumentParser()
ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
ap.add_argument("--reps", type=int, default=12)
args = ap.parse_args()
if not os.access(args.python, os.X_OK):
    ap.error("--python: %s is not an interpreter that can be run" % args.python)
if args.reps < 1:
    ap.error("--reps: expected 1 or more, got %d" % args.reps)
from fleetpatch.probe import install as PI, splice
from fleetpatch.cacheroot import cache_root
tree = glob.glob(str(cache_root() / "trees" / "*" / "0.5.9" / "sglang" / "srt" / "speculative"))[0]
work = tempfile.mkdtemp(prefix="fd3-")
pkg = os.path.join(work, "pkg", "sglang", "srt", "speculative"); os.makedirs(pkg)
added = {}
for name in ("eagle_worker.py", "eagle_worker_v2.py"):
    lines = open(os.path.join(tree, name)).read().split("\n")
    at = next(i for i, l in enumerate(lines) if l.strip().startswith("def __init__")) + 1
    while not lines[at].rstrip().endswith(":"): at += 1
    ind = len(lines[at + 1]) - len(lines[at + 1].lstrip())
    lines.insert(at + 1, " " * ind + "logger.info('fleetpatch bench: added')")
    open(os.path.join(pkg, name), "w").write("\n".join(lines))
    added["sglang/srt/speculative/" + name] = [at + 2]
a, b = sorted(added)
plan = PI.make_plan(added, os.path.join(work, "pkg"), {a: [b], b: [a]}, mode="functions")
for mod, spec in plan["modules"].items():
    if spec.get("lines"):
        spec["splice"] = splice.hint(open(spec["expected"], "rb").read(), spec["lines"])
json.dump(plan, open(os.path.join(work, "plan.json"), "w"))
src = PI.runtime_source()
open(os.path.join(work, "runtime.src"), "wb").write(src if isinstance(src, bytes) else src.encode())
subprocess.run([args.python, "-m", "venv", "--without-pip", os.path.join(work, "venv")], check=True)
CHILD = "SRC = %r\n" % SRC + r'''
import sys, os, time, json, shutil
sys.path.insert(0, SRC)
import hashlib, hmac, subprocess, threading, ctypes, socket, selectors   # what the agent holds
from fleetpatch import protocol
from fleetpatch.agent import probing
from fleetpatch.agent.state import Session
from fleetpatch.probe import install as PI
work, state = sys.argv[1], sys.argv[2]
plan = json.load(open(work + "/plan.json"))
src = open(work + "/runtime.src", "rb").read()
def req(tok):
    return {"state_dir": state, "probe": {"token": tok, "plan": dict(plan), "python": work + "/venv/bin/python",
                                          "runtime": protocol.pack(src)}}
# a host seen before: its site dir and the runtime's code known; this patch's plan not
probing.install_probe(Session(), req("warm"))
shutil.rmtree(os.path.join(state, probing.PLAN_CACHE), ignore_errors=True)
acc = {}
def timed(mod, name):
    fn = getattr(mod, name)
    def w(*a, **k):
        t0 = time.process_time()
        try: return fn(*a, **k)
        finally: acc[name] = acc.get(name, 0) + time.process_time() - t0
    setattr(mod, name, w)
for n in ("install", "spliced_module"):
    timed(PI, n)
_wa = PI.write_atomic
def wa(path, data, mode, sync=True):
    t0 = time.process_time()
    try: return _wa(path, data, mode, sync)
    finally:
        k = "w:" + os.path.basename(path).split(".")[-1] + ("+sync" if sync else "") + ":%dK" % (len(data) // 1024)
        acc[k] = acc.get(k, 0) + time.process_time() - t0
PI.write_atomic = wa
for n in ("placement", "runtime_code_for", "remove_stale", "clear_records"):
    if hasattr(probing, n): timed(probing, n)
r = req("tok%d" % os.getpid())
t = time.process_time()
out = probing.install_probe(Session(), r)
tot = (time.process_time() - t) * 1000
assert out.get("installed"), out
print(json.dumps(dict(total=tot, **{k: v * 1000 for k, v in acc.items()})))
'''
res = []
for rep in range(args.reps):
    state = os.path.join(work, "state%d" % rep); os.makedirs(state)
    out = subprocess.run([args.python, "-S", "-c", CHILD, work, state], capture_output=True, text=True)
    if out.returncode: print(out.stderr[-1500:]); sys.exit(1)
    res.append(json.loads(out.stdout.strip().splitlines()[-1]))
print({k: round(statistics.median([x.get(k, 0) for x in res]), 2) for k in res[0]})
shutil.rmtree(work)
