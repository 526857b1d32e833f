#!/usr/bin/env python3
"""What the probe costs.

CPU (default): in a fresh interpreter with the probe loaded through its .pth
(site.addsitedir of a scratch site dir), the cost of a first hit (the record
written), of a later call of a watched function, and of a call of an unwatched
function of the patched module, against an identical module that the probe
does not watch; 5 interleaved repetitions. Runs with this Python (functions
mode on 3.8-3.11, lines mode on 3.12+) and, where the Debian trixie root of the
tests exists (/var/cache/fleetpatch-test/trixie-root), with its Python 3.13 in
both modes (chroot, root only).

GPU (--gpu; needs torch with CUDA): a decode loop of a small randomly
initialised transformer in plain torch (no weights), batch 1 and 64, eager,
CUDA graphs and torch.compile, with the probe in the interpreter's best mode
(lines on 3.12+), then eager and torch.compile again in functions mode (what
3.8-3.11 hosts get). Each step calls a patched function (`postprocess`, its
lines added by the "revision"), and before it, in Python, `admit`, whose one
added line never runs, so the probe counts every one of its calls (the wider
watching of issue 31, up to the probe's count cap). The probed copy and an identical unprobed copy
run in the same process, in pairs: each repetition times both back to back,
in alternating order (ABBA), each run about --run-seconds long (its steps
sized from the measured step rate). The overhead is the median over the pairs
of 1 - probed/plain tokens/s, which cancels drift slower than a pair (clocks,
neighbours on the host); the interval is that of order statistics 2 and n-1 of
the pairs' overheads (96% for 9 pairs, distribution-free); the spread is that
of the unprobed runs ((max - min) / median). Also what the probe recorded
(executed, traced, or nothing). --control-modes adds A/A rows, both copies
unprobed, whose "overhead" is what the pairing leaves of the copies' own
difference and the host's noise. Rows that would end past --budget-seconds are
skipped, and say so.

    python3 bench/probe_overhead.py                 # CPU part
    python3 bench/probe_overhead.py --gpu --out DIR  # CPU part here, then the GPU part (about 5 min on an H200)

JSON goes to DIR/probe_overhead.json (DIR: --out, else $OUT, else the current dir).
Needs no install: it imports the probe from src/ beside this folder.
"""
import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRIXIE = "/var/cache/fleetpatch-test/trixie-root"
PROBED, PLAIN = "fp_bench_probed", "fp_bench_plain"
EXEC_MODES = ("eager", "cudagraph", "compile")   # gpu_runner's
CONTROL = "control"    # a GPU row with no probe in either copy: what the two copies differ by on their own
FIRST_HITS = 200
GATED = 6              # functions whose added line never runs: each call is counted (below the count cap)
GATED_CALLS = 60000    # per gated function: under the probe's COUNT_CAP (65536), after which it stops counting

CPU_MODULE = '''"""The patched module of the CPU bench."""


def hot(x):
    return x + 1  # added


def cold(x):
    return x + 1
''' + "".join("\n\ndef first_%d(x):\n    return x + %d  # added\n" % (i, i) for i in range(FIRST_HITS)) \
    + "".join("\n\ndef gated_%d(x):\n    if x > 10:\n        return x  # added\n    return x + %d\n" % (i, i)
              for i in range(GATED))

GPU_MODULE = '''"""The patched module of the GPU bench: what the server runs every decode step."""
import torch


def postprocess(logits, temperature):
    scaled = logits.float() / temperature  # added
    return torch.argmax(scaled, dim=-1)  # added


def admit(step, limit):
    """Called once a step in Python, outside any graph, as a scheduler's per-step method is: its
    added line never runs, so the probe counts every call (up to its cap): the wider watching."""
    if step > limit:
        raise RuntimeError("step limit passed")  # added
    return step
'''


