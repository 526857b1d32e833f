"""issue 31: a patch whose code was reached but none of whose added lines ran yet is
`unproven` (a failure), and `status` shows such a host as failing, with the time since its
restart. On the real agent and stand-in server, on the local transport (functions mode:
forward-extend's lines are in forward_batch_generation, which no request has run yet: its
server skips SGLang's warmup request, and the patch asks for no smoke request)."""
from __future__ import annotations

import re

from support.localhost import job
from fleetpatch import steps
from fleetpatch.errors import Status


def test_a_line_no_request_has_run_yet_is_unproven_and_status_shows_the_host_failing(lh):
    import shutil
    from fleetpatch.engines import sglang
    from fleetpatch.patchset import load_patch
    from support.paths import FIXTURE_PATCHES
    folder = lh.root.parent / "patches" / "forward-extend"
    shutil.copytree(FIXTURE_PATCHES / "forward-extend", folder)
    with open(folder / "patch.yaml", "a") as f:
        f.write("prove: {requests: 0}\n")   # no smoke request
    host = lh.host(start=lh.host().server.restart.start + " --skip-server-warmup")   # no warmup request
    j, host = job(lh, "forward-extend", host=host)
    j.patch, _ = load_patch("forward-extend", [folder.parent], sglang.PROFILE)
    r = steps.deploy(j, host)
    assert r.status == Status.UNPROVEN and not r.ok, r.message
    assert "forward-extend@1 unproven" in r.message
    assert "imported, but no function that holds its added lines ran yet" in r.message, r.message
    assert "prove.concurrency" in r.message and "--bake" in r.message and "verify-logs" in r.message
    s = steps.status(job(lh, None)[0], host)
    assert not s.ok and s.status == Status.UNPROVEN, s.message
    assert re.search(r"ended unproven: .* \(restarted \d+ s ago\); the server still watches them", s.message), s.message
    assert "forward-extend@1" in s.message

