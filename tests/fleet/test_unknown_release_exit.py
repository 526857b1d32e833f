"""A release the profile does not know is never guessed, through the installed program:
deploy-patch refuses a patch it could not prove there with exit 2 (a patch error found
before any host changed), naming the maintainer command, and no byte changes."""
from __future__ import annotations

import re

from support.paths import FIXTURE_PATCHES, sha256

EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"


def claim_release(fleet, name: str, version: str) -> None:
    """The host's dist-info says `version` (its files stay 0.5.9's)."""
    meta = next(fleet.hosts[name].site_packages.glob("sglang-*.dist-info")) / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", meta.read_text()))


def test_an_unprovable_patch_on_an_unknown_release_is_exit_2_and_changes_nothing(operator, fleet):
    claim_release(fleet, "v2a", "0.5.24")
    before = sha256(fleet.hosts["v2a"].site_packages / EAGLE_V2)
    pid = fleet.server_pid("v2a")
    run = operator.run("deploy-patch", "--patches", str(FIXTURE_PATCHES), "--patch", "any-release-one-marker",
                       "--hosts", "v2a")
    assert run.code == 2, run
    assert "SGLang 0.5.24 is newer than the profile" in run.output, run
    assert "invoke engine-facts --version 0.5.24" in run.output, run
    assert "None" not in run.output, run
    assert sha256(fleet.hosts["v2a"].site_packages / EAGLE_V2) == before
    assert fleet.server_pid("v2a") == pid, "the server was restarted"


def test_a_refused_host_beside_one_that_went_ahead_is_exit_1(operator, fleet):
    claim_release(fleet, "v2a", "0.5.24")
    run = operator.run("deploy-patch", "--patches", str(FIXTURE_PATCHES), "--patch", "any-release-one-marker",
                       "--hosts", "v2a,v1a")
    assert run.host("v2a")["status"] == "error" and run.host("v1a")["ok"], run
    assert run.code == 1, run   # v1a changed: not "found before any host was changed"
