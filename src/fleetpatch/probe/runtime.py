"""fleetpatch's probe: the code that runs INSIDE the server's interpreter (Python 3.8+, stdlib only).

A ``.pth`` line in the interpreter's site directory executes this file at every
interpreter start (spawned children included: multiprocessing spawn runs site
again). It reads ``plan.marshal`` beside this file: per patched module, the file it
must be loaded from and the line numbers that the revision adds or changes.
It records, as small JSON files below ``records/<pid>-<start ns>/`` beside the
plan, each written once:

- ``process.json``: this process (pid, ppid, argv, executable, mode);
- ``M-<module>.json``: a patched (or watched) module imported, and its file;
- ``L-<module>-<line>.json`` (lines mode, Python 3.12+ ``sys.monitoring``):
  an added line ran;
- ``F-<module>-<k>.json`` (functions mode, 3.8-3.11, or 3.12+ with no free
  monitoring tool id): a statement that holds added lines started running (guard
  k, `line_spot` says which statement stands for a line); it lists those lines,
  so the records say which added lines ran, as lines mode's do;
- ``C-<module>-<function>.json``: a watched function (one that holds added
  lines, or a sibling file's function of the same name) ran ``count`` times in
  this process; rewritten at counts 1 to COUNT_EXACT, then at each power of
  two (above COUNT_EXACT the count is a lower bound), up to COUNT_CAP, where
  the probe stops counting that function;
- ``T-...`` like ``L-``/``F-``, for a line or body that torch.compile traced
  or that ran while a CUDA graph was being captured. TorchDynamo steps through
  the bytecode of what it compiles or inlines without running it, and the
  compiled code runs none of it: lines mode learns the lines it traces from
  torch's ``TracingContext.set_current_loc`` (`hook_dynamo`), functions mode
  from its guard call, which Dynamo runs at trace time (`rewrite`);
- ``disabled``: the probe turned itself off, and why.

How it hooks only the patched modules: a finder first in ``sys.meta_path``
answers only for the planned module names; for them it lets the real finders
find the spec and wraps its loader, so that the module's code object is
prepared before it runs. Lines mode sets LINE events locally on the code
objects that hold added lines, under a free tool id, and the callback returns
DISABLE after each line's first event, so a hot loop pays once. Functions
mode compiles the module from its source with guard statements
(``if P[k]: P[0](k)``, P a list in the module's globals under
``__fleetpatch_probe__``): one at the start of each body that holds added lines,
which counts its calls until one of its added lines ran, and one right before
each statement that holds added lines, in that statement's own block, whose
flag is cleared on its first run, so later runs pay one list look-up. Nothing else
in the process pays, and no global trace function is set. Where the agent compiled only
the functions that hold added lines (the plan's ``compiled`` says ``splice``), the module's
own code comes from its real loader, as without the probe, and those functions are put
in place of their namesakes (`splice`).

What the server runs is guards.py (functions mode's rewrite: PROBE_NAME, `rewrite_tree`,
`holder_names`, `splice`) followed by this file, as one source (install.runtime_source).

It never raises into the server: an error of its own turns it off and is
recorded in ``disabled``. It never writes a bytecode cache of rewritten code (the real
loader writes the module's own, as it does without the probe) and never changes
what a module computes. Records are created 0o666 in per-process directories
0o777 below a ``records`` directory the installer made 0o1777, so a server
that runs as another user can write them and the installer's user can clear
them.
"""
import marshal
import os
import sys
import time

# PROBE_NAME, holder_names, rewrite_tree and splice come from guards.py, which runs first in the same source.
PLAN_NAME = "plan.marshal"             # the plan as the agent wrote it for the probe (install.py), marshal version 2
FREE_TOOL_IDS = (4, 3)                # sys.monitoring ids no standard tool claims (0 debugger, 1 coverage, 2 profiler, 5 optimizer)
TOOL_NAME = "fleetpatch-probe"
TORCH_GUARDS = "torch._guards"        # where TorchDynamo says which line it traces (TracingContext.set_current_loc)
ARGV_KEPT = 24
COUNT_EXACT = 8       # count records are written at every count up to this one, then at powers of two
COUNT_CAP = 1 << 16   # a function is counted up to this many calls, then no more (it costs nothing after)
DISABLE_EVENT = getattr(getattr(sys, "monitoring", None), "DISABLE", None)
ARG_CHARS = 300


