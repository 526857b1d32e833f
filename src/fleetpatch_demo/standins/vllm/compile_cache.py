"""vLLM's torch.compile cache, as the stand-in models it.

vLLM compiles the model's forward with torch.compile and caches the artifacts under
``VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_0/``, the hash covering the contents of
the traced source files.  The stand-in's compiled region is the drafter's: its key is the
sha256 of the files that define the drafter's class and its bases (the host's files).

* ``--enforce-eager``: no compilation, no cache; nothing is traced at start-up.
* First start for a key (a changed drafter file is a new key): the worker "traces": it runs the
  drafter's propose step once at start-up with ``torch.compiler.is_compiling()`` True (its
  Python lines run, as TorchDynamo steps through the code it compiles; fleetpatch's probe
  records them as traced), logs the release's "Dynamo bytecode transform time" and "Compiling a
  graph for ..." lines and stores the key's directory.
* A later start with the same key logs the release's "Directly load the compiled graph(s) for
  ... from the cache" line and runs no Python of the drafter at start-up.

Requests run the propose step in either case (the stand-in does not replay compiled graphs;
the propose step's Python is what a patch changes and what the probe must see).
Stdlib only; Python 3.8+.
"""
import hashlib
import importlib
import inspect
import logging
import os
import time

BACKENDS = "vllm/compilation/backends.py"
MONITOR = "vllm/compilation/monitor.py"
MARKER = "standin-compiled-graph"


def key_files(instance, site_dir):
    """The host files of the drafter's class and its bases (the traced sources)."""
    out = []
    for cls in type(instance).__mro__:
        try:
            path = inspect.getsourcefile(cls)
        except TypeError:
            continue
        if path and os.path.abspath(path).startswith(os.path.abspath(site_dir)) and path not in out:
            out.append(path)
    return out


def cache_key(paths):
    h = hashlib.sha256()
    for p in sorted(paths):
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:10]


def fill(text, shape, seconds):
    """Arguments for a quoted compile line: a leading "%s" is vLLM's log prefix (empty), a middle
    "%s" the shape or compile range, a float the seconds."""
    args = []
    rest = text
    if rest.startswith("%s"):
        args.append("")
        rest = rest[2:]
    for i in range(len(rest)):
        if rest[i] == "%" and i + 1 < len(rest):
            nxt = rest[i + 1]
            if nxt == "s":
                args.append(shape)
            elif nxt in ".0123456789f":
                args.append(seconds)
            elif nxt == "d":
                args.append(0)
    return tuple(args)


def _line(log, source, needle, shape, seconds, near=None):
    hit = log.quoter.quote(source, needle, near)
    if hit is None:
        return False
    text, line = hit
    log.emit(logging.INFO, source, line, text, *fill(text, shape, seconds))
    return True


class compiling(object):
    """While the region is traced, ``torch.compiler.is_compiling()`` is True in this process, as
    under TorchDynamo: fleetpatch's probe then records the lines that run as traced (T-), not as
    run; the drafter's own checks of it see the same."""

    def __enter__(self):
        self.compiler = importlib.import_module("torch").compiler      # the stub torch of this process
        object.__setattr__(self.compiler, "is_compiling", lambda *a, **k: True)
        return self

    def __exit__(self, *exc):
        object.__setattr__(self.compiler, "is_compiling", lambda *a, **k: False)
        return False


def start(log, drafter, cache_root, rank, enforce_eager, site_dir, max_tokens):
    """At worker start-up: trace (run the propose step once) or load from the cache.
    Returns "eager", "traced" or "cached"."""
    if enforce_eager:
        return "eager"
    key = cache_key(key_files(drafter.instance, site_dir))
    rank_dir = os.path.join(cache_root, "torch_compile_cache", key, "rank_%d_0" % rank, "backbone")
    _line(log, BACKENDS, "Using cache directory", rank_dir, 0.0)
    shape = "(1, %d)" % max_tokens
    began = time.time()
    if os.path.isfile(os.path.join(rank_dir, MARKER)):
        _line(log, BACKENDS, "Directly load the compiled graph(s) for", shape, time.time() - began)
        _line(log, MONITOR, "torch.compile t", shape, time.time() - began)
        return "cached"
    with compiling():            # TorchDynamo steps through the region's Python once
        drafter.propose()
    _line(log, BACKENDS, "Dynamo bytecode transform time", shape, time.time() - began)
    _line(log, BACKENDS, "Compiling a graph for", shape, time.time() - began)
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, MARKER), "w") as f:
        f.write(key + "\n")
    _line(log, MONITOR, "torch.compile t", shape, time.time() - began)
    return "traced"
