"""A release the profile does not know is never guessed, through the installed program:
with the probe (the default) the result is proven by the lines that ran. (With the probe
off, a patch without a marker for every path it changes is refused at load, exit 2, before
any host is contacted; the per-host refusal on the local transport is in
tests/fast/test_unknown_releases.py.)"""
from __future__ import annotations

import re

from support.paths import FIXTURE_PATCHES, sha256

EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"


def claim_release(fleet, name: str, version: str) -> None:
    """The host's dist-info says `version` (its files stay 0.5.9's)."""
    meta = next(fleet.hosts[name].site_packages.glob("sglang-*.dist-info")) / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", meta.read_text()))


def test_with_the_probe_an_unknown_release_is_deployed_and_proven_by_the_lines_that_ran(operator, fleet):
    claim_release(fleet, "v2a", "0.5.24")
    check = operator.run("check-patch", "--patches", str(FIXTURE_PATCHES), "--patch", "any-release-quiet", "--hosts", "v2a")
    assert check.code == 0 and "by the probe" in check.output, check
    run = operator.run("deploy-patch", "--patches", str(FIXTURE_PATCHES), "--patch", "any-release-quiet", "--hosts", "v2a")
    assert run.code == 0, run
    host = run.host("v2a")
    assert host["status"] == "verified" and "None" not in run.output, run
    assert EAGLE_V2 in host["execution"]["ran"], host["execution"]
