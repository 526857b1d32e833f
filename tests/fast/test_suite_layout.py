"""The test suite's own layout: every test module is in a tier's folder, and what tests
share comes from tests/support (helpers) or a conftest.py (fixtures), never from
importing `conftest` or another test module (which breaks when either one moves)."""
from __future__ import annotations

import ast
from pathlib import Path

from support.paths import TESTS

TIERS = ("fast", "fleet", "e2e")


def modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module name) of each import in `path`; a relative import is '.'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." if node.level else (node.module or "").split(".")[0]))
    return found


def test_every_test_module_is_in_a_tier_folder():
    stray = [str(p.relative_to(TESTS)) for p in modules()
             if p.name.startswith("test_") and p.relative_to(TESTS).parts[0] not in TIERS]
    assert not stray, (f"test modules outside the tiers {TIERS} (move each into tests/fast if it needs "
                       f"neither sshd nor root, else tests/fleet, or tests/e2e): {stray}")


def test_no_module_imports_conftest_or_a_test_module():
    bad = [f"{p.relative_to(TESTS)}:{line} imports {name}" for p in modules()
           for line, name in imported_names(p) if name in ("conftest", ".") or name.startswith("test_")]
    assert not bad, "put what is shared in tests/support (a fixture: in a conftest.py):\n" + "\n".join(bad)


def test_test_module_names_are_unique_across_the_tiers():
    # pytest imports each test module by its bare name (tiers are not packages)
    names = [p.name for p in modules() if p.name.startswith("test_")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