def process_name():
    """This process's multiprocessing name where the server uses multiprocessing (vLLM names its
    processes EngineCore_DP0, VllmWorker-0 / Worker_TP0; the main one MainProcess), else None. Read
    when a record is written, not at fork: a forked child is renamed only after the fork returns."""
    mp = sys.modules.get("multiprocessing")
    try:
        return str(mp.current_process().name) if mp is not None else None
    except Exception:
        return None


def traced_now():
    """Why the code running now is only being traced or captured ('' when it really runs).

    torch is only looked at when the process already imported it. Python that
    runs while TorchDynamo traces (a guard call it runs at trace time) sees
    torch.compiler.is_compiling() False: Dynamo's TracingContext tells."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    try:
        if dynamo_tracing(sys.modules.get(TORCH_GUARDS)):
            return "torch.compile"
        compiler = getattr(torch, "compiler", None)
        is_compiling = getattr(compiler, "is_compiling", None)
        if is_compiling is None:
            is_compiling = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
        if is_compiling is not None and is_compiling():
            return "torch.compile"
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized() and cuda.is_current_stream_capturing():
            return "CUDA graph capture"
    except Exception:
        return ""
    return ""


def dynamo_tracing(guards):
    """True while TorchDynamo (torch.compile, torch.export) traces in this thread; `guards`: torch._guards."""
    context = getattr(guards, "TracingContext", None)
    try_get = getattr(context, "try_get", None)
    return try_get is not None and try_get() is not None


def describe_error(exc):
    """One line: the exception and the probe line that raised it."""
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        where = " (probe line %d)" % tb.tb_lineno
        tb = tb.tb_next
    return ("%s: %s%s" % (type(exc).__name__, exc, where))[:1000]


def same_file(a, b):
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except Exception:
        return a == b


def code_lines(code):
    """The line numbers a code object holds (its own, not its nested code objects')."""
    if hasattr(code, "co_lines"):
        return {line for _, _, line in code.co_lines() if line is not None}
    import dis
    return {line for _, line in dis.findlinestarts(code)}


def nested_codes(code):
    """The code object and every code object nested in it (functions, classes, lambdas, comprehensions)."""
    found = [code]
    todo = [code]
    while todo:
        for const in todo.pop().co_consts:
            if hasattr(const, "co_code"):
                found.append(const)
                todo.append(const)
    return found


JSON_ESCAPES = dict([(i, "\\u%04x" % i) for i in range(32)] + [(ord('"'), '\\"'), (ord("\\"), "\\\\")])


def json_char(c):
    """A non-ASCII character as JSON's \\u escape (a pair of them beyond the BMP)."""
    n = ord(c)
    if n > 0xFFFF:
        n -= 0x10000
        return "\\u%04x\\u%04x" % (0xD800 | (n >> 10), 0xDC00 | (n & 0x3FF))
    return "\\u%04x" % n


def to_json(obj):
    """The JSON of a record (str, int, float, bool, None, lists, dicts with str keys; keys sorted).
    Not `json`: importing it (and `re` with it) cost 3 ms at every start of every process."""
    if isinstance(obj, str):
        text = obj.translate(JSON_ESCAPES)
        if not text.isascii():
            text = "".join(c if c < "\x7f" else json_char(c) for c in text)
        return '"' + text + '"'
    if obj is None or obj is True or obj is False:
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, int):
        return str(int(obj))
    if isinstance(obj, float):
        return repr(obj) if obj == obj and obj not in (float("inf"), float("-inf")) else "null"
    if isinstance(obj, dict):
        return "{" + ", ".join(to_json(str(k)) + ": " + to_json(obj[k]) for k in sorted(obj)) + "}"
    return "[" + ", ".join(to_json(v) for v in obj) + "]"


