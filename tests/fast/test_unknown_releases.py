"""Issue 26 (3, 6): a release the profile does not know is never guessed, a local
build tag is its release, and a superseded patch says what to use instead.

On the local transport: the real agent, real SGLang 0.5.9 files and the stand-in
server; the host's dist-info METADATA is rewritten to say which release it is
(the files stay 0.5.9's, so these tests assert the version handling, not the
routing of those releases). A host that fails is exit 1 in the CLI, or 2 when every host is refused (the same as
the pre-flight refusal): every refusal here is per host, before any write.
"""
from __future__ import annotations

import re

import pytest

from support.localhost import EAGLE, EAGLE_V2, LocalHost, job, speculative_tree
from fleetpatch import steps
from fleetpatch.engines.sglang import PROFILE


def say_version(lh: LocalHost, version: str | None) -> None:
    """The host's dist-info names `version` (None: no Version header at all)."""
    md = next(lh.site.glob("sglang-*.dist-info")) / "METADATA"
    text = md.read_text()
    line = f"Version: {version}" if version else "X-Version-Removed: by the test"
    md.write_text(re.sub(r"^Version: .*$", line, text, count=1, flags=re.M))


def untouched(lh: LocalHost, before: dict) -> None:
    assert speculative_tree(lh.file("sglang/srt/speculative")) == before, "no file changed"
    assert lh.server_pid() is None, "not restarted"
    assert not lh.lock.exists()
    assert lh.ledger().get("patches", {}) == {}


UNKNOWN = [("0.5.24", "SGLang 0.5.24 is newer than the profile (0.5.7 \u2013 0.5.23)"),
           ("0.5.24.dev3", "SGLang 0.5.24.dev3 is a pre-release or dev build"),
           ("0.5.6", "SGLang 0.5.6 is older than the profile (0.5.7 \u2013 0.5.23)"),
           (None, "the host does not say which SGLang it runs")]


@pytest.mark.parametrize("version,note", UNKNOWN, ids=[v or "missing" for v, _ in UNKNOWN])
def test_an_unknown_release_without_a_marker_for_every_changed_path_is_refused_before_any_write(lh, version, note):
    say_version(lh, version)
    before = speculative_tree(lh.file("sglang/srt/speculative"))
    for step in (steps.check_patch, steps.deploy):
        j, host = job(lh, "any-release-one-marker", probe=False)   # markers alone: the probe is off
        r = step(j, host)
        assert not r.ok and r.status == "error", r.message
        assert note in r.message and "None" not in r.message, r.message
        if version:
            assert "no marker for EAGLEWorkerV2 (sglang/srt/speculative/eagle_worker_v2.py)" in r.message
            assert f"`invoke engine-facts --version {version}`" in r.message
            assert "nothing was written" in r.message
            assert r.details.get("refused") == "unprovable"
        else:
            assert "no revision can be chosen without the version, so nothing was changed" in r.message
        untouched(lh, before)


@pytest.mark.parametrize("version,note", UNKNOWN[:3], ids=[v for v, _ in UNKNOWN[:3]])
def test_an_unknown_release_is_proven_by_the_marker_of_the_path_that_ran(lh, version, note):
    say_version(lh, version)
    j, host = job(lh, "any-release-beacon", probe=False)
    check = steps.check_patch(j, host)
    assert check.ok and check.status == "applies", check.message
    assert note in check.message and "the path will be judged by what runs" in check.message
    assert "the server runs" not in check.message and "None" not in check.message, check.message
    assert "deploy-patch will prove it by the marker of the path that runs" in check.message
    r = steps.deploy(j, host)
    assert (r.status, r.executed_path) == ("verified", "EAGLEWorker"), r.message
    assert "verified on EAGLEWorker by its marker" in r.message and "None" not in r.message
    assert r.engine_version == version
    assert not lh.is_pristine() and not lh.lock.exists()


def test_a_local_build_tag_is_its_release(lh):
    assert PROFILE.knows("0.5.23+cu128") and PROFILE.release_of("0.5.23+cu128") == "0.5.23"
    assert PROFILE.version_note("0.5.23+cu128") is None
    say_version(lh, "0.5.9+cu128")
    j, host = job(lh, "spec-path-beacon")   # its r1 says ==0.5.9, which admits 0.5.9+cu128 (PEP 440)
    check = steps.check_patch(j, host)
    assert check.ok and check.patch == "spec-path-beacon@1", check.message
    assert "the server runs EAGLEWorker (inventory launch config)" in check.message
    r = steps.deploy(j, host)
    assert (r.status, r.executed_path) == ("verified", "EAGLEWorker"), r.message
    assert "verified on EAGLEWorker by its marker" not in r.message, "routed as 0.5.9, not as an unknown release"
    assert "the server runs EAGLEWorker (sglang/srt/speculative/eagle_worker.py)" in r.message


