"""Functions mode on a patch's first deploy: the laptop says which lines hold the functions with
added lines (probe/splice.py), and the agent rewrites only those, in a module it compiles as it is
(install.spliced_module). What the server then runs must be exactly the whole module rewritten:
the same code objects and the same guard table, on the real SGLang files of the wheels."""
from __future__ import annotations

import ast
import builtins
import hashlib

import pytest

from fleetpatch.probe import install as probe_install
from fleetpatch.probe import splice
from fleetpatch_demo.wheels import sglang_tree


@pytest.fixture(scope="module")
def runtime():
    found = {"__file__": "runtime.py", "__builtins__": builtins}
    exec(compile(probe_install.runtime_source(), "runtime.py", "exec"), found)
    return found


def rewritten_whole(runtime, source: bytes, path: str, lines):
    tree = ast.parse(source, path)
    table = runtime["rewrite_tree"](tree, frozenset(lines), ())
    return compile(tree, path, "exec", dont_inherit=True), [list(t) for t in table]


def rewritten_spliced(runtime, source: bytes, path: str, lines, hint):
    spec = {"expected": path, "lines": sorted(lines), "splice": hint}
    done = probe_install.spliced_module(runtime, spec, (source, None))
    return None if done is None else (done[0], [list(t) for t in done[1]])


def body_lines(source: bytes):
    """Per function that sits in the module or in classes only, a line of its body."""
    out = []
    todo = [ast.parse(source).body]
    while todo:
        for stmt in todo.pop():
            if isinstance(stmt, ast.ClassDef):
                todo.append(stmt.body)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(stmt.body[len(stmt.body) // 2].lineno)
    return out


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_spliced_module_is_the_whole_module_rewritten_on_real_sglang_files(runtime, version):
    tree = sglang_tree(version)
    checked = 0
    for path in sorted((tree / "sglang" / "srt" / "speculative").glob("*.py")):
        source = path.read_bytes()
        lines = body_lines(source)
        # one function at a time, and three of them at once (another class's among them)
        for chosen in [[n] for n in lines[::5]] + [lines[1::max(1, len(lines) // 3)][:3]]:
            if not chosen:
                continue
            hint = splice.hint(source, chosen)
            assert hint is not None, (path.name, chosen)
            spliced = rewritten_spliced(runtime, source, str(path), chosen, hint)
            assert spliced == rewritten_whole(runtime, source, str(path), chosen), (path.name, chosen)
            checked += 1
    assert checked > 40


def test_the_imports_of_the_module_are_bound_as_in_it(runtime):
    # 3.11+ calls `mod.f()` of an imported name with LOAD_ATTR, of any other with LOAD_METHOD
    source = (b"import os\ntry:\n    import json as j\nexcept ImportError:\n    j = None\n\n\n"
              b"class A:\n    def f(self):\n        x = os.path.join('a', 'b')\n        return j.dumps(x)\n")
    hint = splice.hint(source, [11])
    assert hint["imports"] == ["j", "os"] and hint["keep"] == [[8, 11]]
    assert rewritten_spliced(runtime, source, "m.py", [11], hint) == rewritten_whole(runtime, source, "m.py", [11])


@pytest.mark.parametrize("source, line", [
    (b"import os\nX = 1\n\n\ndef f():\n    return X\n", 2),                        # a module-level line
    (b"class A:\n    x = 1\n    y = 2\n\n    def f(self):\n        return 1\n", 3),  # a class-level line
    (b"import sys\nif sys.version_info > (3,):\n    def f():\n        return 1\n", 4),  # a def inside an `if`
    (b"# -*- coding: latin-1 -*-\ndef f():\n    return '\xe9'\n", 3),               # another encoding
    (b"def f(:\n    return 1\n", 2),                                                 # not Python here
])
def test_where_only_the_whole_rewrite_is_exact_the_laptop_gives_no_hint(source, line):
    assert splice.hint(source, [line]) is None


def test_a_hint_for_other_bytes_is_not_used_and_the_whole_module_is_rewritten(runtime, tmp_path):
    source = b"def hot(x):\n    y = x + 1\n    return y\n"
    hint = splice.hint(source + b"# another revision\n", [2])
    assert hint["sha256"] != hashlib.sha256(source).hexdigest()
    assert rewritten_spliced(runtime, source, "m.py", [2], hint) is None
    path = tmp_path / "m.py"
    path.write_bytes(source)
    spec = {"expected": str(path), "lines": [2], "splice": hint}
    done = probe_install.compile_module(runtime, "m", spec, str(tmp_path), {}, {})
    assert done["table"] == rewritten_whole(runtime, source, str(path), [2])[1]
