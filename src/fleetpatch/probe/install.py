"""Host side of the probe (stdlib only): the plan, the site directory, install, removal, records.

Layout, for one run token:

- ``<probe dir>/runtime.py``: the probe's code (runtime.py of this package);
- ``<probe dir>/plan.json``: what it watches (`make_plan`);
- ``<probe dir>/records/``: 0o1777, where each server process writes (runtime.py says what);
- ``<site dir>/zzz-fleetpatch-probe-<token>.pth``: the one line that starts it. site
  reads ``.pth`` files in name order, so this one comes last and its finder
  goes in front of those that other ``.pth`` files put in ``sys.meta_path``.

The probe's code stays out of the site directory, so that no bytecode cache is
ever written there: the ``.pth`` line compiles it from the probe dir. Removing
the ``.pth`` leaves the site directory as it was (names, bytes and modes); the
probe dir, records included, stays until the next restart clears it. A
``.pth`` whose name starts with `PTH_PREFIX` but whose token is not the current
run's is a stale probe (a killed run): `stale_probes` finds it and `remove`
takes it out.
"""
import builtins
import gc
import hashlib
import json
import marshal
import os
import re
import stat
import sys

PTH_PREFIX = "zzz-fleetpatch-probe-"
PTH_SUFFIX = ".pth"
RUNTIME_NAME = "runtime.py"
PLAN_NAME = "plan.json"
# The plan as the runtime reads it (`probe_plan`: marshal version 2, readable by Python 3.8 to
# 3.13 whatever the agent's version; `json` cost every server start 3 ms to import). PLAN_NAME
# stays for the agent's record reader.
PROBE_PLAN_NAME = "plan.marshal"
PLAN_MARSHAL_VERSION = 2
# Functions mode: a patched module rewritten with its guards and compiled by the agent, one file
# per module: what every server start would otherwise do with `ast` (about 14 ms on 3.11).
MODULE_CODE_SUFFIX = ".code"
# The runtime compiled by the agent, for an interpreter of the agent's exact build: the .pth
# loads it instead of compiling the source at every start of every server process (about
# 4 ms each on this machine's 3.11 and on 3.13; bench/README.md, "The probe's cost per start").
CODE_NAME = "runtime.code"
RECORDS_NAME = "records"
TOKEN_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# What the agent runs with the server's interpreter (`python -c SITE_QUERY [ANSWER_FILE]`); its
# answer goes to `site_dir_from`. The answer is written to ANSWER_FILE when one is given, not
# printed: the interpreter's own start-up (a .pth of the host's) may print anything, any amount.
SITE_QUERY = (
    "import json, site, sys, sysconfig\n"
    "try:\n    pkgs = site.getsitepackages()\nexcept Exception:\n    pkgs = []\n"
    "answer = json.dumps({'site_packages': pkgs, 'purelib': sysconfig.get_paths().get('purelib'), "
    "'path': sys.path, 'executable': sys.executable, 'version': list(sys.version_info[:3]), "
    "'no_site': bool(sys.flags.no_site), 'stamp': repr((sys.version, sys.implementation.cache_tag))})\n"
    "if len(sys.argv) > 1:\n    open(sys.argv[1], 'w').write(answer)\nelse:\n    print(answer)\n"
)


# What the agent runs with the server's interpreter when that is not the agent's own build
# (`python -I -S -c RUNTIME_COMPILE <runtime path as the server sees it>`, the runtime's source on
# stdin): CODE_NAME's content, compiled by that build, on stdout (-I -S: no .pth of the host runs,
# nothing else is printed). A server then loads the runtime instead of compiling its source at
# every start (4-8 ms on 3.13).
RUNTIME_COMPILE = (
    "import marshal, sys\n"
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec')\n"
    "sys.stdout.buffer.write(repr((sys.version, sys.implementation.cache_tag)).encode('utf-8') + b'\\0' "
    "+ marshal.dumps(code))\n"
)


