"""Functions mode on a patch's first deploy: the laptop says which lines hold the functions with
added lines (probe/splice.py), and the agent rewrites only those, in a module it compiles as it is
(install.spliced_module). What the server then runs must be exactly the whole module rewritten:
the same code objects and the same guard table, on the real SGLang files of the wheels."""
from __future__ import annotations

import ast
import builtins
import hashlib
import json
import marshal

import pytest

from fleetpatch.probe import install as probe_install
from fleetpatch.probe import splice
from fleetpatch_demo.wheels import sglang_tree
from support.probed_start import probed_start


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
    """What a server start runs: the module as compiled without the probe, the agent's functions in."""
    spec = {"expected": path, "lines": sorted(lines), "splice": hint}
    done = probe_install.spliced_module(runtime, spec, (source, None))
    if done is None:
        return None
    code = runtime["splice"](compile(source, path, "exec", dont_inherit=True), done[0])
    return None if code is None else (code, [list(t) for t in done[1]])


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
    assert "splice" not in done and done["table"] == rewritten_whole(runtime, source, str(path), [2])[1]


def test_a_module_with_future_annotations_keeps_them(runtime):
    source = (b'"""Doc."""\nfrom __future__ import annotations\n\nimport typing\n\n\n'
              b"class A:\n    def f(self, x: Undefined) -> typing.List[int]:\n        return [x]\n")
    hint = splice.hint(source, [9])
    assert [2, 2] in hint["keep"]
    assert rewritten_spliced(runtime, source, "m.py", [9], hint) == rewritten_whole(runtime, source, "m.py", [9])


MODULE = (b"import os\n\n\nclass Worker:\n    def hot(self, x):\n        y = os.path.basename(x)\n"
          b"        return y + '!'\n\n    def cold(self):\n        return 0\n")


