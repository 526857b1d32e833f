"""vLLM's log format, per release, and the log lines the stand-in writes, each QUOTED from the
host's own vLLM files (``Quoter``): the stand-in never invents a vLLM line.

The format is vllm/logger.py's ``%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s``
(date ``%m-%d %H:%M:%S``) behind the process prefix ``(<process name> pid=N) ``:

* 0.33+: the prefix is part of _FORMAT (``%(vllm_process_name)s``), on every process's lines;
* 0.11 - 0.32: written by ``decorate_logs`` on the process's output, plain when not a terminal;
* 0.10.x: the same, with colour codes (cyan, reset) even when not on a terminal.

A multi-line message repeats the header on each line (vLLM's NewLineFormatter).  uvicorn's own
lines (``INFO:     Application startup complete.``) have uvicorn's format.

Stdlib only; Python 3.8+.
"""
import ast
import logging
import os
import sys
import time

CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"     # vllm/utils decorate_logs (0.10.x): _add_prefix's colours


class Quoter(object):
    """Reads string literals from the host's vLLM files: ``quote(source, needle)`` is the literal in
    ``site/source`` that contains ``needle`` and the line of the statement that uses it."""

    def __init__(self, site_dir):
        self.site_dir = site_dir
        self._trees = {}

    def path(self, source):
        return os.path.join(self.site_dir, source)

    def tree(self, source):
        if source not in self._trees:
            try:
                with open(self.path(source), encoding="utf-8") as f:
                    self._trees[source] = ast.parse(f.read())
            except (OSError, SyntaxError, ValueError):
                self._trees[source] = None
        return self._trees[source]

    def quote(self, source, needle, near=None):
        """(text, line) of the literal holding `needle` (the one nearest line `near`), or None."""
        tree = self.tree(source)
        if tree is None:
            return None
        hits = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Call, ast.Assign, ast.AugAssign)):
                for arg in (node.args if isinstance(node, ast.Call) else [node.value]):
                    text = _literal(arg)
                    if text is not None and needle in text:
                        hits.append((text, node.lineno))
        if not hits:     # a default argument (monitor.py's `message: str = "..."`), a class attribute, ...
            hits = [(n.value, n.lineno) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and needle in n.value]
        if not hits:
            return None
        return min(hits, key=lambda h: abs(h[1] - near)) if near else hits[0]

    def template(self, source, needle):
        """The string.Template literal of the function that also holds `needle` (the start-up logo)."""
        tree = self.tree(source)
        for fn in ast.walk(tree) if tree is not None else ():
            if not isinstance(fn, ast.FunctionDef):
                continue
            if not any(_literal(n) is not None and needle in _literal(n) for n in ast.walk(fn)):
                continue
            calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
            logged = [c.lineno for c in calls if getattr(c.func, "attr", "") == "info"]
            for call in calls:
                if getattr(call.func, "id", getattr(call.func, "attr", "")) == "Template":
                    text = _literal(call.args[0]) if call.args else None
                    if text is not None:
                        return text, (logged[0] if logged else call.lineno)
        return None


def call_line(quoter, source, function, attr):
    """The line of the first `.attr(...)` call inside `function` of the host's `source`."""
    tree = quoter.tree(source)
    for fn in ast.walk(tree) if tree is not None else ():
        if isinstance(fn, ast.FunctionDef) and fn.name == function:
            lines = [c.lineno for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == attr]
            if lines:
                return min(lines)
    return None


def _literal(node):
    """A str constant, or an implicit/explicit concatenation of them; an f-string with "%s" for
    each value it formats (the caller fills them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "%s" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return a + b if a is not None and b is not None else None
    return None


class VllmFormatter(logging.Formatter):
    """vLLM's format for one process; `style` is "format" (0.33+), "plain" or "colour" (prefix)."""

    def __init__(self, style, process_name):
        logging.Formatter.__init__(self)
        self.style, self.process_name = style, process_name

    def format(self, record):
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(record.created))
        if self.process_name is None:        # a process that does not decorate its output
            prefix = ""
        else:
            name = "(%s pid=%d)" % (self.process_name, os.getpid())
            prefix = (CYAN + name + RESET if self.style == "colour" else name) + " "
        header = "%s%s %s [%s:%d] " % (prefix, record.levelname, stamp, os.path.basename(record.pathname or "?"),
                                        record.lineno)
        msg = record.getMessage()
        if record.exc_info:
            msg = msg + "\n" + self.formatException(record.exc_info)
        return header + msg.replace("\n", "\n" + header)


def prefix_style(version, logger_source):
    if "vllm_process_name" in (logger_source or ""):
        return "format"
    return "colour" if version < (0, 11) else "plain"


class Log(object):
    """The process's vLLM logger: real code's ``init_logger`` loggers and the quoted lines both
    write here, to stdout (vLLM's VLLM_LOGGING_STREAM default)."""

    def __init__(self, quoter, style, process_name):
        self.quoter = quoter
        self.handler = logging.StreamHandler(sys.stdout)
        self.handler.setFormatter(VllmFormatter(style, process_name))
        root = logging.getLogger("vllm")
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(self.handler)
        root.setLevel(logging.DEBUG if os.environ.get("VLLM_LOGGING_LEVEL") == "DEBUG" else logging.INFO)
        root.propagate = False
        self.root = root

    def rename(self, process_name):
        self.handler.setFormatter(VllmFormatter(self.handler.formatter.style, process_name))

    def emit(self, level, source, line, msg, *args):
        """One line as the host's `source` file logs it at `line`."""
        record = logging.LogRecord("vllm." + source.replace("/", ".")[:-3], level, self.quoter.path(source),
                                   line, msg, args or None, None)
        if record.levelno >= self.root.level:
            self.handler.handle(record)
            self.handler.flush()

    def quoted(self, level, source, needle, *args, **kw):
        """Log the host file's literal that holds `needle`; False (nothing logged) if it has none."""
        hit = self.quoter.quote(source, needle, kw.get("near"))
        if hit is None:
            return False
        self.emit(level, source, hit[1], hit[0], *args)
        return True


def uvicorn(text):
    """uvicorn's default log format (``INFO:     ...``), on stderr as uvicorn writes it."""
    sys.stderr.write("INFO:     %s\n" % text)
    sys.stderr.flush()


class VllmLogger(logging.Logger):
    """vLLM's logger class: ``info_once`` / ``warning_once`` / ``debug_once`` as vllm/logger.py adds."""

    def _once(self, level, msg, *args, **kwargs):
        seen = self.__dict__.setdefault("_seen_once", set())
        key = (level, msg, args)
        if key in seen:
            return
        seen.add(key)
        kwargs.setdefault("stacklevel", 3)
        kwargs.pop("scope", None)
        self.log(level, msg, *args, **kwargs)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs):
        self._once(logging.DEBUG, msg, *args, **kwargs)


def init_logger(name):
    """vllm.logger.init_logger for the real drafter files."""
    manager = logging.Logger.manager
    old = manager.loggerClass
    manager.setLoggerClass(VllmLogger)
    try:
        logger = logging.getLogger(name if name.startswith("vllm") else "vllm." + name)
    finally:
        manager.setLoggerClass(old) if old else None
    return logger
