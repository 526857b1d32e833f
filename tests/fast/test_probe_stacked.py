"""Every applied patch is judged (issue 31, 4): with two marker-less patches stacked on one
host, the probe watches both, and verify-logs judges each by its own lines; "the probe never
loaded" is said only when no process of the server recorded anything."""
from __future__ import annotations

import json

from fleetpatch import steps
from fleetpatch.errors import Status
from fleetpatch.probe.verdict import added_lines, carry_lines
from support.localhost import EAGLE, job


def test_two_stacked_quiet_patches_are_each_proven_by_their_own_lines(lh):
    try:
        first = steps.deploy(job(lh, "both-quiet")[0], lh.host())
        assert first.status == Status.VERIFIED, first.message
        line_before = first.details["execution"]["ran"][EAGLE]

        # module-flag-quiet adds a line above both-quiet's: that line moves down by one
        second = steps.deploy(job(lh, "module-flag-quiet")[0], lh.host())
        assert second.status == Status.VERIFIED, second.message

        seen = steps.verify_logs(job(lh, None)[0], lh.host())
        assert seen.ok and seen.status == Status.VERIFIED, seen.message
        assert "never loaded" not in seen.message and "not verified" not in seen.message, seen.message
        text = seen.message
        assert "both-quiet@1 verified" in text and "module-flag-quiet@1 verified" in text, text
        shifted = [n + 1 for n in line_before]
        assert f"{EAGLE} line {shifted[0]} " in text, text   # both-quiet judged by its line where it is now

        # the top patch rolled back: the restart's probe still watches both-quiet, at its line of before
        back = steps.rollback(job(lh, "module-flag-quiet")[0], lh.host())
        assert back.ok and back.status == Status.ROLLED_BACK, back.message
        again = steps.verify_logs(job(lh, None)[0], lh.host())
        assert again.ok and f"{EAGLE} line {line_before[0]} " in again.message, again.message
    finally:
        lh.stop()


def test_verify_logs_of_a_patch_the_last_restart_did_not_watch_does_not_say_never_loaded(lh):
    """A probe that ran, but whose plan lacks the patch (a plan written by a fleetpatch that watched
    only the newest patch): the message says it did not watch the patch, not that it never loaded."""
    try:
        assert steps.deploy(job(lh, "both-quiet")[0], lh.host()).ok
        plan_file = lh.state / "probe" / "plan.json"
        plan = json.loads(plan_file.read_text())
        plan.pop("patches", None)
        plan["label"] = "other@1"
        plan_file.write_text(json.dumps(plan))
        seen = steps.verify_logs(job(lh, "both-quiet")[0], lh.host())
        assert not seen.ok and "never loaded" not in seen.message, seen.message
        assert "the probe watched other@1, not both-quiet@1" in seen.message, seen.message
    finally:
        lh.stop()


def test_carry_lines_moves_an_earlier_patchs_lines_past_a_later_diff():
    later = ("--- a/x.py\n+++ b/x.py\n@@ -10,3 +10,4 @@\n a\n+new\n b\n c\n"
             "@@ -30,3 +31,2 @@\n d\n-gone\n e\n")
    assert added_lines(later) == {"x.py": [11]}
    # 5: above every hunk; 11: context, pushed down; 31: removed; 40: below both hunks (+1 -1)
    assert carry_lines({"x.py": [5, 11, 31, 40], "y.py": [3]}, later) == {"x.py": [5, 12, 40], "y.py": [3]}
    assert carry_lines({"x.py": [10, 20]}, "--- a/x.py\n+++ b/x.py\n@@ -10,0 +11,2 @@\n+p\n+q\n") == {"x.py": [10, 22]}
