"""bench/controller_cpu.py's wrapper: run `python -m fleetpatch ARGS` with every thread profiled on its own CPU clock
(cProfile with time.thread_time), or with only per-thread CPU totals (TPROF_MODE=cpu).
Writes TPROF_OUT.pstats (all threads merged) and TPROF_OUT.threads.json."""
import cProfile, json, os, pstats, sys, threading, time
mode = os.environ.get("TPROF_MODE", "profile")
out = os.environ["TPROF_OUT"]
profs, cpu = [], {}
lock = threading.Lock()
orig = threading.Thread._bootstrap_inner

def kind(name):
    return "".join(c for c in name.split(" ")[0] if not c.isdigit()).rstrip("-_(")

def inner(self):
    p = cProfile.Profile(time.thread_time) if mode == "profile" else None
    if p: p.enable()
    try:
        orig(self)
    finally:
        if p: p.disable()
        t = time.thread_time()
        with lock:
            if p: profs.append(p)
            k = type(self).__name__ + ":" + kind(self.name)
            c = cpu.setdefault(k, [0, 0.0]); c[0] += 1; c[1] += t

threading.Thread._bootstrap_inner = inner
sys.argv = ["fleetpatch"] + sys.argv[1:]
mp = cProfile.Profile(time.thread_time) if mode == "profile" else None
t0 = time.process_time()
if mp: mp.enable()
code = 0
try:
    # entry() as `python -m fleetpatch` runs it, but without its os._exit at the end (leave):
    # the totals below are written after the command is over
    import fleetpatch.__main__ as fp_main
    fp_main.leave = lambda done: None
    fp_main.entry()
except SystemExit as e:
    code = e.code
finally:
    if mp: mp.disable()
    main_cpu = time.thread_time()
    with lock:
        cpu["main"] = [1, main_cpu]
        cpu["process_before_exit"] = [1, time.process_time()]
        if mp:
            st = pstats.Stats(mp)
            for p in profs:
                st.add(p)
            st.dump_stats(out + ".pstats")
        json.dump(cpu, open(out + ".threads.json", "w"), indent=1)
sys.exit(code)