def compiled_by(argv, source, runtime_path, timeout=60):
    """CODE_NAME's content as the interpreter `argv` compiles `source` (the runtime) for
    `runtime_path`; None where it cannot (it is then compiled at each start, as before)."""
    import subprocess
    try:
        done = subprocess.run(list(argv) + ["-I", "-S", "-c", RUNTIME_COMPILE, runtime_path], input=source,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    stamp, sep, body = done.stdout.partition(b"\0")
    return done.stdout if done.returncode == 0 and sep and stamp.startswith(b"(") and body else None


class ProbeInstallError(Exception):
    """The probe cannot go into this interpreter; the message says why."""


def site_dir_from(info):
    """The site directory whose .pth files this interpreter reads at start, from SITE_QUERY's JSON.

    The first of site.getsitepackages() that is on sys.path (site adds only
    those that exist), else purelib when it is on sys.path."""
    if isinstance(info, (str, bytes)):
        info = json.loads(info)
    on_path = [p for p in info.get("path") or [] if p]
    for candidate in list(info.get("site_packages") or []) + [info.get("purelib")]:
        if candidate and candidate in on_path:
            return candidate
    raise ProbeInstallError(
        "%s reads no site directory at start (site-packages: %s; sys.path: %s)"
        % (info.get("executable") or "the interpreter", ", ".join(info.get("site_packages") or []) or "none",
           ", ".join(on_path) or "empty"))


def module_name(path):
    """'sglang/srt/managers/tp_worker.py' -> 'sglang.srt.managers.tp_worker' (a package's __init__.py: the package)."""
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def make_plan(added, package_parent, watch=(), mode=None):
    """The probe's plan: `added` {path: [line numbers]} of the patched files, `watch` paths
    (siblings) to report as imported without lines, or {sibling path: [the patched paths it is the
    sibling of]}: the probe then counts the sibling's functions named like the patched files'
    functions that hold added lines; `package_parent` the directory that holds the package (the
    files' expected location is package_parent/path)."""
    modules = {}
    for path in sorted(set(added) | set(watch)):
        if not path.endswith(".py"):
            continue
        modules[module_name(path)] = {
            "path": path,
            "expected": os.path.join(package_parent, path),
            "lines": sorted({int(n) for n in added.get(path, ())}),
        }
        twins = watch.get(path) if isinstance(watch, dict) else None
        if twins and not added.get(path):
            modules[module_name(path)]["twins"] = sorted(twins)
    plan = {"version": 1, "modules": modules}
    if mode:
        plan["mode"] = mode
    return plan


def pth_name(token):
    return PTH_PREFIX + token + PTH_SUFFIX


def code_stamp():
    """What an interpreter must match to load CODE_NAME: its exact build and bytecode tag."""
    return repr((sys.version, sys.implementation.cache_tag)).encode("utf-8")


def pth_line(runtime_path):
    """The .pth line: run the probe from its own dir, its compiled code (CODE_NAME beside the
    runtime) when this interpreter is the build that compiled it, else compiled from the
    source; a missing file or any error is silent.

    Its globals have no ``__name__``: TorchDynamo, inlining a function of the
    probe, would import the module that names (none is) and fail the server's
    torch.compile; with none it treats them as an unnamed scope."""
    code_path = os.path.join(os.path.dirname(runtime_path), CODE_NAME)
    body = ("try:\n c = None\n try:\n  import marshal\n"
            "  with open(%r, 'rb') as f: h, _, b = f.read().partition(b'\\0')\n"
            "  if h == repr((sys.version, sys.implementation.cache_tag)).encode('utf-8'): c = marshal.loads(b)\n"
            " except Exception:\n  c = None\n"
            " if c is None:\n"
            "  with open(%r, 'rb') as f: s = f.read()\n"
            "  c = compile(s, %r, 'exec')\n"
            " exec(c, {'__file__': %r, "
            "'__builtins__': __builtins__, '__fleetpatch_probe_boot__': True})\n"
            "except Exception:\n pass\n") % (code_path, runtime_path, runtime_path, runtime_path)
    return "import sys; exec(%r)\n" % body


GUARDS_NAME = "guards.py"    # functions mode's rewrite: the first part of the runtime's source


def runtime_source():
    """The probe's source as the server runs it: guards.py, then runtime.py (which uses it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    parts = []
    for name in (GUARDS_NAME, RUNTIME_NAME):
        with open(os.path.join(here, name), "rb") as f:
            parts.append(f.read())
    return b"\n\n".join(parts)


def write_atomic(path, data, mode, sync=True):
    """`path` replaced by `data` in one rename. `sync`: flushed to disk first (the .pth: the site
    dir must never hold a torn file); the probe dir's files are not (an fsync each cost the agent
    about 5 ms of wall time): after a crash a missing or torn one only turns the probe off."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    if os.path.lexists(tmp):   # a dead run's, or planted: created anew, never written through
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def install(site_dir, probe_dir, token, plan, source=None, probe_dir_seen=None, server_code=None, cache_dir=None):
    """Put the probe in: probe dir (runtime, plan, records 0o1777), then the .pth, each atomically.

    Returns {"pth": path, "probe_dir": path}. The probe dir's parents must be
    traversable by the server's user. `probe_dir_seen`: the probe dir as the
    server sees it, where that differs (a chroot or container mount). `server_code`: CODE_NAME's
    content as the server's build compiled it (`compiled_by`; this one's: the agent's cache), for
    the runtime at `runtime_path` as the server sees it (None: compiled here). `cache_dir`: where
    `probe_plan`'s work is kept between installs (the agent's state dir; None: not kept).
    The plan's `python_version` ("3.13", "3.13.5"), where the server does not see the probe dir at the
    agent's path (a container) and no `server_code` is given: a server of another minor than this
    one's cannot load code compiled here, so none is compiled (4 ms of the agent's CPU) nor
    written, and its start compiles the source, as it would have."""
    if not TOKEN_RE.match(token):
        raise ProbeInstallError("bad probe token %r" % token)
    if not os.path.isdir(site_dir):
        raise ProbeInstallError("site directory %s does not exist" % site_dir)
    records = os.path.join(probe_dir, RECORDS_NAME)
    for folder, mode in ((probe_dir, 0o755), (records, 0o1777)):
        os.makedirs(folder, exist_ok=True)
        if os.path.islink(folder):   # chmod follows links: it would open up wherever this one leads
            raise ProbeInstallError("%s is a symlink (to %s): the probe is not put through it"
                                    % (folder, os.readlink(folder)))
        os.chmod(folder, mode)
    runtime_path = os.path.join(probe_dir, RUNTIME_NAME)
    source = source if source is not None else runtime_source()
    write_atomic(runtime_path, source, 0o644, sync=False)
    seen = os.path.join(probe_dir_seen, RUNTIME_NAME) if probe_dir_seen else runtime_path
    # the files the agent reads are the ones the server imports only where both see the same paths
    local = probe_dir_seen is None or os.path.normpath(probe_dir_seen) == os.path.normpath(probe_dir)
    code = None
    if server_code is not None:
        stamp, _, body = server_code.partition(b"\0")
        code = marshal.loads(body) if stamp == code_stamp() else None
    minor = ".".join(str(plan.get("python_version") or "").split(".")[:2])   # "3.13" of "3.13" or "3.13.5"
    other_minor = not local and bool(minor) and minor != "%d.%d" % sys.version_info[:2]
    if code is None and (server_code is None or local) and not other_minor:
        code = compile(source, seen, "exec")
    if server_code is not None or code is not None:
        write_atomic(os.path.join(probe_dir, CODE_NAME), server_code or code_stamp() + b"\0" + marshal.dumps(code),
                     0o644, sync=False)
    write_atomic(os.path.join(probe_dir, PLAN_NAME), json.dumps(plan, sort_keys=True).encode("utf-8"), 0o644,
                 sync=False)
    ready = cached_probe_plan(plan, probe_dir, code if local else None, source, cache_dir)
    write_atomic(os.path.join(probe_dir, PROBE_PLAN_NAME), marshal.dumps(ready, PLAN_MARSHAL_VERSION), 0o644,
                 sync=False)
    pth = os.path.join(site_dir, pth_name(token))
    write_atomic(pth, pth_line(seen).encode("utf-8"), 0o644)
    return {"pth": pth, "probe_dir": probe_dir}


