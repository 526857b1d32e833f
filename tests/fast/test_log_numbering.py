"""A follow reads the log from the restart's offset, and numbers its lines from there: the
log written before the restart (GBs on a long-lived append-only log) is never read."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetpatch.agent.session import op_follow
from fleetpatch.agent.state import AgentState, RequestReader
from fleetpatch.protocol import REPLY_PREFIX

NEW = b"server started\nfleetpatch marker\n"
OLD_LINE = b"an old line the server wrote before the restart, " * 2 + b"\n"


def read_chars() -> int:
    """What this process has read through read(2) so far (the kernel's count, /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def follow_once(tmp_path: Path, log: Path, offset: int) -> list[dict]:
    """One follow from (inode, offset), the laptop's decision already waiting: its `lines` events."""
    r, w = os.pipe()
    os.write(w, b"[]\n")
    state = AgentState()
    state.requests = RequestReader(r)
    req = {"log": str(log), "inode": log.stat().st_ino, "offset": offset, "state_dir": str(tmp_path / "state"),
           "timeout": 30, "restart": {"kind": "command"}}
    try:
        out = op_follow(state, req)
    finally:
        os.close(w)
        os.close(r)
    assert out["ended"] == "finished", out
    return out


@pytest.mark.parametrize("old_mb", [0, 32])
def test_the_follow_reads_nothing_of_the_log_before_the_restart(tmp_path, capsys, old_mb):
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        for _ in range((old_mb << 20) // len(OLD_LINE)):
            f.write(OLD_LINE)
    offset = log.stat().st_size   # where the log ended at the restart
    with open(log, "ab") as f:
        f.write(NEW)
    capsys.readouterr()
    before = read_chars()
    follow_once(tmp_path, log, offset)
    read = read_chars() - before
    events = [json.loads(l[len(REPLY_PREFIX):]) for l in capsys.readouterr().out.splitlines()
              if l.startswith(REPLY_PREFIX)]
    batches = [e for e in events if e.get("t") == "lines"]
    assert [(b["first_line_no"], b["lines"]) for b in batches] == [(1, ["server started", "fleetpatch marker"])], \
        "line 1 is the first line since the restart"
    assert batches[0]["bytes_read"] == len(NEW), "the agent read the new lines and nothing else of the log"
    assert read < 1 << 20, f"the follow read {read} bytes with {old_mb} MB of log before the restart"