def test_a_superseded_patch_says_what_to_use_instead_and_changes_nothing(lh):
    say_version(lh, "0.5.23+cu128")
    before = speculative_tree(lh.file("sglang/srt/speculative"))
    for step in (steps.check_patch, steps.deploy):
        j, host = job(lh, "superseded-beacon")
        r = step(j, host)
        assert not r.ok and r.status == "skipped", r.message
        assert "superseded on SGLang 0.5.23 by --speculative-adaptive: use that instead" in r.message
        assert "nothing was changed on this host" in r.message
        untouched(lh, before)


def test_a_superseded_patch_on_the_real_release_files_is_not_a_conflict(lh):
    """With SGLang 0.5.23's own eagle_worker_v2.py the 0.5.9 diff conflicts: the manifest's
    `superseded` entry is what the operator reads instead."""
    import shutil
    from fleetpatch_demo.wheels import sglang_tree
    v2 = "sglang/srt/speculative/eagle_worker_v2.py"
    shutil.copyfile(sglang_tree("0.5.23") / v2, lh.file(v2))
    say_version(lh, "0.5.23")
    j, host = job(lh, "any-release-beacon")   # the same diff, not superseded: a conflict
    assert steps.check_patch(j, host).status == "conflict"
    before = speculative_tree(lh.file("sglang/srt/speculative"))
    j, host = job(lh, "superseded-beacon")
    r = steps.check_patch(j, host)
    assert r.status == "skipped" and "conflict" not in r.message, r.message
    assert "superseded on SGLang 0.5.23 by --speculative-adaptive: use that instead" in r.message
    assert speculative_tree(lh.file("sglang/srt/speculative")) == before


# Issue 33 (14): a revision for releases newer than the profile, changing only eagle_worker_v2.py,
# has its sibling rule judged by the files each host has, not refused at load.
NEWER = "newer-v2-only"


def test_a_revision_for_releases_the_profile_does_not_know_loads_without_its_sibling(lh):
    j, _ = job(lh, NEWER)
    assert [fd.path for fd in j.patch.revisions[0].files] == [EAGLE_V2]
    assert j.patch.allow_single_path is None


def test_on_a_host_without_the_sibling_it_applies_and_the_probe_proves_the_path(tmp_path, template):
    host_v2 = LocalHost(tmp_path / "h1", template, spec_v2=True)
    try:
        say_version(host_v2, "0.5.24")
        host_v2.file(EAGLE).unlink()   # as in the newest releases: no v1 worker at all
        j, host = job(host_v2, NEWER)
        check = steps.check_patch(j, host)
        assert check.ok and check.status == "applies", check.message
        assert "SGLang 0.5.24 is newer than the profile" in check.message
        assert "deploy-patch will prove it by the probe" in check.message, check.message
        j, host = job(host_v2, NEWER)
        r = steps.deploy(j, host)
        assert (r.status, r.executed_path) == ("verified", "EAGLEWorkerV2"), r.message
        assert "fleetpatch fixture newer-v2-only" in host_v2.file(EAGLE_V2).read_text()
    finally:
        host_v2.stop()


def test_on_a_host_that_has_both_files_check_and_deploy_refuse_it_by_the_sibling_rule(lh):
    say_version(lh, "0.5.24")
    before = speculative_tree(lh.file("sglang/srt/speculative"))
    for step in (steps.check_patch, steps.deploy):
        j, host = job(lh, NEWER)
        r = step(j, host)
        assert not r.ok and r.status == "error", r.message
        assert (f"h1: {NEWER}@1 changes {EAGLE_V2} but not its sibling {EAGLE}, which this host has"
                in r.message), r.message
        assert "SGLang 0.5.24, a release the profile does not know" in r.message, r.message
        assert "a server on the other code path would run the unpatched file" in r.message
        assert 'allow_single_path: "<reason>"' in r.message and "nothing was changed on this host" in r.message
        untouched(lh, before)
