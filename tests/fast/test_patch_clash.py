"""A patch whose file another fleetpatch patch holds is a clash, named by that patch
(issue 33, item 11): not `drift` ("hand edits"), not a bare `conflict`.

On the local transport: the real agent and SGLang 0.5.9 files. v2-only-beacon is
deployed first (its line sits inside spec-path-beacon's hunk of eagle_worker_v2.py);
check-patch and deploy-patch of spec-path-beacon then name v2-only-beacon@1 in the
same words, say how to stack on it or roll it back, and change nothing.
"""
from __future__ import annotations

from support.localhost import EAGLE_V2, job, speculative_tree
from fleetpatch import steps

CLASH = "spec-path-beacon@1 clashes with v2-only-beacon@1, which fleetpatch deployed on this host"
HOLDS = (f"{EAGLE_V2}: holds what v2-only-beacon@1 wrote (the sha256 its ledger records), "
         "not spec-path-beacon@1's pre-image")
STACK = ("to stack spec-path-beacon on it: write spec-path-beacon's diff against the host's current files "
         "(fetch them first: fleetpatch fetch --hosts h1 --inventory fleet.yaml)")
ROLL_BACK = ("or roll v2-only-beacon@1 back first: fleetpatch rollback --patch v2-only-beacon --hosts h1 "
             "--inventory fleet.yaml")


def test_a_file_another_patch_wrote_is_a_clash_named_by_that_patch(lh):
    first, host = job(lh, "v2-only-beacon", no_restart=True, force=True)   # the server runs v1: written anyway
    assert steps.deploy(first, host).status == "applied"
    before = speculative_tree(lh.file("sglang/srt/speculative"))
    ledger = lh.ledger()
    said = {}
    for step in (steps.check_patch, steps.deploy):
        j, host = job(lh, "spec-path-beacon", inventory_arg="fleet.yaml")
        r = step(j, host)
        assert not r.ok and r.status == "conflict", r.message
        for line in (CLASH, HOLDS, STACK, ROLL_BACK):
            assert line in r.message, r.message
        assert "drift" not in r.message and "hand edit" not in r.message, r.message
        assert speculative_tree(lh.file("sglang/srt/speculative")) == before, "nothing written"
        assert lh.ledger()["patches"].keys() == ledger["patches"].keys() == {"v2-only-beacon"}
        assert not lh.lock.exists()
        said[step.__name__] = r.message.splitlines()[0]
    assert said["deploy"] == said["check_patch"].replace("h1: ", "h1: refused, left untouched and not restarted: ")