PLAN_CACHE_MOST = 16     # probe_plan results kept in `cache_dir` (a few patches x interpreters)


def cached_probe_plan(plan, probe_dir, runtime_code, source, cache_dir):
    """`probe_plan`, kept in `cache_dir` keyed by everything it reads: the plan, this build, the
    runtime's source and the bytes of each watched file. A deploy of a patch already seen on
    files already seen (every rollout after the first, a restart, a retry) costs reading the
    files once and the cache entry: the parse, the rewrite and the compile (20-35 ms of the
    agent's CPU for eagle_worker.py and its sibling) are done once per (file, lines, build)."""
    if runtime_code is None or not cache_dir:
        return probe_plan(plan, probe_dir, runtime_code)
    seen = {}       # path -> (bytes, stat) as read now: the stats of the entry are today's
    digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode("utf-8", "surrogateescape"))
    digest.update(b"\0" + code_stamp() + b"\0" + hashlib.sha256(source).digest())
    for spec_name, spec in sorted((plan.get("modules") or {}).items()):
        path = spec.get("expected")
        data = read_source(path, seen) if path else None
        digest.update(b"\0" + spec_name.encode("utf-8") + b"\0"
                      + (hashlib.sha256(data[0]).digest() if data else b"-"))
    entry = os.path.join(cache_dir, digest.hexdigest()[:40])
    try:
        with open(entry, "rb") as f:
            kept = marshal.loads(f.read())
        ready, codes = kept["ready"], kept["codes"]
        for name, spec in ready["modules"].items():
            if spec.get("compiled"):
                st = seen[spec["expected"]][1]
                spec["compiled"]["stat"] = [st.st_ino, st.st_size, st.st_mtime_ns]
    except Exception:   # none kept (or torn): worked out below
        ready = None
    if ready is not None:
        for file_name, code in codes.items():
            write_atomic(os.path.join(probe_dir, file_name), code, 0o644, sync=False)
        return ready
    ready = probe_plan(plan, probe_dir, runtime_code, seen)
    codes = {}
    for spec in ready["modules"].values():
        if spec.get("compiled"):
            with open(os.path.join(probe_dir, spec["compiled"]["file"]), "rb") as f:
                codes[spec["compiled"]["file"]] = f.read()
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        write_atomic(entry, marshal.dumps({"ready": ready, "codes": codes}), 0o600, sync=False)
        names = [n for n in os.listdir(cache_dir) if not n.startswith(".")]
        names.sort(key=lambda n: os.stat(os.path.join(cache_dir, n)).st_mtime_ns)
        for name in names[:-PLAN_CACHE_MOST]:
            os.unlink(os.path.join(cache_dir, name))
    except OSError:     # not kept: the next install works it out again
        pass
    return ready


