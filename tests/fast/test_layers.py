"""The house rules a maintainer relies on: the core never reaches into the demo,
no module imports one above it, no function grows past 70 lines nor takes more
than 8 parameters, no module past 800 lines, and the agent's modules are sent
in an order in which each comes after what it imports."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

SRC = REPO / "src"
CORE = SRC / "fleetpatch"

# Lower layers first: a module may import only modules of its own or a lower layer.
LAYERS = [
    {"errors", "redact", "textsafe", "outputgone", "cacheroot", "protocol", "agentboot", "dialer", "knownhosts",
     "probe"},
    {"engines", "diffapply", "inventory", "router"},
    {"patchset", "patchrecord", "evidence", "agent", "ssh_errors", "lockview"},
    {"remote", "transport_local", "hostcalls", "router_via"},
    {"drain", "dials"},
    {"steps"},
    {"bake"},
    {"rollout", "report"},
    {"cli_common"},
    {"cli_hosts", "cli_fleet"},
    {"cli", "__main__"},
]


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"fleetpatch.{name} is in no layer of tests/fast/test_layers.py: place it")




def internal_imports(path: Path) -> set[str]:
    """fleetpatch modules `path` imports, each by its first name below fleetpatch
    (a package such as engines/ or steps/ counts as one module)."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(CORE).parts) - 1   # 0: fleetpatch/x.py; 1: fleetpatch/pkg/x.py
    own = module_name(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").startswith("fleetpatch."):
                found.add(node.module.split(".")[1])
            elif node.level == 0 and node.module == "fleetpatch":   # from fleetpatch import x
                found.update(a.name for a in node.names)
            elif 0 < node.level <= depth:      # inside its own package
                found.add(own)
            elif node.level == depth + 1:      # from fleetpatch itself
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fleetpatch."):
                    found.add(a.name.split(".")[1])
    return found - {"__version__"}


def module_name(path: Path) -> str:
    """A module's first name below fleetpatch: a package's modules all count as the package."""
    return path.relative_to(CORE).parts[0].removesuffix(".py")


def core_modules():
    for path in sorted(CORE.rglob("*.py")):
        if path == CORE / "__init__.py":
            continue
        yield module_name(path), path


def test_no_module_imports_one_above_it():
    wrong = []
    for name, path in core_modules():
        for dep in internal_imports(path):
            if layer_of(dep) > layer_of(name):
                wrong.append(f"{path.relative_to(SRC)} imports {dep} (layer {layer_of(dep)} > {layer_of(name)})")
    assert not wrong, "\n".join(wrong)


def test_the_core_never_imports_the_demo():
    offenders = [str(p.relative_to(SRC)) for _, p in core_modules()
                 if "fleetpatch_demo" in p.read_text() and p.name != "cli_fleet.py"]
    assert not offenders
    # cli_fleet loads the demo inside the demo command only: importing the CLI leaves it out
    code = "import sys, fleetpatch.cli; print(any(m.startswith('fleetpatch_demo') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_no_function_of_the_core_is_longer_than_70_lines():
    long = []
    for _, path in core_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n >= 70:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} {n} lines")
    assert not long, "\n".join(long)


def internals_layer_table(text: str) -> list[set[str]]:
    """docs/internals.md's layer table as LAYERS is written: one set of module names per row, in order.
    A row is `| N | `mod`, `mod` | job |`; only the second cell's backticked names count."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            rows.append((int(cells[0]), set(re.findall(r"`([^`]+)`", cells[1]))))
    assert [n for n, _ in rows] == list(range(len(rows))), \
        f"docs/internals.md: the layer rows must be numbered 0, 1, 2, ... in order; found {[n for n, _ in rows]}"
    return [mods for _, mods in rows]


def test_the_internals_layer_table_is_LAYERS():
    doc = SRC.parent / "docs" / "internals.md"
    table = internals_layer_table(doc.read_text())
    if table != LAYERS:
        want = "\n".join(f"| {i} | {', '.join(f'`{m}`' for m in sorted(layer))} | ... |"
                         for i, layer in enumerate(LAYERS))
        raise AssertionError(f"docs/internals.md's layer table differs from LAYERS in tests/fast/test_layers.py; "
                             f"its rows should read (modules in any order, job as it is):\n{want}")


# Functions of modules other helpers own that still take more than 8 parameters (to be cut).
MANY_PARAMS_KNOWN: set[str] = set()


def test_no_function_of_the_core_takes_more_than_8_parameters():
    """What a function needs travels in one object (steps.HostRun, a dataclass), not in a
    dozen arguments. Invoke tasks are exempt: their parameters are their flags."""
    many = []
    for _, path in core_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any(ast.unparse(d).split("(")[0] in ("command", "task") for d in node.decorator_list):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
            n = len([p for p in params if p.arg not in ("self", "cls")])
            if n > 8 and f"{path.name}:{node.name}" not in MANY_PARAMS_KNOWN:
                many.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} takes {n}")
    assert not many, "\n".join(many)


# Modules other helpers are splitting now (to be cut under 800 lines).
LONG_KNOWN: set[str] = set()


def test_no_module_of_the_core_is_over_800_lines():
    long = [f"{p.relative_to(SRC)} {n}" for _, p in core_modules()
            if (n := len(p.read_text().splitlines())) > 800 and str(p.relative_to(CORE)) not in LONG_KNOWN]
    assert not long, "\n".join(long)


def agent_sibling_imports(path: Path) -> set[str]:
    """The agent modules `path` imports (`from . import x`, `from .x import y`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
    return found


def test_the_agent_is_sent_whole_and_each_module_after_what_it_imports():
    """agentboot loads the agent's modules on a host in agent.MODULES order, with no files
    to import from: a module imported before it is loaded would fail there."""
    from fleetpatch.agent import ENTRY, MODULES

    files = {p.stem for p in (CORE / "agent").glob("*.py")} - {"__init__"}
    assert set(MODULES) == files and len(MODULES) == len(files), "every agent module is sent, once"
    assert MODULES[-1] == ENTRY
    for i, name in enumerate(MODULES):
        later = agent_sibling_imports(CORE / "agent" / f"{name}.py") - set(MODULES[:i])
        assert not later, f"agent/{name}.py imports {sorted(later)}, sent after it: reorder agent.MODULES"


def test_the_agent_keeps_no_state_in_its_modules():
    """All of the agent's state is the AgentState of its session: no `global`, and a
    module binds only constants (tuples, strings, numbers, read-only mappings)."""
    wrong = []
    for path in sorted((CORE / "agent").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                wrong.append(f"{path.name}:{node.lineno} {type(node).__name__.lower()} {', '.join(node.names)}")
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                mutable = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
                is_call = isinstance(node.value, ast.Call) and ast.unparse(node.value.func) != "types.MappingProxyType"
                if isinstance(node.value, mutable) or is_call:
                    wrong.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:60]}")
    assert not wrong, "\n".join(wrong)
