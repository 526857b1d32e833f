"""Which lines of a patched file the agent must rewrite for functions mode (the laptop's side).

Functions mode runs a watched module rewritten with its guards. The agent used to parse the
whole module, put the guards in and compile the tree: 6-8 ms of CPU per 1000-line module on
every host, at a patch's first deploy (3.11), most of it for code the server compiles anyway. The
guards only ever go into the functions that hold added lines, so the laptop, which has the bytes
every host will hold, works out once per rollout the lines those functions span (with the headers
of the classes around them, and the module's __future__ imports); the agent parses, rewrites and
compiles only those lines (install.spliced_module), and the server's start puts the rewritten
functions in place of the plain ones in the module it compiles or loads as it would without the
probe (guards.splice).

`keep_ranges` answers None wherever that is not exactly the full rewrite (an added line outside
a function, a function inside an `if` or a `try`, a coding cookie), and the agent rewrites the
whole module, as before. `hint` and `keep_ranges` are pure (bytes, or the tree parsed from them,
and line numbers in; line ranges out); `Hints` keeps their answers for one run, and across runs in a HintStore (probe/hintstore.py).
"""
from __future__ import annotations

import hashlib
import re
import threading

from .guards import holder_names_in, stmt_first, sub_bodies

COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def hint(source: bytes, lines) -> dict | None:
    """The `splice` field of a watched module's plan entry: {"sha256", "keep": [[first, last], ...],
    "imports", "holders"}, or None where the agent must rewrite the whole module. `holders` names the
    functions that hold the added lines: the functions its sibling counts (install.sibling_counts),
    which the agent otherwise finds by parsing this file again."""
    lines = tuple(sorted({int(n) for n in lines}))
    if not lines or other_encoding(source):
        return None
    import ast     # here: a run whose probe watches no file never needs it
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):   # the agent's build may read it; it rewrites the whole module then
        return None
    found = keep_ranges(tree, lines)
    if found is None:
        return None
    keep, imports = found
    return {"sha256": hashlib.sha256(source).hexdigest(), "keep": keep, "imports": imports,
            "holders": sorted(holder_names_in(tree, lines))}


class Hints:
    """`hint`, once per distinct (bytes, lines) in a run, shared by its host threads: the hosts of a
    fleet mostly get the same bytes, and the first thread to ask works the hint out (two files
    parsed, about 20 ms) while the others that ask for the same wait for it, not parse them too.
    With a `store` (probe/hintstore.HintStore), an answer kept by an earlier run is taken from it."""

    def __init__(self, most: int = 64, store=None):
        self.most = most    # distinct (bytes, lines) kept; the oldest go all at once beyond it
        self.store = store
        self._done: dict = {}
        self._locks: dict = {}
        self._lock = threading.Lock()

    def get(self, source: bytes, lines) -> dict | None:
        key = (hashlib.sha256(source).digest(), tuple(sorted({int(n) for n in lines})))
        with self._lock:
            if key in self._done:
                return self._done[key]
            one = self._locks.setdefault(key, threading.Lock())
        with one:
            with self._lock:
                if key in self._done:
                    return self._done[key]
            found = self._work_out(source, key)
            with self._lock:
                if len(self._done) >= self.most:
                    self._done.clear()
                self._done[key] = found
                self._locks.pop(key, None)
        return found


    def _work_out(self, source: bytes, key: tuple) -> dict | None:
        if self.store is None:
            return hint(source, key[1])
        kept, found = self.store.get(*key)
        if not kept:
            found = hint(source, key[1])
            self.store.put(*key, found)
        return found


def other_encoding(source: bytes) -> bool:
    """Whether a coding line (the first two) declares another encoding than UTF-8."""
    for line in source.splitlines()[:2]:
        cookie = COOKIE.match(line)
        if cookie and not cookie.group(1).lower().replace(b"_", b"-").startswith(b"utf-8"):
            return True
    return False


def keep_ranges(tree, lines: tuple) -> tuple | None:
    """([[first, last], ...], [names]): the lines to keep (1-based, inclusive, sorted, disjoint): every
    function that holds an added line, whole, from its first decorator, and the header lines of each
    class around it; and the names the module binds by an import (the 3.11+ compiler calls a method
    of such a name with LOAD_ATTR, of any other with LOAD_METHOD: the kept lines are compiled with
    them bound the same way). None where an added line is not inside a function that sits in the
    module or in classes only. `tree`: the module parsed, `lines`: sorted."""
    import ast
    ranges, covered = [], set()
    todo = [(tree.body, [])]
    while todo:
        body, headers = todo.pop()
        for stmt in body:
            first, last = stmt_first(stmt), stmt.end_lineno
            if not any(first <= n <= last for n in lines):
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ranges += headers + [[first, last]]
                covered |= {n for n in lines if first <= n <= last}
            elif isinstance(stmt, ast.ClassDef) and stmt.body and stmt_first(stmt.body[0]) > stmt.lineno:
                todo.append((stmt.body, headers + [[first, stmt_first(stmt.body[0]) - 1]]))
    if covered != set(lines):
        return None
    # the module's __future__ imports, which change how its functions compile; first in the copy too
    ranges += [[stmt.lineno, stmt.end_lineno] for stmt in tree.body
               if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"]
    imports = set()
    todo = [tree.body]
    while todo:     # the module's own scope: its statements, and those of its if/try/with/for blocks
        for stmt in todo.pop():
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                imports |= {(a.asname or a.name.split(".")[0]) for a in stmt.names if a.name != "*"}
            elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo.extend(sub_bodies(stmt))
    merged: list = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return merged, sorted(imports)
