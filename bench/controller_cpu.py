"""The laptop's CPU of `fleetpatch rollout` on an N-host bench fleet (loopback; bench/run.py's
fleet, patch and reset), several checkouts interleaved (issue 34). CPU = user+sys of the rollout
process (os.wait4), which other sessions' load leaves nearly alone, unlike wall time.

  controller_cpu.py N REPS OUT label=SRC [label=SRC ...] [--pty] [--profile LABEL|all [--threads]]
      [--runner SCRIPT]

--pty runs it on a terminal (the live view), --profile runs LABEL's runs under
bench/thread_profile.py (every thread profiled on its own CPU clock; --threads: only each
thread's CPU total), or --runner another wrapper (e.g. one noting the first connect)."""
import json, os, subprocess, sys, time
from pathlib import Path
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import run as B
from fleetpatch_demo.fleet import Fleet, HostSpec

n, reps, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]); out.mkdir(parents=True, exist_ok=True)
args = sys.argv[4:]
profile = None
if "--profile" in args:
    i = args.index("--profile"); profile = args[i + 1]; del args[i:i + 2]
mode = "profile"
runner = str(BENCH / "thread_profile.py")
if "--runner" in args:
    i = args.index("--runner"); runner = args[i + 1]; del args[i:i + 2]
if "--threads" in args:
    args.remove("--threads"); mode = "cpu"
pty = "--pty" in args
if pty:
    args.remove("--pty")
srcs = dict(a.split("=", 1) for a in args)
root = out / f"fleet{n}"; root.mkdir(parents=True, exist_ok=True)
specs = [HostSpec(f"h{i:02d}", version=B.VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0) for i in range(n)]
res = {k: [] for k in srcs}
with Fleet(root / "fleet", specs) as fleet:
    net = B.loopback_net(fleet)
    inv = B.write_inventory(fleet, fleet.names, out / "hosts.yaml", net)
    def go(label, tag, prof=False):
        argv = [sys.executable] + ([runner] if prof else ["-m", "fleetpatch"]) + [
            "rollout", "--patch", B.PATCH, "--group", "all", "--canary", "0",
            "--report", str(out / f"report-{label}.json"), "--inventory", str(inv)]
        env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": srcs[label], "TPROF_OUT": str(out / f"{label}-{tag}"),
               "TPROF_MODE": mode}
        if pty:   # a terminal: the live view (COLUMNS/LINES as a laptop's)
            import shlex
            env["LINES"] = "60"
            argv = ["script", "-qfec", " ".join(shlex.quote(a) for a in argv), "/dev/null"]
        t = time.monotonic()
        p = subprocess.Popen(argv, cwd=out, env=env, stdout=open(out / f"out-{label}-{tag}.txt", "w"),
                             stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t
        doc = json.loads((out / f"report-{label}.json").read_text())
        ok = sum(1 for h in doc["hosts"].values() if h.get("ok"))
        return {"cpu": ru.ru_utime + ru.ru_stime, "user": ru.ru_utime, "sys": ru.ru_stime, "wall": wall,
                "ok": ok, "exit": os.waitstatus_to_exitcode(status)}
    for label in srcs:   # warm-up: agent cache, bytecode
        B.reset_keeping_agent_cache(fleet); go(label, "warm")
    for r in range(reps):
        order = list(srcs) if r % 2 == 0 else list(srcs)[::-1]
        for label in order:
            B.reset_keeping_agent_cache(fleet); time.sleep(1)
            x = go(label, f"r{r}", prof=(label == profile or profile == "all"))
            res[label].append(x)
            print(f"n={n} rep {r} {label}: cpu {x['cpu']:.3f} (u {x['user']:.3f} s {x['sys']:.3f}) wall {x['wall']:.2f} ok {x['ok']}/{n} exit {x['exit']}", flush=True)
for label, xs in res.items():
    cs = sorted(x["cpu"] for x in xs)
    print(f"n={n} {label}: cpu median {cs[len(cs)//2]:.3f} s ({cs}) per host {cs[len(cs)//2]/n*1000:.1f} ms")
json.dump(res, open(out / "res.json", "w"), indent=1)
