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
CUDA graphs and torch.compile. Each step calls a patched function
(`postprocess`, its lines added by the "revision"). The probed copy and an
identical unprobed copy run interleaved in the same process, 5 repetitions;
tokens/s per configuration, the overhead, and what the probe recorded
(executed, traced, or nothing).

    python3 bench/probe_overhead.py                 # CPU part
    python3 bench/probe_overhead.py --gpu --out DIR  # CPU part here, then the GPU part

JSON goes to DIR/probe_overhead.json (DIR: --out, else $OUT, else the current dir).
Needs no install: it imports the probe from src/ beside this folder.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRIXIE = "/var/cache/fleetpatch-test/trixie-root"
PROBED, PLAIN = "fp_bench_probed", "fp_bench_plain"
FIRST_HITS = 200

CPU_MODULE = '''"""The patched module of the CPU bench."""


def hot(x):
    return x + 1  # added


def cold(x):
    return x + 1
''' + "".join("\n\ndef first_%d(x):\n    return x + %d  # added\n" % (i, i) for i in range(FIRST_HITS))

GPU_MODULE = '''"""The patched module of the GPU bench: what the server runs every decode step."""
import torch


def postprocess(logits, temperature):
    scaled = logits.float() / temperature  # added
    return torch.argmax(scaled, dim=-1)  # added
'''


def added_lines(source):
    return [n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# added")]


# ---------------------------------------------------------------------------------------- driver

def make_scratch(root, source, mode):
    """A scratch dir (seen as `inner` by the interpreter; `root` its chroot or ''):
    mods/ with the probed and plain copies, site/ with the probe's .pth, probe/ its records."""
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
    probe_install.install(host + "/site", host + "/probe", "bench", plan, probe_dir_seen=inner + "/probe")
    return inner, host


def records_of(host):
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    from fleetpatch.probe import install as probe_install
    files = probe_install.read_records(host + "/probe")
    out = {"processes": 0, "executed": [], "traced": [], "disabled": [], "mode": None}
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
            out["traced"].append({"lines": obj.get("lines") or [obj.get("line")], "how": obj.get("traced")})
    out["executed"] = sorted(set(out["executed"]))
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
               "recorded_lines": len(recorded["executed"]), "disabled": recorded["disabled"]}
        results.append(row)
        print("%-45s %-9s first hit %+8.1f us   watched call %+6.1f ns (of %.1f)   unwatched call %+6.1f ns (of %.1f)"
              % (label, row["mode"], row["first_hit_us"], row["watched_call_ns"], row["watched_call_plain_ns"],
                 row["unwatched_call_ns"], row["unwatched_call_plain_ns"]), flush=True)
    return results


def gpu_bench(args):
    from importlib.util import find_spec
    if find_spec("torch") is None:
        return {"skipped": "torch is not installed"}
    probe_cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                                capture_output=True, text=True)
    if probe_cuda.stdout.strip() != "True":
        return {"skipped": "no CUDA device (torch.cuda.is_available() is %s)" % (probe_cuda.stdout.strip() or "?")}
    rows = []
    for kind in args.modes.split(","):
        for batch in (1, 64):
            inner, host = make_scratch("", GPU_MODULE, None)
            try:
                got = run_worker([sys.executable], inner, "gpu",
                                 ["--exec-mode", kind, "--batch", str(batch), "--reps", str(args.reps),
                                  "--steps", str(args.steps)], 590)
                got["probe"] = records_of(host)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                got = {"exec_mode": kind, "batch": batch, "error": str(exc)[-1500:]}
            finally:
                shutil.rmtree(host, ignore_errors=True)
            rows.append(got)
            print_gpu_row(got)
    return {"device": device_description(), "rows": rows}


def print_gpu_row(row):
    if "error" in row:
        print("%-8s batch %-3d ERROR %s" % (row["exec_mode"], row["batch"], row["error"][-300:]), flush=True)
        return
    probe = row["probe"]
    what = "executed %s" % probe["executed"] if probe["executed"] else (
        "traced %s" % probe["traced"] if probe["traced"] else "nothing recorded")
    print("%-8s batch %-3d plain %10.1f tok/s  probed %10.1f tok/s  overhead %+6.2f%%  probe (%s): %s"
          % (row["exec_mode"], row["batch"], row["plain_tok_s"], row["probed_tok_s"], row["overhead_pct"],
             probe["mode"], what), flush=True)


