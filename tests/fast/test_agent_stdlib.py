"""The code sent to hosts runs on the engine's own interpreter: stdlib only,
Python 3.8+. Checked on the sources exactly as `remote` sends them."""
from __future__ import annotations

import ast
import subprocess
import sys
import zlib

import pytest

from fleetpatch import protocol, remote

SENT = dict(remote.AGENT_SOURCES, protocol=remote.PROTOCOL_SOURCE, redact=remote.REDACT_SOURCE, agentboot=remote.BOOT_SOURCE)


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("name", sorted(SENT))
def test_the_sent_source_parses_as_python_3_8_and_imports_only_the_standard_library(name):
    source = zlib.decompress(SENT[name]).decode()
    tree = ast.parse(source, filename=name, feature_version=(3, 8))
    outside = imported_modules(tree) - set(sys.stdlib_module_names)
    # the agent's modules import each other and the protocol relatively (sent beside them)
    assert not outside, f"{name} imports {sorted(outside)}, which a host may not have"


def test_feature_version_really_refuses_newer_syntax():
    """The check above can fail: 3.10's match statement is not 3.8."""
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 8))


def test_the_agent_runs_with_no_fleetpatch_installed(tmp_path):
    """The bootstrap alone (what the SSH command line carries) runs the sent sources: a
    `probe` answers, from an interpreter that cannot import fleetpatch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True)
    python = str(tmp_path / "env" / "bin" / "python")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    req = {"op": "probe", "state_dir": str(tmp_path / "state"), "package": "json", "files": [], "content": False}
    proc = subprocess.run([python, "-c", remote.BOOTSTRAP], input=remote.agent_payload(req),
                          capture_output=True, env=env, timeout=60)
    lines = [remote.parse_reply(l) for l in proc.stdout.splitlines()]
    result = [l for l in lines if l and l.get("t") == "result"]
    assert result and result[-1]["ok"], proc.stderr.decode()
    assert result[-1]["result"]["ledger"] == protocol.empty_ledger()
    check = subprocess.run([python, "-c", "import fleetpatch"], capture_output=True, env=env)
    assert check.returncode != 0, "the test interpreter must not see fleetpatch"


def test_on_a_host_the_protocol_builds_plain_dicts_without_importing_typing():
    """Loaded as the agent loads it (a module named AGENT_MODULE_NAME), the protocol
    leaves `typing` unimported and its records are dicts that json writes as such."""
    probe = (
        "import json, sys, types, zlib\n"
        "src = zlib.decompress(sys.stdin.buffer.read())\n"
        f"m = types.ModuleType({protocol.AGENT_MODULE_NAME!r})\n"
        "exec(compile(src, 'fleetpatch-protocol', 'exec'), m.__dict__)\n"
        "ledger = m.empty_ledger()\n"
        "print(json.dumps({'typing': 'typing' in sys.modules, 'dict': isinstance(ledger, dict),\n"
        "                  'ledger': json.loads(json.dumps(ledger)),\n"
        "                  'file': m.LedgerFile(op='modify', before='a', after='b')}))\n"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", probe], input=remote.PROTOCOL_SOURCE,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    out = __import__("json").loads(proc.stdout)
    assert out == {"typing": False, "dict": True, "ledger": protocol.empty_ledger(),
                   "file": {"op": "modify", "before": "a", "after": "b"}}