def read_source(path, seen):
    """(bytes, os.stat) of a file, read once per install (`seen` keeps them), or None."""
    if path not in seen:
        try:
            with open(path, "rb") as f:
                seen[path] = (f.read(), os.fstat(f.fileno()))
        except OSError:
            seen[path] = None
    return seen[path]


def probe_plan(plan, probe_dir, runtime_code, seen=None):
    """The plan as the runtime reads it, with what the agent can work out once for every server
    start (`runtime_code`: the runtime's code, whose functions do it; None: nothing, the runtime
    works it out itself): per sibling, the names of the functions it counts (`counted`, from
    the patched files' sources); in functions mode, each watched module rewritten and compiled
    for this interpreter's build (`compiled`), used by a server of the same build."""
    modules = dict((name, dict(spec)) for name, spec in (plan.get("modules") or {}).items())
    ready = dict(plan, modules=modules)
    if runtime_code is None:
        return ready
    runtime = {"__file__": runtime_code.co_filename, "__builtins__": builtins}
    exec(runtime_code, runtime)     # defines the runtime's functions; starts nothing (no boot flag)
    parsed = {}     # path -> (its stat, its ast) or None: each file read and parsed once
    seen = {} if seen is None else seen
    for name, spec in sorted(modules.items()):
        twins = spec.get("twins")
        if twins and not spec.get("lines"):
            counted = sibling_counts(runtime, modules, twins, parsed, seen)
            if counted is not None:
                spec["counted"] = counted
    if plan.get("mode") != "functions" and sys.version_info >= (3, 12):
        return ready        # lines mode in a server of this build: nothing to compile
    # The parse makes tens of thousands of nodes, none of them in a cycle that outlives this
    # call: the collector, run on them as they are made, cost 1.4 of the 16 ms of the bench
    # patch's two modules (3.11).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for name, spec in sorted(modules.items()):
            if spec.get("lines") or spec.get("counted"):
                spec["compiled"] = compile_module(runtime, name, spec, probe_dir, parsed, seen)
                if spec["compiled"] is None:
                    del spec["compiled"]
    finally:
        if collecting:
            gc.enable()
    return ready