class Records:
    """This process's records directory, made on first use (again after a fork)."""

    def __init__(self, root):
        self.root = root
        self.dir = None

    def forget(self):
        self.dir = None

    def mine(self):
        if self.dir is None:
            path = os.path.join(self.root, "%d-%d" % (os.getpid(), time.time_ns()))
            os.mkdir(path)
            os.chmod(path, 0o777)
            self.dir = path
        return self.dir

    def write(self, name, obj):
        folder = self.mine()
        if name != "process.json" and "pid" in obj:
            obj["proc"] = process_name()
        tmp = os.path.join(folder, "." + name + ".tmp")
        data = to_json(obj).encode("ascii")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.fchmod(fd, 0o666)
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(folder, name))


class Watched:
    """One planned module: where it must come from, its added lines, and (a sibling file) the
    patched files it is the sibling of (`twins`), whose functions' namesakes it counts."""

    def __init__(self, name, spec):
        self.name = name
        self.path = str(spec.get("path") or "")
        self.expected = spec.get("expected")
        self.lines = frozenset(int(n) for n in spec.get("lines") or ())
        self.twins = [str(t) for t in spec.get("twins") or ()]
        counted = spec.get("counted")   # worked out by the agent (install.py), else here on first need
        self.counted = set(counted) if counted is not None else None   # a sibling: the function names it counts
        self.compiled = spec.get("compiled")   # functions mode: the agent's rewritten module (install.py)


def count_due(n):
    """Whether count n is written: every count up to COUNT_EXACT, then each power of two."""
    return n <= COUNT_EXACT or not n & (n - 1)


class Finder:
    """First in sys.meta_path; answers only for the planned module names."""

    fleetpatch_probe = True     # how a second start in the same process knows one runs already

    def __init__(self, probe):
        self.probe = probe

    def find_spec(self, name, path=None, target=None):
        probe = self.probe
        if not probe.on or (name not in probe.modules and name != probe.hook_module):
            return None
        return probe.find_spec(self, name, path, target)

    def invalidate_caches(self):
        return None


