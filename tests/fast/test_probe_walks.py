"""The agent's cheaper walks around the probe (issue 34) find what the full walks found: the
scopes holding added lines (guards.scopes pruned to their spans) and a server's process tree
(the kernel's children lists instead of a scan of every process)."""
from __future__ import annotations

import ast
import asyncio
import email
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from fleetpatch.agent import probing
from fleetpatch.probe import guards

# real, large modules: the stdlib's own (nested classes, decorators, try/with/match blocks)
SOURCES = sorted(Path(asyncio.__file__).parent.glob("*.py")) + sorted(Path(email.__file__).parent.glob("*.py"))


def units_by_full_walk(tree, lines):
    """units_holding as it was before the pruning: every scope of the module, then the innermost."""
    every = guards.scopes(tree)
    held = {}
    for line in sorted(lines):
        inside = [s for s in every if s[2] <= line <= s[3]]
        if inside:
            best = max(inside, key=lambda s: s[2])
            held.setdefault(id(best[0]), (best, []))[1].append(line)
    return [(s[1], s[2], found) for s, found in held.values()]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name + "/" + p.name)
def test_the_pruned_walk_finds_the_units_the_full_walk_finds(path):
    source = path.read_bytes()
    count = source.count(b"\n") + 1
    rnd = random.Random(path.name)
    for size in (1, 3, 12, 60):
        lines = rnd.sample(range(1, count + 1), min(size, count))
        tree = ast.parse(source)
        found = [(qual, first, held) for _, qual, first, held in guards.units_holding(tree, lines)]
        assert found == units_by_full_walk(ast.parse(source), lines), (path, sorted(lines))


def test_the_sibling_walk_still_sees_every_function():
    source = Path(asyncio.__file__).with_name("base_events.py").read_bytes()
    names = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert {node.name for node, _, _ in guards.function_nodes(ast.parse(source), ())} == names


def test_a_servers_process_tree_is_read_from_its_own_children_lists():
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & sh -c 'sleep 30 & wait' & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(probing.children_scanned(tree.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        scanned = probing.children_scanned(tree.pid)
        assert len(scanned) == 3     # a sleep, a sh, and that sh's sleep
        if probing.children_listed(tree.pid) is None:
            pytest.skip("this kernel keeps no /proc/<pid>/task/<tid>/children")
        assert probing.children_of(tree.pid) == scanned
    finally:
        for pid in probing.children_scanned(tree.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        tree.kill()
        tree.wait()


def test_a_pid_that_is_gone_has_no_children():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert probing.children_listed(gone.pid) is None
    assert probing.children_of(gone.pid) == []
