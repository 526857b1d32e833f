"""A host agent's `follow` run in the test process, on a log file, with the request stream the
laptop's decision would come on (a pipe nobody writes): for the follow's own rules, without SSH."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from fleetpatch.agent.follow import Follow
from fleetpatch.agent.state import AgentState, RequestReader


@contextlib.contextmanager
def follow_of(log: Path, **req):
    """A Follow of `log` (created empty if missing) from its start; `req`: the rest of the request."""
    if not log.exists():
        log.write_bytes(b"")
    laptop_side, agent_side = os.pipe()
    state = AgentState()
    state.requests = RequestReader(laptop_side)
    follow = Follow(state, dict({"op": "follow", "log": str(log), "inode": os.stat(log).st_ino, "offset": 0,
                                 "timeout": 5}, **req))
    try:
        yield follow
    finally:
        follow.close()
        os.close(laptop_side)
        os.close(agent_side)