def parse_file(path, parsed, seen):
    """(os.stat, ast) of a Python file, once per path (`parsed` keeps them; `seen` the bytes
    read, once per install), or None where this Python cannot read or parse it (it may be older
    than the server's)."""
    import ast
    if path not in parsed:
        data = read_source(path, seen)
        try:
            parsed[path] = (data[1], ast.parse(data[0], path)) if data else None
        except Exception:
            parsed[path] = None
    return parsed[path]


def sibling_counts(runtime, modules, twins, parsed, seen):
    """The names a sibling counts (["*"]: every function), or None where a patched file cannot be
    read or parsed here: the runtime then tries."""
    names = set()
    for twin in modules.values():
        if twin.get("path") in twins and twin.get("lines") and twin.get("expected"):
            held = hinted_holders(twin, seen)
            if held is None:
                found = parse_file(twin["expected"], parsed, seen)
                if found is None:
                    return None
                held = runtime["holder_names_in"](found[1], twin["lines"])
            names |= held
    return sorted(names or {"*"})


def hinted_holders(spec, seen):
    """The functions that hold the added lines, as the laptop's splice hint names them, where the
    hint is for the bytes this host has; None: the file is parsed here (about 5 ms a 1000-line
    module on 3.11, for each patched sibling at a patch's first deploy)."""
    hint = hint_for(spec, read_source(spec["expected"], seen))
    holders = hint.get("holders") if hint else None
    if not isinstance(holders, list) or not all(isinstance(n, str) for n in holders):
        return None
    return set(holders)


def hint_for(spec, data):
    """The laptop's splice hint of a plan entry (probe/splice.py), where it was made for `data`
    (read_source's answer: the bytes this host has); else None."""
    hint = spec.get("splice")
    if not isinstance(hint, dict) or data is None or hashlib.sha256(data[0]).hexdigest() != hint.get("sha256"):
        return None
    return hint


def compile_module(runtime, name, spec, probe_dir, parsed, seen):
    """{"file", "stat", "table"[, "splice"]}: module `name` rewritten with its guards, compiled for this
    build into <name>.code (with "splice": only its functions that hold added lines, spliced_module);
    None where it cannot be done here (the runtime then rewrites it at import)."""
    path = spec.get("expected")
    done = spliced_module(runtime, spec, read_source(path, seen) if path else None)
    if done is not None:
        (code, table), st = done, seen[path][1]
    else:
        found = parse_file(path, parsed, seen) if path else None
        if found is None:
            return None
        st, tree = found
        parsed[path] = None     # rewritten below: no later use of this tree
        try:
            table = runtime["rewrite_tree"](tree, frozenset(spec.get("lines") or ()), spec.get("counted") or ())
            code = compile(tree, path, "exec", dont_inherit=True)
        except Exception:   # the runtime's turn, at import
            return None
    file_name = name + MODULE_CODE_SUFFIX
    write_atomic(os.path.join(probe_dir, file_name), code_stamp() + b"\0" + marshal.dumps(code), 0o644, sync=False)
    compiled = {"file": file_name, "stat": [st.st_ino, st.st_size, st.st_mtime_ns], "table": [list(t) for t in table]}
    if done is not None:
        compiled["splice"] = True   # its functions only: the start splices them into the module's own code
    return compiled


