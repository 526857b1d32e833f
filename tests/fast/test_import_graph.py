"""The import graph of the core and of the stand-in servers, module by module: no cycle (a
function-level import counts: it only hides a cycle, it does not remove it) and no module
importing another module's private (_-prefixed) names. Imports under `if TYPE_CHECKING:`
never run and are left out. The stand-ins import their common package by the name it is
installed under on a host (fleetpatch_standin_common); the graph reads it as its source."""
from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO

CORE = REPO / "src" / "fleetpatch"
STANDINS = REPO / "src" / "fleetpatch_demo" / "standins"
# installed name -> source package
INSTALLED_AS = {"fleetpatch_standin_common": "fleetpatch_demo.standins.common"}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for root in (CORE, STANDINS) for p in sorted(root.rglob("*.py"))}


def source_name(module: str) -> str:
    for installed, source in INSTALLED_AS.items():
        if module == installed or module.startswith(installed + "."):
            return source + module[len(installed):]
    return module


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def base_of(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from X import ...` names."""
    if node.level == 0:
        return source_name(node.module or "")
    package = module if is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: str) -> list[tuple[str, str | None]]:
    """(imported fleetpatch module, the name taken from it or None) for every import of `module`,
    at any depth (function-level ones too). `from pkg import sub` is an import of pkg.sub."""
    tree = ast.parse(MODULES[module].read_text())
    skipped = type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(source_name(a.name), None) for a in node.names if source_name(a.name) in MODULES]
        elif isinstance(node, ast.ImportFrom):
            base = base_of(module, node)
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    found.append((f"{base}.{a.name}", None))
                elif base in MODULES:
                    found.append((base, a.name))
    return found


def import_graph() -> dict[str, set[str]]:
    # A submodule's import of its own package (its __init__) is no edge: Python has always
    # started the package before its submodule.
    return {m: {t for t, _ in imports_of(m) if t != m and not m.startswith(t + ".")} for m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports():
    """The check reads imports at any depth: a cycle behind a function-level import is found."""
    graph = import_graph()
    assert "fleetpatch.patchrecord" in graph["fleetpatch.steps.deploying"]   # imported inside deploy_record
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_sees_the_standins_and_their_common_package():
    graph = import_graph()
    assert "fleetpatch_demo.standins.common.stubs" in graph["fleetpatch_demo.standins.sglang.stubrules"]
    assert "fleetpatch_demo.standins.sglang.main" in graph["fleetpatch_demo.standins.sglang.__main__"]


def test_no_import_cycle_among_the_core_modules():
    found = cycles(import_graph())
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_module_imports_another_modules_private_names():
    private = [f"{MODULES[m].relative_to(REPO)} imports {name} from {target}"
               for m in MODULES for target, name in imports_of(m)
               if name and name.startswith("_") and not name.startswith("__") and target != m]
    assert not private, "\n".join(private)
