"""The house rules a maintainer relies on: the core never reaches into the demo,
no module imports one above it, and no function grows past 70 lines."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

SRC = REPO / "src"
CORE = SRC / "fleetpatch"

# Lower layers first: a module may import only modules of its own or a lower layer.
LAYERS = [
    {"errors", "textsafe", "protocol", "agentboot", "dialer"},
    {"engines", "diffapply", "inventory", "router"},
    {"patchset", "evidence", "hostagent", "ssh_errors", "sshauth", "lockview"},
    {"remote", "transport_local", "hostcalls", "router_via"},
    {"drain"},
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
    """fleetpatch modules `path` imports (by their first name below fleetpatch)."""
    tree = ast.parse(path.read_text())
    in_engines = path.parent.name == "engines"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").startswith("fleetpatch."):
                found.add(node.module.split(".")[1])
            elif node.level == 1 and not in_engines:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
            elif node.level == 2 and node.module:   # from ..x inside engines/
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fleetpatch."):
                    found.add(a.name.split(".")[1])
    return found - {"__version__"}


def core_modules():
    for path in sorted(CORE.rglob("*.py")):
        name = "engines" if path.parent.name == "engines" else path.stem
        if name == "__init__":
            continue
        yield name, path


def test_no_module_imports_one_above_it():
    wrong = []
    for name, path in core_modules():
        for dep in internal_imports(path):
            if dep in ("engines",) and name == "engines":
                continue
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
