"""On a terminal narrower than a table, the host and status columns are never cut.

The tables of `report` are rendered by rich at the widths a user has (40, 60,
100 and 200 columns) and through the installed program, on a terminal (a pty
COLUMNS=40 wide) and piped through cat. A host name and a status always appear
whole, on one line, and nothing anywhere ends in "…".
"""
from __future__ import annotations

import io
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from fleetpatch.errors import Status
from fleetpatch.hostcalls import HostResult
from fleetpatch.report import View, status_table, summary_table

from support.paths import REPO  # noqa: E402
from support.terminal import on_a_terminal, program_env  # noqa: E402
LONG = "gpu-node-a01.rack7.example"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

SUMMARY = {
    LONG: HostResult(LONG, True, Status.ALREADY_APPLIED, engine_version="0.5.9", patch="dynamic-spec-disable@1",
                     executed_path="EAGLEWorkerV2", duration_s=3.2, round_trips=4),
    "v1b": HostResult("v1b", False, Status.HOST_KEY_REJECTED, duration_s=2.0),
}
STATUS = {
    LONG: HostResult(LONG, True, Status.OK, engine_version="0.5.9", details={
        "reachable": True, "applied": ["dynamic-spec-disable@1"], "server_up": True,
        "last_verification": {"status": "verified", "check": "deploy", "labels": ["dynamic-spec-disable@1"],
                              "at": "2026-01-05T10:11:12+0000"}}),
    "v1b": HostResult("v1b", False, Status.UNREACHABLE, details={"reachable": False}),
}


def render(renderable, width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=True, color_system=None).print(renderable)
    return buf.getvalue()


def whole_on_a_line(text: str, *words: str) -> None:
    lines = text.splitlines()
    for word in words:
        assert any(word in line for line in lines), f"{word!r} is not whole on any line:\n{text}"
    assert "…" not in text, text


@pytest.mark.parametrize("width", [40, 60, 100, 200])
def test_summary_keeps_host_and_status_whole(width):
    text = render(summary_table("deploy-patch", SUMMARY), width)
    whole_on_a_line(text, LONG, "already-applied", "v1b", "host-key-rejected")
    assert all(len(line) <= width for line in text.splitlines()), text
    # what the other columns said is still there, folded or in a block, never cut
    flat = re.sub(r"[\s│┃]+", "", text)
    for word in ("dynamic-spec-disable@1", "EAGLEWorkerV2", "3.2s"):
        assert word in flat, text


@pytest.mark.parametrize("width", [40, 60, 100, 200])
def test_status_keeps_host_and_reachable_whole(width):
    text = render(status_table(STATUS), width)
    whole_on_a_line(text, LONG, "v1b", "no (unreachable)")
    assert all(len(line) <= width for line in text.splitlines()), text
    flat = re.sub(r"[\s│┃]+", "", text)
    assert "2026-01-05T10:11:12+0000" in flat and "dynamic-spec-disable@1" in flat, text


def test_status_blocks_on_an_80_column_terminal_keep_every_column(tmp_path):
    """As the program's console prints (soft_wrap: a log line is never cut): each row's block
    wraps onto more lines, and nothing after `drift:` is lost."""
    locked = dict(STATUS[LONG].details, restart_pending=True,
                  lock_state={"cell": "alice@laptop-x pid 1234, 3 min, DEAD run"})
    rows = {LONG: HostResult(LONG, False, Status.LOCKED, engine_version="0.5.9", details=locked)}
    buf = io.StringIO()
    Console(file=buf, width=80, force_terminal=True, color_system=None, soft_wrap=True).print(status_table(rows))
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    flat = " ".join(text.split())
    for said in ("drift: no", "server up: yes (restart pending)", "last verification: none since the change",
                 "verified: deploy check of dynamic-spec-disable@1, 2026-01-05T10:11:12+0000",
                 "lock: alice@laptop-x pid 1234, 3 min, DEAD run"):
        assert said in flat, text


def test_a_wide_terminal_still_gets_the_table():
    text = render(summary_table("deploy-patch", SUMMARY), 200)
    assert re.search(rf"┃ host +┃ status +┃ engine", text), text
    assert re.search(rf"│ {re.escape(LONG)} │ already-applied +│ 0.5.9 +│ dynamic-spec-disable@1", text), text


def test_narrow_terminal_gets_one_block_per_host():
    text = render(summary_table("deploy-patch", SUMMARY), 40)
    lines = [ln.rstrip() for ln in text.splitlines()]
    assert lines[0] == "fleetpatch deploy-patch: summary"
    assert lines[1].startswith(LONG + "  status:"), text
    assert "v1b  status: host-key-rejected" in lines, text


@pytest.mark.parametrize("width", [40, 60, 120])
def test_live_progress_keeps_host_and_phase_whole(width):
    view = View("rollout", [LONG, "v1b"], console=Console(file=io.StringIO(), width=width), live=False)
    view.rows[LONG].update(phase="restart", detail="waiting for the ready line: " + "x" * 60, stage="canary")
    view.rows["v1b"].update(phase="done", detail="host-key-rejected", stage="batch 1 of 2")
    text = render(view._render().renderables[0], width)   # the table; no progress bar off the live view
    whole_on_a_line(text, LONG, "restart", "host-key-rejected")


# ------------------------------------------------------------------ the installed program


def write_inventory(folder: Path, port: int) -> None:
    doc = yaml.safe_load((REPO / "hosts.yaml").read_text())
    doc["hosts"] = {n: {"address": "127.0.0.1", "port": port} for n in (LONG, "v1b")}
    doc.pop("groups", None)
    (folder / "hosts.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_status_piped_through_cat_with_columns_40(tmp_path, dead_port):
    write_inventory(tmp_path, dead_port)
    proc = subprocess.run(f"{sys.executable} -m fleetpatch status | cat", shell=True, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=program_env(COLUMNS="40"))
    whole_on_a_line(proc.stdout, LONG, "v1b", "no (unreachable)")
    assert proc.stdout.splitlines()[-1].startswith("FAILED on 2 of 2 hosts"), proc.stdout


def test_status_on_a_40_column_terminal(tmp_path, dead_port):
    write_inventory(tmp_path, dead_port)
    code, out = on_a_terminal([sys.executable, "-m", "fleetpatch", "status"], tmp_path, columns=40, lines=50,
                              env=program_env(COLUMNS="40", LINES="50", TERM="xterm"))
    assert code == 1
    text = ANSI.sub("", out).replace("\r\n", "\n")
    whole_on_a_line(text, LONG, "v1b", "no (unreachable)")
    assert "fleetpatch status" in text, text
