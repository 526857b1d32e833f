"""What `status` tells an operator who reads it from any laptop: the command it
prints for a dead run's lock works there (one without the patch's folder), and
a last verification older than the files on disk is not shown as their verdict.
Local transport: the real agent and stand-in server."""
from __future__ import annotations

import io
import json
import os
import shlex
import time

import yaml
from rich.console import Console

from fleetpatch import report, steps
from fleetpatch.cli_common import prepare
from fleetpatch.errors import UsageError
from fleetpatch.patchset import search_dirs
from support.localhost import job
from support.paths import FIXTURE_PATCHES


def row_text(results: dict) -> str:
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(report.status_table(results))
    return buf.getvalue()


def dead_lock(lh, command: str) -> None:
    """The lock a run of another laptop left when it died: not renewed for an hour."""
    lh.lock.write_text(json.dumps({"token": "t0", "holder": "alice@far pid 7", "laptop": "far", "pid": 7,
                                   "command": command, "since": "2026-12-01T00:00:00+0000",
                                   "since_epoch": time.time() - 3600, "renew_s": 5}))
    os.utime(lh.lock, (time.time() - 3600, time.time() - 3600))


def test_the_dead_lock_advice_of_status_works_from_a_laptop_without_the_patch(lh, tmp_path, monkeypatch):
    fixture_job, host = job(lh, "v2-only-beacon", force=True, no_restart=True)
    assert steps.deploy(fixture_job, host).status == "applied"
    dead_lock(lh, "deploy-patch --patch v2-only-beacon@1")
    elsewhere = tmp_path / "other-laptop"   # no patches/ folder: only the shipped patches
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (elsewhere / "hosts.yaml").write_text(yaml.safe_dump(lh.inventory()))
    status_job, _ = job(lh, None)
    status_job.patch_dirs = search_dirs(None, elsewhere)
    r = steps.status(status_job, host)
    assert r.status == "locked", r.message
    advice = r.message.split("last verification above), ")[1].splitlines()
    assert advice == [
        "clear the lock and undo its work (works from any laptop: the host records the patch):",
        "  fleetpatch rollback --patch v2-only-beacon --break-lock --hosts h1",
        "or finish its work where the patch's folder is (this laptop has no patches/v2-only-beacon; "
        "or add --patches DIR):",
        "  fleetpatch deploy-patch --patch v2-only-beacon@1 --break-lock --hosts h1"], r.message
    assert r.details["lock_state"]["clear"] == "fleetpatch rollback --patch v2-only-beacon --break-lock --hosts h1"
    # where the patch's folder is, finishing the dead run's deploy comes first
    status_job.patch_dirs = search_dirs(str(FIXTURE_PATCHES), elsewhere)
    here = steps.status(status_job, host)
    assert here.details["lock_state"]["clear"] == \
        "fleetpatch deploy-patch --patch v2-only-beacon@1 --break-lock --hosts h1", here.message
    # what the printed commands do on this laptop: the deploy's patch is unknown here, the rollback's is not
    argv = shlex.split(r.details["lock_state"]["clear"])
    patch = argv[argv.index("--patch") + 1]
    try:
        prepare(inventory=None, hosts="h1", group=None, patches=None, patch="v2-only-beacon@1", changes_hosts=True)
        raise AssertionError("the deploy's patch was found on a laptop without it")
    except UsageError as e:
        assert "v2-only-beacon" in str(e)
    _, _, _, patch_obj, _ = prepare(inventory=None, hosts="h1", group=None, patches=None, patch=patch,
                                    changes_hosts=True, by_host_record=True)
    assert patch_obj is None   # judged by the host's record
    rollback_job, _ = job(lh, None, patch_name=patch, break_lock=True)
    rollback_job.patch_dirs = search_dirs(None, elsewhere)
    rolled = steps.rollback(rollback_job, host)
    assert rolled.ok, rolled.message
    assert lh.is_pristine() and not lh.lock.exists()


def test_a_verification_older_than_the_files_on_disk_is_not_shown_as_their_verdict(lh):
    deploy_job, host = job(lh)
    assert steps.deploy(deploy_job, host).status == "verified"
    assert steps.rollback(job(lh)[0], host).status == "rolled-back"
    assert "verified: rollback check of spec-path-beacon@1" in row_text({"h1": steps.status(job(lh, None)[0], host)})
    again, _ = job(lh, no_restart=True)
    assert steps.deploy(again, host).status == "applied"
    r = steps.status(job(lh, None)[0], host)
    row = row_text({"h1": r})
    assert "spec-path-beacon@1" in row and "yes (restart pending)" in row, row
    assert "none since the change (restart pending); before it: verified: rollback check of spec-path-beacon@1" \
        in row, row