def spliced_module(runtime, spec, data):
    """(code, guard table) of a module whose plan entry carries the laptop's `splice` hint for these
    bytes (probe/splice.py): the code of a copy of the file that keeps only the functions that hold
    added lines, their classes' headers and the module's __future__ imports (every other line blank,
    so every line keeps its number), rewritten with their guards. The server's start puts these
    functions in place of the plain ones in the module it compiles or loads anyway (guards.splice);
    None where the hint is absent, is for other bytes, or a guard would land outside a function
    (the whole module is rewritten then)."""
    hint = hint_for(spec, data)
    lines = frozenset(spec.get("lines") or ())
    if not hint or not lines:
        return None
    import ast
    try:
        rows = data[0].splitlines(True)
        parts, at = [], 1
        for first, last in sorted(hint["keep"]):    # blank lines between, the kept ranges as they are
            if first < at or last < first:
                return None
            parts += [b"\n" * (first - at)] + rows[first - 1:last]
            at = last + 1
        snippet = b"".join(parts)   # UTF-8, as the file is (the laptop gives no hint for a coding line of another)
        names = [str(n) for n in hint.get("imports") or ()]
        if names:   # bound by an import, as in the module, on lines after its last (numbers unchanged)
            if not all(n.isidentifier() for n in names):
                return None
            snippet += b"\nif 0:\n    import " + ", ".join(names).encode("ascii") + b"\n"
        tree = ast.parse(snippet, spec["expected"])
        table = runtime["rewrite_tree"](tree, lines, ())
        part = compile(tree, spec["expected"], "exec", dont_inherit=True)
    except Exception:
        return None
    return (part, table) if runtime["guards_in_functions_only"](part) else None


def probe_pths(site_dir):
    """Names of every probe .pth in the site directory (this run's and stale ones)."""
    try:
        names = os.listdir(site_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(PTH_PREFIX) and n.endswith(PTH_SUFFIX))


def token_of(pth):
    return pth[len(PTH_PREFIX):-len(PTH_SUFFIX)]


def stale_probes(site_dir, current=None):
    """Probe .pth names left by another run (a killed laptop, Ctrl-C) than token `current`."""
    return [n for n in probe_pths(site_dir) if token_of(n) != current]


def remove(site_dir, token=None):
    """Take the probe's .pth out (token None: every probe .pth, stale ones included), and any
    temporary file of an interrupted install. Returns the names removed."""
    removed = []
    for name in sorted(os.listdir(site_dir)) if os.path.isdir(site_dir) else []:
        probe = name.startswith(PTH_PREFIX) and name.endswith(PTH_SUFFIX)
        leftover = name.startswith("." + PTH_PREFIX) and name.endswith(PTH_SUFFIX + ".tmp")
        if not (probe or leftover):
            continue
        shown = name[1:-4] if leftover else name
        if token is not None and token_of(shown) != token:
            continue
        try:
            os.unlink(os.path.join(site_dir, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def read_records(probe_dir, limit=4 << 20):
    """{"<pid>-<ns>/<name>": bytes} of the records (at most `limit` bytes in all; temporary files left out).

    Only regular files in real directories are read: whoever runs the server can write
    below records/, and a symlink there (to the host's own files, seen from a container)
    or a FIFO (an open that never returns) must not be followed."""
    records = os.path.join(probe_dir, RECORDS_NAME)
    out = {}
    total = 0
    for proc in sorted(os.listdir(records)) if real_dir(records) else []:
        folder = os.path.join(records, proc)
        if not real_dir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if name.startswith("."):
                continue
            data = read_regular(os.path.join(folder, name), 64 << 10)
            if data is None:
                continue
            total += len(data)
            if total > limit:
                return out
            out[proc + "/" + name] = data
    return out


def real_dir(path):
    return os.path.isdir(path) and not os.path.islink(path)


def read_regular(path, size):
    """Up to `size` bytes of a regular file, never through a symlink nor from a FIFO; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