def added_lines(source):
    return [n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# added")]


# ---------------------------------------------------------------------------------------- driver

def make_scratch(root, source, mode, argv=None):
    """A scratch dir (seen as `inner` by the interpreter; `root` its chroot or ''):
    mods/ with the probed and plain copies, site/ with the probe's .pth, probe/ its records.
    `argv`: the interpreter; where it is not this one's build (the chroot's), the runtime is
    compiled by it, as the agent does on such a host (probing.runtime_code_for)."""
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    from fleetpatch.probe import install as probe_install
    inner = tempfile.mkdtemp(prefix="fp-probe-bench-", dir=(root + "/tmp") if root else None)
    inner = inner[len(root):] if root else inner
    host = root + inner
    os.makedirs(host + "/mods")
    os.makedirs(host + "/site")
    for name in (PROBED, PLAIN):
        with open("%s/mods/%s.py" % (host, name), "w") as f:
            f.write(source)
    shutil.copy(os.path.abspath(__file__), host + "/worker.py")
    plan = {"version": 1, "modules": {PROBED: {"path": PROBED + ".py", "expected": "%s/mods/%s.py" % (inner, PROBED),
                                               "lines": added_lines(source)}}}
    if mode:
        plan["mode"] = mode
    if argv:    # the modules' bytecode cache, as a server's installed package has it: the start
        # without the probe must not pay a compile that the probe's (the agent's compiled module) skips
        subprocess.run(argv + ["-m", "compileall", "-q", inner + "/mods"], check=True, stdout=subprocess.DEVNULL)
    server_code = None
    if root and argv:
        server_code = probe_install.compiled_by(argv, probe_install.runtime_source(), inner + "/probe/runtime.py")
    if mode != CONTROL:
        probe_install.install(host + "/site", host + "/probe", "bench", plan, probe_dir_seen=inner + "/probe",
                              server_code=server_code)
    return inner, host


def records_of(host):
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    from fleetpatch.probe import install as probe_install
    files = probe_install.read_records(host + "/probe")
    out = {"processes": 0, "executed": [], "traced": [], "traced_by": [], "disabled": [], "mode": None}
    for name, data in files.items():
        obj = json.loads(data)
        base = name.split("/", 1)[1]
        if base == "process.json":
            out["processes"] += 1
            out["mode"] = obj.get("mode")
        elif base == "disabled":
            out["disabled"].append(obj.get("reason"))
        elif base[:2] in ("L-", "F-"):
            out["executed"].extend(obj["lines"] if "lines" in obj else [obj["line"]])
        elif base[:2] == "T-":
            out["traced"].extend(obj["lines"] if "lines" in obj else [obj["line"]])
            out["traced_by"].append(obj.get("traced") or "?")
    for key in ("executed", "traced", "traced_by"):
        out[key] = sorted(set(out[key]))
    return out


def run_worker(argv_prefix, inner, kind, extra, timeout):
    cmd = argv_prefix + [inner + "/worker.py", "--worker", kind, "--scratch", inner] + extra
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError("worker %s failed (exit %d): %s" % (kind, done.returncode, done.stderr[-2000:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_interpreters():
    found = [("this machine's Python %d.%d" % sys.version_info[:2], [sys.executable], "", None)]
    if os.path.exists(TRIXIE + "/usr/bin/python3") and os.geteuid() == 0 and shutil.which("chroot"):
        chroot = [shutil.which("chroot"), TRIXIE, "/usr/bin/python3"]
        found.append(("Debian trixie Python 3.13, lines mode", chroot, TRIXIE, None))
        found.append(("Debian trixie Python 3.13, functions mode", chroot, TRIXIE, "functions"))
    return found


def cpu_bench(reps):
    results = []
    for label, argv, root, mode in cpu_interpreters():
        runs = []
        for _ in range(reps):          # a fresh process per repetition: a first hit happens once
            inner, host = make_scratch(root, CPU_MODULE, mode)
            try:
                runs.append(run_worker(argv, inner, "cpu", [], 300))
                recorded = records_of(host)
            finally:
                shutil.rmtree(host, ignore_errors=True)
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0] if isinstance(runs[0][key], float)}
        row = {"interpreter": label, "python": runs[0]["python"], "mode": recorded["mode"], "reps": reps,
               "first_hit_us": round(med["first_probed_ns"] / 1e3 - med["first_plain_ns"] / 1e3, 2),
               "watched_call_ns": round(med["hot_probed_ns"] - med["hot_plain_ns"], 2),
               "watched_call_plain_ns": round(med["hot_plain_ns"], 2),
               "unwatched_call_ns": round(med["cold_probed_ns"] - med["cold_plain_ns"], 2),
               "unwatched_call_plain_ns": round(med["cold_plain_ns"], 2),
               "counted_call_ns": round(med["gated_probed_ns"] - med["gated_plain_ns"], 2),
               "counted_call_plain_ns": round(med["gated_plain_ns"], 2),
               "recorded_lines": len(recorded["executed"]), "disabled": recorded["disabled"]}
        results.append(row)
        print("%-45s %-9s first hit %+8.1f us   watched call %+6.1f ns (of %.1f)   unwatched call %+6.1f ns (of %.1f)"
              "   counted call %+6.1f ns (of %.1f)"
              % (label, row["mode"], row["first_hit_us"], row["watched_call_ns"], row["watched_call_plain_ns"],
                 row["unwatched_call_ns"], row["unwatched_call_plain_ns"], row["counted_call_ns"],
                 row["counted_call_plain_ns"]), flush=True)
    return results


START_SCRIPT = ("import site, sys\n"
                "site.addsitedir(sys.argv[1] + '/site')\n"   # the .pth read, as site does at start
                "sys.path.insert(0, sys.argv[1] + '/mods')\n"
                "import %s as m\n"
                "m.hot(1)\n" % PROBED)


def start_cpu(argv_prefix, inner, n):
    """CPU ms (user + sys, rusage of the children) of one interpreter start that imports the
    watched module and runs one added line, its site dir read with `-S` + site.addsitedir."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)   # not os.times(): its clock ticks are 10 ms
    for _ in range(n):
        subprocess.run(argv_prefix + ["-S", "-c", START_SCRIPT, inner], env=env, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000.0 * ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / n


def start_bench(reps, starts=10):
    """The probe's cost per server start: the same start with the probe's .pth in the site dir
    and without (an empty site dir), `reps` interleaved rounds of `starts` processes each."""
    results = []
    for label, argv, root, mode in cpu_interpreters():
        probed_inner, probed_host = make_scratch(root, CPU_MODULE, mode, argv)
        plain_inner, plain_host = make_scratch(root, CPU_MODULE, mode, argv)
        for name in os.listdir(plain_host + "/site"):      # the same tree, no probe
            os.remove(os.path.join(plain_host, "site", name))
        try:
            with_probe, without = [], []
            for _ in range(reps):
                with_probe.append(start_cpu(argv, probed_inner, starts))
                without.append(start_cpu(argv, plain_inner, starts))
            recorded = records_of(probed_host)
        finally:
            shutil.rmtree(probed_host, ignore_errors=True)
            shutil.rmtree(plain_host, ignore_errors=True)
        a, b = statistics.median(with_probe), statistics.median(without)
        row = {"interpreter": label, "mode": recorded["mode"], "reps": reps, "starts": starts,
               "start_cpu_ms_probe": round(a, 2), "start_cpu_ms_plain": round(b, 2), "probe_cpu_ms": round(a - b, 2),
               "processes_recorded": recorded["processes"]}
        results.append(row)
        print("%-45s %-9s start CPU %.1f ms with the probe, %.1f ms without: %+.1f ms per start"
              % (label, row["mode"], a, b, a - b), flush=True)
    return results


def mode_list(text):
    """A comma-separated flag value -> its execution modes ('' and stray commas: none)."""
    return [k for k in (text or "").split(",") if k]


def gpu_configs(args):
    """(probe mode the plan asks for, exec mode, batch) of each GPU row, in the order they run."""
    rows = [(None, kind, batch) for kind in mode_list(args.modes) for batch in (1, 64)]
    if sys.version_info >= (3, 12):     # below 3.12 the rows above are in functions mode already
        rows += [("functions", kind, batch) for kind in mode_list(args.functions_modes) for batch in (1, 64)]
    return rows + [(CONTROL, kind, batch) for kind in mode_list(args.control_modes) for batch in (1, 64)]


def gpu_skip_reason(device):
    from importlib.util import find_spec
    if find_spec("torch") is None:
        return "torch is not installed"
    if device != "cuda":
        return ""
    probe_cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                                capture_output=True, text=True)
    if probe_cuda.stdout.strip() != "True":
        return "no CUDA device (torch.cuda.is_available() is %s)" % (probe_cuda.stdout.strip() or "?")
    return ""


def gpu_bench(args, started):
    skipped = gpu_skip_reason(args.device)
    if skipped:
        return {"skipped": skipped}
    rows = []
    longest = 0.0
    for plan_mode, kind, batch in gpu_configs(args):
        left = args.budget_seconds - (time.monotonic() - started)
        if left < max(30.0, 1.5 * longest):
            row = {"exec_mode": kind, "batch": batch, "probe_mode_asked": plan_mode or "best",
                   "skipped": "%.0f s left of --budget-seconds %d; the longest row so far took %.0f s"
                              % (left, args.budget_seconds, longest)}
        else:
            t0 = time.monotonic()
            row = gpu_row(args, plan_mode, kind, batch, min(590.0, left))
            row["wall_s"] = round(time.monotonic() - t0, 1)
            longest = max(longest, row["wall_s"])
        rows.append(row)
        print_gpu_row(row)
    return {"device": device_description(args.device), "rows": rows}


def gpu_row(args, plan_mode, kind, batch, timeout):
    inner, host = make_scratch("", GPU_MODULE, plan_mode)
    extra = ["--exec-mode", kind, "--batch", str(batch), "--reps", str(args.reps),
             "--run-seconds", str(args.run_seconds), "--device", args.device]
    extra += ["--steps", str(args.steps)] if args.steps else []
    extra += ["--tiny"] if args.tiny else []
    try:
        got = run_worker([sys.executable], inner, "gpu", extra, timeout)
        got["probe"] = records_of(host)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        got = {"exec_mode": kind, "batch": batch, "error": str(exc)[-1500:]}
    finally:
        shutil.rmtree(host, ignore_errors=True)
    got["probe_mode_asked"] = plan_mode or "best"
    return got


def print_gpu_row(row):
    head = "%-9s %-9s batch %-3d" % (row["probe_mode_asked"], row["exec_mode"], row["batch"])
    if "skipped" in row or "error" in row:
        print("%s %s %s" % (head, "SKIPPED" if "skipped" in row else "ERROR",
                            (row.get("skipped") or row.get("error"))[-300:]), flush=True)
        return
    probe = row["probe"]
    what = []
    if probe["executed"]:
        what.append("executed %s" % probe["executed"])
    if probe["traced"]:
        what.append("traced %s (%s)" % (probe["traced"], ", ".join(probe["traced_by"])))
    what = "; ".join(what) or ("no probe in either copy" if row["probe_mode_asked"] == CONTROL else "nothing recorded")
    print("%s plain %9.1f tok/s  probed %9.1f  overhead %+6.2f%% [%+.2f, %+.2f]  spread %4.1f%%  %5d steps  "
          "probe (%s): %s" % (head, row["plain_tok_s"], row["probed_tok_s"], row["overhead_pct"],
                              row["interval_pct"][0], row["interval_pct"][1], row["spread_pct"], row["steps"],
                              probe["mode"], what), flush=True)


def device_description(device):
    if device != "cuda":
        code = ("import json, os, platform, torch; print(json.dumps({'gpu': None, 'device': 'cpu (smoke run)', "
                "'torch': torch.__version__, 'python': platform.python_version(), 'cpu_count': os.cpu_count()}))")
    else:
        code = ("import json, os, platform, torch; p = torch.cuda.get_device_properties(0); "
                "print(json.dumps({'gpu': p.name, 'memory_gib': round(p.total_memory / 2**30, 1), "
                "'torch': torch.__version__, 'cuda': torch.version.cuda, 'python': platform.python_version(), "
                "'cpu_count': os.cpu_count()}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}


# ---------------------------------------------------------------------------------------- workers

def worker_setup(scratch):
    import site
    site.addsitedir(scratch + "/site")      # reads the probe's .pth, as site does at start
    sys.path.insert(0, scratch + "/mods")
    import importlib
    return importlib.import_module(PROBED), importlib.import_module(PLAIN)


def cpu_worker(scratch):
    import timeit
    probed, plain = worker_setup(scratch)
    out = {"python": "%d.%d.%d" % sys.version_info[:3]}
    for label, mod in (("probed", probed), ("plain", plain)):
        funcs = [getattr(mod, "first_%d" % i) for i in range(FIRST_HITS)]
        t0 = time.perf_counter_ns()
        for f in funcs:
            f(1)
        out["first_%s_ns" % label] = float(time.perf_counter_ns() - t0) / FIRST_HITS
    number = 200000
    for _ in range(5):                   # interleaved
        for label, mod in (("probed", probed), ("plain", plain)):
            for fn in ("hot", "cold"):
                t = min(timeit.repeat("f(1)", globals={"f": getattr(mod, fn)}, number=number, repeat=3))
                key = "%s_%s_ns" % (fn, label)
                out[key] = min(out.get(key, float("inf")), t / number * 1e9)
    for i in range(GATED):               # each gated function timed once: its calls stay below the count cap
        for label, mod in (("probed", probed), ("plain", plain)):
            t = timeit.timeit("f(1)", globals={"f": getattr(mod, "gated_%d" % i)}, number=GATED_CALLS)
            key = "gated_%s_ns" % label
            out[key] = min(out.get(key, float("inf")), t / GATED_CALLS * 1e9)
    print(json.dumps(out))


def gpu_model(torch, batch, dev, tiny=False):
    """A decoder of random weights, its KV cache static (CUDA-graph friendly); returns (step(tokens, pos), max_len).

    1024 wide, 8 layers, 16 heads, vocab 32000, KV cache of 512 (tiny: a smoke run's 64, 2, 4, 1000, 64)."""
    dim, layers, heads, vocab, max_len = (64, 2, 4, 1000, 64) if tiny else (1024, 8, 16, 32000, 512)
    nn = torch.nn
    dt = torch.bfloat16
    torch.manual_seed(0)
    emb = nn.Embedding(vocab, dim).to(dev, dt)
    blocks = [nn.ModuleDict({"ln1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim), "o": nn.Linear(dim, dim),
                             "ln2": nn.LayerNorm(dim), "up": nn.Linear(dim, 4 * dim), "down": nn.Linear(4 * dim, dim)})
              .to(dev, dt) for _ in range(layers)]
    head = nn.Linear(dim, vocab).to(dev, dt)
    dh = dim // heads
    kc = torch.zeros(layers, batch, heads, max_len, dh, device=dev, dtype=dt)
    vc = torch.zeros_like(kc)
    arange = torch.arange(max_len, device=dev)

    def forward(tokens, pos):
        x = emb(tokens)                                          # B,1,D
        masked = (arange > pos).view(1, 1, 1, max_len)
        for i, b in enumerate(blocks):
            q, k, v = b["qkv"](b["ln1"](x)).view(batch, 1, 3, heads, dh).permute(2, 0, 3, 1, 4)
            kc[i].index_copy_(2, pos.view(1), k)
            vc[i].index_copy_(2, pos.view(1), v)
            att = (q @ kc[i].transpose(-1, -2)) / dh ** 0.5
            att = att.masked_fill(masked, float("-inf")).softmax(-1)
            x = x + b["o"]((att @ vc[i]).transpose(1, 2).reshape(batch, 1, dim))
            x = x + b["down"](torch.nn.functional.gelu(b["up"](b["ln2"](x))))
        return head(x)[:, -1]
    return forward, max_len


def gpu_runner(torch, kind, forward, post, batch, max_len, dev, admit=None):
    """A function running n decode steps of `kind` (eager, cudagraph, compile) with `post`, and
    `admit` called in Python before each step (as a scheduler's per-step method is)."""
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    pos = torch.zeros((), dtype=torch.long, device=dev)
    temperature = 0.7

    def step():
        nxt = post(forward(tokens, pos), temperature)
        tokens.copy_(nxt.view(batch, 1))
        return nxt

    if kind == "compile":
        step = torch.compile(step, dynamic=False)
    elif kind == "cudagraph":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()

        def step():      # noqa: F811 - the replay stands for the step
            graph.replay()

    def run(n):
        for i in range(n):
            if admit is not None:
                admit(i, 1 << 62)
            step()
            pos.add_(1).remainder_(max_len)
    return run


def steps_for(run, sync, seconds):
    """Steps that take about `seconds`, from the step rate of runs of at least 0.1 s."""
    n = 8
    while True:
        sync()
        t0 = time.perf_counter()
        run(n)
        sync()
        took = time.perf_counter() - t0
        if took >= 0.1 or n >= 1 << 16:
            return max(8, int(round(n * seconds / took)))
        n *= 2


def median_interval(values):
    """(lo, hi, coverage): order statistics 2 and n-1 of `values` (1 and n below 5), and how often
    such an interval holds the true median (distribution-free: 1 - 2 P(Binomial(n, 1/2) < k))."""
    ordered = sorted(values)
    n = len(ordered)
    k = 2 if n >= 5 else 1
    coverage = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n
    return ordered[k - 1], ordered[n - k], coverage


def gpu_worker(args):
    import torch
    with torch.inference_mode():      # a server decodes without autograd (and torch.compile refuses the
        gpu_worker_timed(torch, args)  # cache's in-place writes under it)


def gpu_worker_timed(torch, args):
    probed, plain = worker_setup(args.scratch)
    batch, dev = args.batch, args.device
    forward, max_len = gpu_model(torch, batch, dev, args.tiny)
    runners = {label: gpu_runner(torch, args.exec_mode, forward, mod.postprocess, batch, max_len, dev, mod.admit)
               for label, mod in (("probed", probed), ("plain", plain))}
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(3):                # warm-up (compile, capture) outside the timing, interleaved
        for run in runners.values():
            run(16)
    steps = args.steps or steps_for(runners["plain"], sync, args.run_seconds)
    tok_s = {"probed": [], "plain": []}
    pairs = []
    for rep in range(args.reps):
        order = ("probed", "plain") if rep % 2 == 0 else ("plain", "probed")   # ABBA: drift cancels
        for label in order:
            sync()
            t0 = time.perf_counter()
            runners[label](steps)
            sync()
            tok_s[label].append(batch * steps / (time.perf_counter() - t0))
        pairs.append((1.0 - tok_s["probed"][-1] / tok_s["plain"][-1]) * 100.0)
    lo, hi, coverage = median_interval(pairs)
    plain_med = statistics.median(tok_s["plain"])

    def spread(runs):
        return (max(runs) - min(runs)) / statistics.median(runs) * 100.0
    print(json.dumps({"exec_mode": args.exec_mode, "batch": batch, "reps": args.reps, "steps": steps,
                      "plain_tok_s": plain_med, "probed_tok_s": statistics.median(tok_s["probed"]),
                      "overhead_pct": statistics.median(pairs), "interval_pct": [lo, hi],
                      "interval_coverage": round(coverage, 3), "pair_overheads_pct": pairs,
                      "spread_pct": spread(tok_s["plain"]), "probed_spread_pct": spread(tok_s["probed"]),
                      "plain_runs": tok_s["plain"], "probed_runs": tok_s["probed"]}))


# ---------------------------------------------------------------------------------------- main

def main(argv=None):
    started = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="also run the GPU decode-loop part (torch + CUDA)")
    ap.add_argument("--out", help="directory for probe_overhead.json (default: $OUT, else the current dir)")
    ap.add_argument("--reps", type=int, default=9, help="repetitions: CPU processes; GPU probed/plain pairs")
    ap.add_argument("--run-seconds", type=float, default=0.6, help="GPU: seconds each timed run lasts (its steps "
                    "sized from the step rate after warm-up)")
    ap.add_argument("--steps", type=int, help="GPU: decode steps per timed run (instead of --run-seconds)")
    ap.add_argument("--modes", default="eager,cudagraph,compile",
                    help="GPU execution modes, comma-separated, with the probe in the interpreter's best mode")
    ap.add_argument("--functions-modes", default="eager,compile",
                    help="GPU execution modes run again in functions mode (3.12+ only; empty: none)")
    ap.add_argument("--control-modes", default="",
                    help="GPU execution modes run again with neither copy probed (an A/A row: the 'overhead' "
                    "that the two copies show without the probe; empty: none)")
    ap.add_argument("--budget-seconds", type=int, default=480,
                    help="GPU rows that would end past this many seconds since the start are skipped")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU part")
    ap.add_argument("--start", action="store_true",
                    help="also the CPU of one interpreter start with the probe's .pth and without (--reps rounds)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)     # cpu: a smoke run of the GPU part
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # with a tiny model
    ap.add_argument("--worker", choices=("cpu", "gpu"), help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    ap.add_argument("--exec-mode", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.reps < 1 or (args.steps is not None and args.steps < 1):
        ap.error("--reps and --steps must be at least 1")
    if not args.run_seconds > 0:
        ap.error("--run-seconds must be above 0")
    for flag, text in (("--modes", args.modes), ("--functions-modes", args.functions_modes),
                       ("--control-modes", args.control_modes)):
        unknown = sorted(set(mode_list(text)) - set(EXEC_MODES))
        if unknown:
            ap.error("%s: unknown execution mode %s (expected eager, cudagraph or compile, comma-separated)"
                     % (flag, ", ".join(map(repr, unknown))))
    if args.worker == "cpu":
        return cpu_worker(args.scratch)
    if args.worker == "gpu":
        return gpu_worker(args)
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:] if argv is None else argv}
    if not args.no_cpu:
        report["cpu"] = cpu_bench(args.reps)
    if args.start:
        report["start"] = start_bench(args.reps)
    if args.gpu:
        report["gpu"] = gpu_bench(args, started)
        if "skipped" in report["gpu"]:
            print("GPU part skipped: " + report["gpu"]["skipped"])
    report["wall_s"] = round(time.monotonic() - started, 1)
    out_dir = args.out or os.environ.get("OUT") or "."
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "probe_overhead.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote %s (%.0f s in all)" % (path, report["wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
