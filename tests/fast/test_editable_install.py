"""A bare host whose SGLang is an editable install, as `pip install -e python/` makes it in a
source checkout (and in the official image): the package lives outside site-packages, found
through setuptools' `__editable__` finder. fleetpatch patches the checkout's files, the
probe proves the lines ran from there, and a rollback restores them byte for byte."""
from __future__ import annotations

import shutil

from setuptools.command import editable_wheel

from support.localhost import EAGLE, EAGLE_V2, job, sha256
from fleetpatch import steps
from fleetpatch.errors import Status


def make_editable(lh) -> None:
    """Move the host's sglang package into a checkout (<root>/sgl-workspace/python/sglang) and
    leave in site-packages what setuptools' editable wheel leaves: a .pth and its finder."""
    checkout = lh.root / "sgl-workspace" / "python"
    checkout.mkdir(parents=True)
    shutil.move(str(lh.site / "sglang"), str(checkout / "sglang"))
    finder = "__editable___sglang_0_5_9_finder"
    (lh.site / f"{finder}.py").write_text(
        editable_wheel._finder_template(finder, {"sglang": str(checkout / "sglang")}, {}))
    (lh.site / "__editable__.sglang-0.5.9.pth").write_text(f"import {finder}; {finder}.install()\n")
    lh.site = checkout   # where the engine's files are now: lh.file() and the pristine checks read here


def test_an_editable_install_is_patched_in_its_checkout_proven_and_rolled_back(lh):
    make_editable(lh)
    pristine = {rel: sha256(lh.file(rel)) for rel in (EAGLE, EAGLE_V2)}
    host = lh.host()
    r = steps.deploy(job(lh, "both-quiet", host=host)[0], host)
    assert r.ok and r.status == Status.VERIFIED, r.message
    assert sha256(lh.file(EAGLE)) != pristine[EAGLE], "the checkout's file was patched"
    block = r.details["execution"]
    assert EAGLE in block["ran"], block
    assert block["imported"]["sglang.srt.speculative.eagle_worker"] == str(lh.file(EAGLE)), "run from the checkout"
    # the agent's own CPU at each reply of the deploy, in the report's host entry, never going down
    cpu = [r.details[k]["agent_cpu_s"] for k in ("probe_timings", "apply_timings", "follow_timings")]
    assert 0 < cpu[0] <= cpu[1] <= cpu[2], cpu
    # the site step's answer was kept: the rollback's agent finds the checkout from it
    assert (lh.state / "package-cache.json").exists()
    rb = steps.rollback(job(lh, None, host=host)[0], host)
    assert rb.ok and rb.status == Status.ROLLED_BACK, rb.message
    assert {rel: sha256(lh.file(rel)) for rel in (EAGLE, EAGLE_V2)} == pristine
