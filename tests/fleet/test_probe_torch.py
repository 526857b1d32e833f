"""The probe under real torch.compile (TorchDynamo), where an interpreter with torch exists.

Dynamo compiles a function by stepping through its bytecode without running
it, and the compiled code runs no line of it either: no LINE event fires and no
guard runs. The probe must record such lines as traced (never as never run),
must not make Dynamo break the graph or recompile, and must not change what is
computed. Runs with the interpreter named by $FLEETPATCH_TORCH_PYTHON (.ci/run sets it
to a venv of its own where a torch wheel for its Python is on the machine), else the
test venv /var/cache/fleetpatch-test/torch312 (`python3.12 -m venv` it and
`pip install torch`: the CPU runs of Dynamo need no GPU), else this Python if it
has torch; skipped where none has. The backend is a graph-counting one that
runs the graph as it is: what hides the lines is Dynamo, whatever the backend.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetpatch.probe import install as probe_install
from fleetpatch.probe.verdict import ONLY_TRACED, execution_block

TORCH_VENV_PYTHON = "/var/cache/fleetpatch-test/torch312/bin/python"

PATCHED = '''"""The patched module: what a server calls every decode step."""
import torch


def postprocess(logits, temperature):
    scaled = logits.float() / temperature  # added
    return torch.argmax(scaled, dim=-1)  # added
'''
ADDED = [n for n, line in enumerate(PATCHED.splitlines(), 1) if line.endswith("# added")]

SERVER = '''import json, shutil, site, sys
site.addsitedir(sys.argv[1])          # reads the probe's .pth, as site does at start
sys.path.insert(0, sys.argv[2])
import torch
import torch._dynamo.utils as dynamo_utils
import patched

graphs = []


def backend(gm, example_inputs):
    graphs.append(len(gm.graph.nodes))
    return gm.forward


def step(x):
    return patched.postprocess(x * 2, 0.7) + 1


compiled = torch.compile(step, backend=backend)
x = torch.randn(4, 8)
want = torch.argmax((x * 2).float() / 0.7, dim=-1) + 1
same = all(torch.equal(compiled(x), want) for _ in range(3))
shutil.copytree(sys.argv[3], sys.argv[4])    # the records once compiled, before any eager run
graphs_compiled = list(graphs)
same = same and torch.equal(step(x), want) and torch.equal(compiled(x), want)   # then eager, then compiled again
print(json.dumps({"same": same, "graphs_compiled": graphs_compiled, "graphs": graphs,
                  "graph_breaks": sum(dynamo_utils.counters["graph_break"].values()),
                  "python": list(sys.version_info[:2])}))
'''


def torch_python() -> str:
    candidates = [os.environ.get("FLEETPATCH_TORCH_PYTHON"), TORCH_VENV_PYTHON, sys.executable]
    for python in candidates:
        if python and Path(python).exists():
            done = subprocess.run([python, "-c", "import torch._dynamo"], capture_output=True, timeout=300)
            if done.returncode == 0:
                return python
    pytest.skip("no interpreter with torch here (set FLEETPATCH_TORCH_PYTHON, or make the venv %s)"
                % TORCH_VENV_PYTHON)


@pytest.fixture(scope="module")
def python():
    return torch_python()


def run_server(python, tmp_path, mode):
    """The server compiles, runs, then runs eagerly; returns its result and the execution blocks
    of the records as they were once compiled and at the end."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "patched.py").write_text(PATCHED)
    (tmp_path / "site").mkdir()
    (tmp_path / "server.py").write_text(SERVER)
    added = {"patched.py": ADDED}
    plan = probe_install.make_plan(added, str(tmp_path / "mods"), mode=mode)
    probe_install.install(str(tmp_path / "site"), str(tmp_path / "probe"), "torchtest", plan)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp_path),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([python, str(tmp_path / "server.py"), str(tmp_path / "site"), str(tmp_path / "mods"),
                           str(tmp_path / "probe" / "records"), str(tmp_path / "compiled" / "records")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    blocks = []
    for probe_dir in (tmp_path / "compiled", tmp_path / "probe"):
        files = probe_install.read_records(str(probe_dir))
        assert not any(name.endswith("/disabled") for name in files), files
        blocks.append((files, execution_block(files, plan, added)))
    return result, blocks


@pytest.mark.parametrize("mode", ["lines", "functions"])
def test_lines_torch_compile_traces_are_recorded_as_traced_with_no_graph_break_nor_recompile(python, tmp_path, mode):
    result, ((files, compiled), (_, after_eager)) = run_server(python, tmp_path, None if mode == "lines" else "functions")
    if mode == "lines" and result["python"] < [3, 12]:
        pytest.skip("lines mode needs Python 3.12+; the torch interpreter is %d.%d" % tuple(result["python"]))
    assert result["same"] is True                     # the probe changed nothing that is computed
    assert len(result["graphs_compiled"]) == 1 and result["graph_breaks"] == 0, result
    # once compiled: traced, not run, and not never run
    assert compiled["mode"] == mode
    assert compiled["ran"] == {}
    assert compiled["traced"] == {"patched.py": ADDED}
    assert compiled["not_run"] == {"patched.py": ONLY_TRACED}
    traced = [json.loads(v) for k, v in files.items() if k.split("/")[1].startswith("T-")]
    assert traced and {t["traced"] for t in traced} == {"torch.compile"}
    # the same function run eagerly: run; and what Dynamo compiled still holds (functions mode's flag stays set)
    assert result["graphs"] == result["graphs_compiled"], result
    assert after_eager["ran"] == {"patched.py": ADDED} and after_eager["traced"] == {}
    assert after_eager["not_run"] == {}