class Loader:
    """Wraps the real loader of a planned module for its exec_module only."""

    def __init__(self, real, probe):
        self.real = real
        self.probe = probe

    def __getattr__(self, attr):
        return getattr(self.real, attr)

    def create_module(self, spec):
        create = getattr(self.real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self.probe.exec_module(self.real, module)


class Probe:
    """The probe of one process. Every entry point catches its own errors and turns the probe off."""

    def __init__(self, home):
        self.home = home
        self.records = Records(os.path.join(home, "records"))
        self.on = True
        self.modules = {}
        self.mode = "functions"
        self.note = ""
        self.tool = None
        self.watch = {}       # lines mode: id(code) -> (code, module, added lines in it)
        self.done = set()     # what this process recorded: ("L", module, line), ("F", module, k), ...
        self.guards = {}      # functions mode: module -> guard list [callback, flag1, flag2, ...]
        self.units = {}       # functions mode: module -> rewrite_tree's guard table, index k-1
        self.stopped = set()  # functions mode: (module, k) of counted bodies counted no more
        self.traced_units = set()  # functions mode: (module, k) whose guard torch.compile traced
        self.traced_files = {}     # lines mode: co_filename -> (module, added lines its code holds)
        self.hook_module = None    # lines mode: TORCH_GUARDS, hooked when the process imports it
        self.dynamo_hook = None    # (TracingContext, its set_current_loc, ours) once hooked
        self.counting = {}    # lines mode: id(code) -> [code, module, qualname, added lines, first line, stop, count]
        self.holders = {}     # lines mode: (module, added line) -> the counting entries of the code that holds it
        self.counts = {}      # (module, qualname) -> calls counted in this process

    # ------------------------------------------------------------------ start and stop

    def start(self):
        with open(os.path.join(self.home, PLAN_NAME), "rb") as f:
            plan = marshal.loads(f.read())
        self.modules = {name: Watched(name, spec) for name, spec in plan["modules"].items()}
        self.pick_mode(plan.get("mode"))
        self.write_process()
        if self.mode == "lines":
            self.hook_module = TORCH_GUARDS
            if TORCH_GUARDS in sys.modules:
                self.hook_dynamo(sys.modules[TORCH_GUARDS])
        for name in self.modules:
            if name in sys.modules:   # imported before site ran: seen, but not watched
                module = sys.modules[name]
                self.record_import(name, getattr(module, "__file__", None), "imported before the probe loaded")
        sys.meta_path.insert(0, Finder(self))
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.forked)

    def pick_mode(self, wanted):
        self.mode = "functions"
        if wanted == "functions":
            self.note = "functions mode asked for by the plan"
            return
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is None:
            self.note = "Python %d.%d has no sys.monitoring" % sys.version_info[:2]
            return
        for tool in FREE_TOOL_IDS:
            if monitoring.get_tool(tool) is None:
                monitoring.use_tool_id(tool, TOOL_NAME)
                monitoring.register_callback(tool, monitoring.events.LINE, self.line_event)
                monitoring.register_callback(tool, monitoring.events.PY_START, self.start_counter())
                self.tool = tool
                self.mode = "lines"
                return
        self.note = "no free sys.monitoring tool id (%s taken)" % ", ".join(str(t) for t in FREE_TOOL_IDS)

    def write_process(self, forked_from=None):
        argv = [str(a)[:ARG_CHARS] for a in getattr(sys, "argv", [])[:ARGV_KEPT]]
        self.records.write("process.json", {
            "pid": os.getpid(), "ppid": os.getppid(), "argv": argv, "executable": sys.executable,
            "python": "%d.%d.%d" % sys.version_info[:3], "mode": self.mode, "note": self.note,
            "tool": self.tool, "forked_from": forked_from, "t": time.time()})

    def disable(self, reason):
        """Stop watching everything and say why; never raises."""
        if not self.on:
            return
        self.on = False
        for guards in self.guards.values():
            for k in range(1, len(guards)):
                guards[k] = False
        try:
            self.unhook_dynamo()
        except Exception:
            pass
        try:
            if self.tool is not None:
                monitoring = sys.monitoring
                for code, _, _ in self.watch.values():
                    monitoring.set_local_events(self.tool, code, 0)
                for entry in self.counting.values():
                    monitoring.set_local_events(self.tool, entry[0], 0)
                monitoring.register_callback(self.tool, monitoring.events.LINE, None)
                monitoring.register_callback(self.tool, monitoring.events.PY_START, None)
                monitoring.free_tool_id(self.tool)
        except Exception:
            pass
        try:
            self.records.write("disabled", {"reason": reason, "pid": os.getpid(), "t": time.time()})
        except Exception:
            pass

    def forked(self):
        """A forked child records as a process of its own: new directory, every watch armed again."""
        if not self.on:
            return
        try:
            parent = self.records.dir
            self.records.forget()
            self.done.clear()
            self.counts.clear()     # the child counts its own calls
            self.stopped.clear()
            for entry in self.counting.values():
                entry[5], entry[6] = False, 0
            for guards in self.guards.values():
                for k in range(1, len(guards)):
                    guards[k] = True
            if self.tool is not None:
                sys.monitoring.restart_events()
            self.write_process(forked_from=os.path.basename(parent) if parent else None)
        except Exception as exc:
            self.disable("after a fork: " + describe_error(exc))

    # ------------------------------------------------------------------ imports

    def find_spec(self, me, name, path, target):
        try:
            after = False
            for finder in list(sys.meta_path):
                if finder is me:
                    after = True
                    continue
                find = getattr(finder, "find_spec", None)
                if not after or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                        return None
                    spec.loader = Loader(spec.loader, self)
                    return spec
            return None
        except Exception as exc:
            self.disable("finding %s: %s" % (name, describe_error(exc)))
            return None

    def exec_module(self, real, module):
        spec = module.__spec__
        spec.loader = real          # the module's own code sees its real loader
        module.__loader__ = real
        if spec.name not in self.modules:     # torch._guards: load it as it is, then hook it
            real.exec_module(module)
            self.hook_dynamo(module)
            return
        code = None
        if self.on:
            try:
                code = self.prepare(real, module, spec)
            except Exception as exc:
                self.disable("preparing %s: %s" % (spec.name, describe_error(exc)))
                code = None
        if code is None:
            real.exec_module(module)
        else:
            exec(code, module.__dict__)

    def prepare(self, real, module, spec):
        """The code object to run for this module, watched; None: let the real loader run it."""
        watched = self.modules[spec.name]
        origin = spec.origin
        expected = watched.expected
        if expected and origin and not same_file(origin, expected):
            self.record_import(spec.name, origin, "loaded from another file")
            return None
        self.record_import(spec.name, origin, "")
        if not watched.lines and not self.sibling_names(watched):
            return None
        if self.mode == "lines":
            get_code = getattr(real, "get_code", None)
            code = get_code(spec.name) if get_code is not None else None
            if code is not None:
                self.watch_code(watched, code)
            return code
        code = self.precompiled(watched, origin, module, real)
        if code is not None:
            return code
        get_source = getattr(real, "get_source", None)
        source = get_source(spec.name) if get_source is not None else None
        if source is None:
            self.record_note(spec.name, "no source to watch its functions")
            return None
        return self.rewrite(watched, source, origin or watched.path, module)

    def sibling_names(self, watched):
        """A sibling file's functions to count: those named like the functions that hold the added
        lines of the patched files it is the sibling of (every function if none is). Empty for a
        module that is no sibling; read once per process, from the patched files' own sources."""
        if not watched.twins:
            return set()
        if watched.counted is None:
            names = set()
            for twin in self.modules.values():
                if twin.path in watched.twins and twin.lines and twin.expected:
                    try:
                        with open(twin.expected, "rb") as f:
                            names |= holder_names(f.read(), twin.expected, twin.lines)
                    except Exception:   # unreadable or not Python: count all of the sibling's functions
                        pass
            watched.counted = names or {"*"}
        return watched.counted

    def record_count(self, name, qual, lines, first, n):
        """Write the count record of a watched function at count n (count_due says when)."""
        self.records.write("C-%s-%s.json" % (name, qual), {
            "module": name, "path": self.modules[name].path, "unit": qual, "first_line": first,
            "lines": sorted(lines), "count": n, "pid": os.getpid(), "t": time.time()})

    def record_import(self, name, origin, note):
        key = ("M", name)
        if key in self.done:
            return
        self.done.add(key)
        watched = self.modules[name]
        self.records.write("M-%s.json" % name, {
            "module": name, "path": watched.path, "file": origin, "expected": watched.expected,
            "same": not note, "note": note, "pid": os.getpid(), "t": time.time()})

    def record_note(self, name, note):
        self.records.write("N-%s.json" % name, {"module": name, "note": note, "pid": os.getpid(), "t": time.time()})

    # ------------------------------------------------------------------ lines mode

    def watch_code(self, watched, code):
        """LINE events on the code objects that hold added lines, PY_START (counted) on those and on a
        sibling's functions to count."""
        monitoring = sys.monitoring
        line_event, start_event = monitoring.events.LINE, monitoring.events.PY_START
        names = self.sibling_names(watched) if not watched.lines else ()
        for each in nested_codes(code):
            added = watched.lines & code_lines(each)
            if added:
                self.watch[id(each)] = (each, watched.name, added)
                self.traced_files.setdefault(each.co_filename, (watched.name, set()))[1].update(added)
            counted = bool(added) or (names and each is not code and each.co_flags & 0x1 and
                                      ("*" in names or each.co_name in names))   # 0x1: CO_OPTIMIZED, a function
            if counted:
                qual = getattr(each, "co_qualname", each.co_name)
                entry = [each, watched.name, qual, added, each.co_firstlineno, False, 0]
                self.counting[id(each)] = entry
                for line in added:
                    self.holders.setdefault((watched.name, line), []).append(entry)
            if added or counted:
                monitoring.set_local_events(self.tool, each, (line_event if added else 0) | (start_event if counted else 0))

    def start_counter(self):
        """The PY_START callback: a counted function started. It runs on every call of a counted
        function, so it is a closure (half the cost of a bound method's call, measured on 3.13) whose
        common path is a dict look-up, three list reads and an add; it stops counting a function whose
        added line ran already (entry[5]) or that reached COUNT_CAP, and writes a count when due."""
        get = self.counting.get
        due = self.count_reached

        def start_event(code, offset):
            entry = get(id(code))
            if entry is None or entry[5] or entry[0] is not code:
                return DISABLE_EVENT
            n = entry[6] = entry[6] + 1
            if n <= COUNT_EXACT or not n & (n - 1):
                return due(entry, n)
            return None
        return start_event

    def count_reached(self, entry, n):
        """Write a counted function's count n; past COUNT_CAP it is counted no more."""
        try:
            self.record_count(entry[1], entry[2], entry[3], entry[4], n)
        except Exception as exc:
            self.disable("counting a call: " + describe_error(exc))
            return DISABLE_EVENT
        return DISABLE_EVENT if n >= COUNT_CAP else None

    def line_event(self, code, line):
        try:
            entry = self.watch.get(id(code))
            if entry is not None and entry[0] is code and line in entry[2]:
                how = traced_now()
                self.record_line("T" if how else "L", entry[1], line, how)
                if how:
                    return None     # keep watching: the line may still run for real later
        except Exception as exc:
            self.disable("recording a line: " + describe_error(exc))
        return sys.monitoring.DISABLE

    def record_line(self, kind, name, line, how):
        key = (kind, name, line)
        if key in self.done:
            return
        self.done.add(key)
        if kind == "L":
            for entry in self.holders.get((name, line), ()):
                entry[5] = True     # an added line of it ran: it is counted no more
        self.records.write("%s-%s-%d.json" % (kind, name, line), {
            "module": name, "path": self.modules[name].path, "line": line, "traced": how,
            "pid": os.getpid(), "t": time.time()})

    # ------------------------------------------------------------------ torch.compile (lines mode)

    def hook_dynamo(self, guards):
        """Be told the lines that TorchDynamo traces.

        Dynamo runs a frame it compiles (and every function it inlines) only
        symbolically: it steps through the bytecode without running it, so no
        LINE event fires, then or when the compiled code runs. It announces each
        line it steps to as TracingContext.set_current_loc(filename, line, name)
        (torch 2.0 to 2.11 at least); a wrapper of that static method records the
        added lines among them as traced. Dynamo pays one dict look-up per line it
        traces; nothing changes for code that runs."""
        if self.mode != "lines" or self.dynamo_hook is not None or not self.on:
            return
        try:
            context = getattr(guards, "TracingContext", None)
            original = vars(context).get("set_current_loc") if isinstance(context, type) else None
            if not isinstance(original, staticmethod):
                self.records.write("N-torch.json", {
                    "module": TORCH_GUARDS, "pid": os.getpid(), "t": time.time(),
                    "note": "torch has no TracingContext.set_current_loc: lines torch.compile traces are not told"})
                return
            real = original.__func__
            told = self.traced_line

            def set_current_loc(*args, **kwargs):
                told(args)
                return real(*args, **kwargs)

            set_current_loc.__wrapped__ = real
            ours = staticmethod(set_current_loc)
            context.set_current_loc = ours
            self.dynamo_hook = (context, original, ours)
        except Exception as exc:
            self.disable("hooking torch.compile's tracing: " + describe_error(exc))

    def unhook_dynamo(self):
        if self.dynamo_hook is not None:
            context, original, ours = self.dynamo_hook
            self.dynamo_hook = None
            if vars(context).get("set_current_loc") is ours:
                context.set_current_loc = original

    def traced_line(self, args):
        """TorchDynamo steps to line args[1] of file args[0]: record it as traced if it is an added line."""
        try:
            if not self.on or len(args) < 2:
                return
            entry = self.traced_files.get(args[0])
            if entry is None or args[1] not in entry[1]:
                return
            if ("L", entry[0], args[1]) not in self.done:     # it ran for real already: that says more
                self.record_line("T", entry[0], args[1], "torch.compile")
        except Exception as exc:
            self.disable("recording a traced line: " + describe_error(exc))

    # ------------------------------------------------------------------ functions mode

    def precompiled(self, watched, origin, module, real):
        """The module as the agent rewrote and compiled it, when this interpreter is the agent's
        exact build and the file is the one the agent read (same path, inode, size and mtime);
        else None, and the module is rewritten here (ast: about 14 ms a start on 3.11). Where the
        agent compiled only the functions that hold added lines ("splice"), they go into the code
        the real loader gives (its bytecode cache or the source compiled, as without the probe)."""
        done = watched.compiled
        if not done or origin != watched.expected:
            return None
        st = os.stat(origin)
        if [st.st_ino, st.st_size, st.st_mtime_ns] != list(done["stat"]):
            return None
        with open(os.path.join(self.home, done["file"]), "rb") as f:
            stamp, _, body = f.read().partition(b"\0")
        if stamp != repr((sys.version, sys.implementation.cache_tag)).encode("utf-8"):
            return None
        code = marshal.loads(body)
        if done.get("splice"):
            get_code = getattr(real, "get_code", None)
            whole = get_code(watched.name) if get_code is not None else None
            code = splice(whole, code) if whole is not None else None
            if code is None:
                return None
        return self.arm(watched.name, [tuple(entry) for entry in done["table"]], code, module)

    def rewrite(self, watched, source, filename, module):
        import ast      # only here: a start that finds the agent's compiled module (`precompiled`) pays no ast
        tree = ast.parse(source, filename)
        table = rewrite_tree(tree, watched.lines, () if watched.lines else self.sibling_names(watched))
        return self.arm(watched.name, table, compile(tree, filename, "exec", dont_inherit=True), module)

    def arm(self, name, table, code, module):
        """Give the rewritten module its guard list; returns its code."""
        def hit(k):
            self.unit_hit(name, k)

        # TorchDynamo calls a function so marked while it traces and keeps only its result
        # (None): the guard costs the compiled graph nothing, no graph break, and unit_hit runs
        # once per trace and knows it is traced. Unmarked, Dynamo would inline it, and fail:
        # it imports the module named by the function's globals, which is no module.
        hit._dynamo_marked_constant = True
        guards = [hit] + [True] * len(table)
        self.units[name] = table
        self.guards[name] = guards
        module.__dict__[PROBE_NAME] = guards
        return code

    def unit_hit(self, name, k):
        """Guard k of module `name` fired: a body started ("S", "C": counted) or a statement that
        holds added lines did ("L": they ran, recorded once)."""
        try:
            kind, qual, first, lines, start_k = self.units[name][k - 1]
            if kind != "L":
                self.count_hit(name, k)
                return
            if ("F", name, k) in self.done:
                return      # ran already, its flag kept set for a compiled graph: the cheapest way out
            guards = self.guards[name]
            how = traced_now()
            if how:
                self.traced_units.add((name, k))
            elif (name, k) not in self.traced_units:
                guards[k] = False   # later calls pay one list look-up
            # else the flag stays set: torch.compile's graph guards on its value, and would be
            # recompiled (once per graph) if it changed; later eager calls pay a call and a set look-up
            kind = "T" if how else "F"
            key = (kind, name, k)
            if key in self.done:
                return
            self.done.add(key)
            if not how:     # an added line of its body ran: the body is counted no more
                self.stopped.add((name, start_k))
                if (name, start_k) not in self.traced_units:
                    guards[start_k] = False
            self.records.write("%s-%s-%d.json" % (kind, name, k), {
                "module": name, "path": self.modules[name].path, "unit": qual, "first_line": first,
                "lines": lines, "traced": how, "pid": os.getpid(), "t": time.time()})
        except Exception as exc:
            self.disable("recording a call: " + describe_error(exc))

    def count_hit(self, name, k):
        """A counted body started (functions mode): a sibling's function (its guard stays set until
        COUNT_CAP), or a body that holds added lines, until one of them ran. A start that
        torch.compile traces is no run: not counted, and its flag then stays set for the graph."""
        if (name, k) in self.stopped:
            return
        _, qual, first, lines, _ = self.units[name][k - 1]
        if lines and traced_now():
            self.traced_units.add((name, k))
            return
        n = self.counts.get((name, qual), 0) + 1
        self.counts[(name, qual)] = n
        if count_due(n):
            self.record_count(name, qual, lines, first, n)
        if n >= COUNT_CAP:
            self.stopped.add((name, k))
            self.guards[name][k] = False


def boot(probe_file):
    """Start the probe of this process from the plan beside `probe_file`; never raises."""
    probe = None
    try:
        # site may read the same .pth twice (a venv's lib64 -> lib link, a sitecustomize
        # calling addsitedir): one probe per process
        if any(getattr(finder, "fleetpatch_probe", False) is True for finder in sys.meta_path):
            return None
        probe = Probe(os.path.dirname(os.path.abspath(probe_file)))
        probe.start()
    except Exception as exc:
        if probe is not None:
            probe.disable("starting: " + describe_error(exc))
    return probe


if globals().get("__fleetpatch_probe_boot__"):
    boot(__file__)