def test_a_server_start_runs_the_module_it_compiles_itself_with_the_agents_functions_in(tmp_path):
    """The agent wrote only the rewritten functions; the start compiles the module as without the
    probe (and writes its bytecode cache, as without the probe), puts them in, and needs no `ast`."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "site").mkdir()
    module = tmp_path / "mods" / "fp_splice_probed.py"
    module.write_bytes(MODULE)
    plan = {"version": 1, "mode": "functions",
            "modules": {"fp_splice_probed": {"path": "fp_splice_probed.py", "lines": [6],
                                             "expected": str(module), "splice": splice.hint(MODULE, [6])}}}
    probe_install.install(str(tmp_path / "site"), str(tmp_path / "probe"), "tok", plan)
    ready = marshal.loads((tmp_path / "probe" / probe_install.PROBE_PLAN_NAME).read_bytes())
    assert ready["modules"]["fp_splice_probed"]["compiled"]["splice"] is True
    out = probed_start(tmp_path, "import fp_splice_probed as m\n"
                                 "print(m.Worker().hot('/a/b'), m.Worker().cold(), 'ast' in sys.modules)\n",
                       write_bytecode=True)
    assert out.split() == ["b!", "0", "False"]
    records = probe_install.read_records(str(tmp_path / "probe"))
    ran = set()
    for name, data in records.items():
        if name.split("/", 1)[1].startswith("F-"):
            ran |= set(json.loads(data)["lines"])
    assert ran == {6}, sorted(records)
    assert list((tmp_path / "mods" / "__pycache__").glob("fp_splice_probed.*.pyc"))


def test_a_run_works_out_each_files_hint_once_while_its_hosts_ask_at_once(monkeypatch):
    """The hosts' threads ask for the same bytes at about the same time: one parses, the rest wait
    for its answer (each would have parsed the same files), and other bytes get their own."""
    import threading
    import time

    calls = []
    real = splice.hint

    def counted(source, lines):
        calls.append(source)
        time.sleep(0.05)    # long enough for every thread to be waiting
        return real(source, lines)

    monkeypatch.setattr(splice, "hint", counted)
    hints = splice.Hints()
    source = b"def hot(x):\n    y = x + 1\n    return y\n"
    got = []
    together = threading.Barrier(8)     # all 8 ask at once: without the wait, each would parse

    def ask():
        together.wait()
        got.append(hints.get(source, [2]))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(g == real(source, [2]) for g in got)
    assert hints.get(source + b"# other\n", [2])["sha256"] != got[0]["sha256"] and len(calls) == 2


def test_the_next_run_takes_the_hint_this_laptop_worked_out_before(tmp_path, monkeypatch):
    """A rollout after the first parses nothing for the same bytes and lines: the answer is kept
    on the laptop (probe/hintstore.py), and is the same answer."""
    from fleetpatch.probe.hintstore import HintStore
    calls = []
    real = splice.hint
    monkeypatch.setattr(splice, "hint", lambda source, lines: calls.append(1) or real(source, lines))
    source = b"def hot(x):\n    y = x + 1\n    return y\n\nx = 1\n"
    first = splice.Hints(store=HintStore(tmp_path / "hints")).get(source, [2])
    again = splice.Hints(store=HintStore(tmp_path / "hints")).get(source, [2])
    assert first == again == real(source, [2]) and len(calls) == 1
    # no splice for an added line outside a function: that answer is kept too
    assert splice.Hints(store=HintStore(tmp_path / "hints")).get(source, [5]) is None
    assert splice.Hints(store=HintStore(tmp_path / "hints")).get(source, [5]) is None and len(calls) == 2
    # other lines, other bytes: worked out afresh
    assert splice.Hints(store=HintStore(tmp_path / "hints")).get(source, [3]) == real(source, [3])
    assert len(calls) == 3


def test_a_kept_hint_that_does_not_fit_its_bytes_is_worked_out_again(tmp_path, monkeypatch):
    """Torn, edited or planted entries are never sent to a host: anything but a well-formed hint for
    these bytes holding every added line is ignored and rewritten."""
    from fleetpatch.probe.hintstore import HintStore
    store = HintStore(tmp_path / "hints")
    source = b"import os\n\n\ndef hot(x):\n    y = x + 1\n    return y\n"
    right = splice.Hints(store=store).get(source, [5])
    entry = next((tmp_path / "hints").glob("*.json"))
    for bad in ("{", json.dumps({"hint": dict(right, sha256="0" * 64)}),
                json.dumps({"hint": dict(right, keep=[[1, 2]])}),          # does not hold line 5
                json.dumps({"hint": dict(right, keep=[[4, "6"]])}),
                json.dumps({"hint": dict(right, imports=[1])}), json.dumps([right])):
        entry.write_text(bad)
        assert splice.Hints(store=store).get(source, [5]) == right
        assert json.loads(entry.read_text()) == {"hint": right}


def test_a_cache_that_cannot_be_written_costs_the_parse_and_nothing_else(tmp_path):
    from fleetpatch.probe.hintstore import HintStore
    (tmp_path / "file").write_text("not a directory")
    source = b"def hot(x):\n    return x\n"
    assert splice.Hints(store=HintStore(tmp_path / "file" / "hints")).get(source, [2]) == splice.hint(source, [2])


SIBLING = b"class Worker:\n    def __init__(self):\n        self.n = 0\n\n    def hot(self, x):\n        return x\n"


def test_the_sibling_counts_what_the_hint_names_and_the_patched_file_is_not_parsed_again(tmp_path, monkeypatch):
    """A sibling without added lines counts the calls of the functions that hold its twin's added
    lines. The laptop's hint names them (`holders`) for the bytes it sent: the agent takes them and
    does not parse the patched file again. A hint for other bytes than the host's is not taken."""
    (tmp_path / "mods").mkdir()
    patched, sibling = tmp_path / "mods" / "fp_w1.py", tmp_path / "mods" / "fp_w2.py"
    patched.write_bytes(MODULE)
    sibling.write_bytes(SIBLING)
    hint = splice.hint(MODULE, [6])
    assert hint["holders"] == ["hot"]
    plan = {"version": 1, "mode": "functions", "modules": {
        "fp_w1": {"path": "fp_w1.py", "lines": [6], "expected": str(patched), "twins": ["fp_w2.py"], "splice": hint},
        "fp_w2": {"path": "fp_w2.py", "lines": [], "expected": str(sibling), "twins": ["fp_w1.py"]}}}
    runtime_code = compile(probe_install.runtime_source(), "runtime.py", "exec")
    parsed = []
    real = probe_install.parse_file
    monkeypatch.setattr(probe_install, "parse_file", lambda path, *a: parsed.append(path) or real(path, *a))

    (tmp_path / "probe").mkdir()
    ready = probe_install.probe_plan(plan, str(tmp_path / "probe"), runtime_code)
    assert ready["modules"]["fp_w2"]["counted"] == ["hot"]
    assert str(patched) not in parsed, parsed

    # the host holds other bytes than the hint was made for: its file is parsed, and says what it holds
    patched.write_bytes(MODULE.replace(b"    def hot(self, x):", b"    def warm(self, x):"))
    (tmp_path / "probe2").mkdir()
    ready = probe_install.probe_plan(plan, str(tmp_path / "probe2"), runtime_code)
    assert ready["modules"]["fp_w2"]["counted"] == ["warm"]
    assert str(patched) in parsed


def test_the_hints_holders_are_the_functions_the_agent_would_find(tmp_path):
    """On the real SGLang workers: a sibling counts the same functions whether the agent takes the
    laptop's names or parses the patched file itself."""
    tree = sglang_tree("0.5.9") / "sglang" / "srt" / "speculative"
    runtime_code = compile(probe_install.runtime_source(), "runtime.py", "exec")
    checked = 0
    for patched, sibling in [("eagle_worker.py", "eagle_worker_v2.py"), ("eagle_worker_v2.py", "eagle_worker.py")]:
        source = (tree / patched).read_bytes()
        for chosen in [[n] for n in body_lines(source)[::3]]:
            hint = splice.hint(source, chosen)
            counted = []
            for given in (hint, {k: v for k, v in hint.items() if k != "holders"}):
                plan = {"version": 1, "mode": "functions", "modules": {
                    "w1": {"path": patched, "lines": chosen, "expected": str(tree / patched),
                           "twins": [sibling], "splice": given},
                    "w2": {"path": sibling, "lines": [], "expected": str(tree / sibling), "twins": [patched]}}}
                folder = tmp_path / f"probe-{checked}-{len(counted)}"
                folder.mkdir()
                counted.append(probe_install.probe_plan(plan, str(folder), runtime_code)["modules"]["w2"]["counted"])
            assert counted[0] == counted[1] == hint["holders"] != [], (patched, chosen, counted)
            checked += 1
    assert checked >= 10