def device_description():
    code = ("import json, platform, sys, torch; p = torch.cuda.get_device_properties(0); "
            "print(json.dumps({'gpu': p.name, 'memory_gib': round(p.total_memory / 2**30, 1), "
            "'torch': torch.__version__, 'cuda': torch.version.cuda, 'python': platform.python_version(), "
            "'cpu_count': __import__('os').cpu_count()}))")
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
    print(json.dumps(out))


def gpu_model(torch, batch, dim=1024, layers=8, heads=16, vocab=32000, max_len=512):
    """A decoder of random weights, its KV cache static (CUDA-graph friendly); returns step(tokens, pos)."""
    nn = torch.nn
    dev, dt = "cuda", torch.bfloat16
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


def gpu_runner(torch, kind, forward, post, batch, max_len):
    """A function running one decode step of `kind` (eager, cudagraph, compile) with `post`."""
    tokens = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros((), dtype=torch.long, device="cuda")
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
        for _ in range(n):
            step()
            pos.add_(1).remainder_(max_len)
    return run


def gpu_worker(scratch, kind, batch, reps, steps):
    import torch
    with torch.inference_mode():      # a server decodes without autograd (and torch.compile refuses the
        gpu_worker_timed(torch, scratch, kind, batch, reps, steps)   # cache's in-place writes under it)


def gpu_worker_timed(torch, scratch, kind, batch, reps, steps):
    probed, plain = worker_setup(scratch)
    forward, max_len = gpu_model(torch, batch)
    runners = {"probed": gpu_runner(torch, kind, forward, probed.postprocess, batch, max_len),
               "plain": gpu_runner(torch, kind, forward, plain.postprocess, batch, max_len)}
    for _ in range(3):                # warm-up (and compile) outside the timing, clocks settled
        for run in runners.values():
            run(steps // 4)
    torch.cuda.synchronize()
    tok_s = {"probed": [], "plain": []}
    for rep in range(reps):
        order = ("probed", "plain") if rep % 2 == 0 else ("plain", "probed")   # interleaved
        for label in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runners[label](steps)
            torch.cuda.synchronize()
            tok_s[label].append(batch * steps / (time.perf_counter() - t0))
    plain_med, probed_med = statistics.median(tok_s["plain"]), statistics.median(tok_s["probed"])
    print(json.dumps({"exec_mode": kind, "batch": batch, "reps": reps, "steps": steps,
                      "plain_tok_s": plain_med, "probed_tok_s": probed_med,
                      "overhead_pct": (plain_med - probed_med) / plain_med * 100.0,
                      "plain_runs": tok_s["plain"], "probed_runs": tok_s["probed"]}))


# ---------------------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="also run the GPU decode-loop part (torch + CUDA)")
    ap.add_argument("--out", help="directory for probe_overhead.json (default: $OUT, else the current dir)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=256, help="decode steps per repetition (GPU)")
    ap.add_argument("--modes", default="eager,cudagraph,compile", help="GPU execution modes, comma-separated")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU part")
    ap.add_argument("--worker", choices=("cpu", "gpu"), help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    ap.add_argument("--exec-mode", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.steps < 1:
        ap.error("--reps and --steps must be at least 1")
    if args.worker == "cpu":
        return cpu_worker(args.scratch)
    if args.worker == "gpu":
        return gpu_worker(args.scratch, args.exec_mode, args.batch, args.reps, args.steps)
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not args.no_cpu:
        report["cpu"] = cpu_bench(args.reps)
    if args.gpu:
        report["gpu"] = gpu_bench(args)
        if "skipped" in report["gpu"]:
            print("GPU part skipped: " + report["gpu"]["skipped"])
    out_dir = args.out or os.environ.get("OUT") or "."
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "probe_overhead.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
