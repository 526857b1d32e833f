"""The demo's proof-under-traffic patches (fleetpatch_demo/proof.py, steps 5-8) against the real
SGLang 0.5.9 files: each is stacked (dynamic-spec-disable, then step-count, then large-batch),
applies there with no fuzz and no offset, byte-compiles, passes fleetpatch's own patch rules,
and adds what the demo says: step-count's first line runs at every scheduler step, large-batch's
one line sits inside step-count's `if` (a batch of 4 requests or more) in both workers."""
from __future__ import annotations

import py_compile
import shutil
import subprocess

from fleetpatch.engines import sglang
from fleetpatch.patchset import load_patch
from fleetpatch.probe.verdict import added_lines
from fleetpatch_demo import proof
from fleetpatch_demo.run import DEMO_PATCHES, SHIPPED_PATCH
from fleetpatch_demo.wheels import sglang_tree
from support.paths import REPO

WORKERS = ("sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py")
STACK = [(REPO / "src" / "fleetpatch" / "patches", SHIPPED_PATCH), (DEMO_PATCHES, proof.FORWARD_PATCH),
         (DEMO_PATCHES, proof.GATED_PATCH)]


def test_the_demo_s_patches_stack_on_the_shipped_one_and_gate_the_last_line(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(sglang_tree("0.5.9"), tree)
    for folder, name in STACK:
        patch, _ = load_patch(name, [str(folder)], sglang.PROFILE)
        revision = next(r for r in patch.revisions if r.rev == 1)   # the one for 0.5.9
        if name != SHIPPED_PATCH:
            assert not patch.markers, name   # markerless: the probe proves them
        diff = revision.diff_text
        done = subprocess.run(["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-d", str(tree)], input=diff,
                              text=True, capture_output=True)
        assert done.returncode == 0 and "offset" not in done.stdout and "fuzz" not in done.stdout, done.stdout
        for f in WORKERS:
            py_compile.compile(str(tree / f), doraise=True)
        added = added_lines(diff)
        if name != SHIPPED_PATCH:   # both workers, nothing else
            assert sorted(added) == sorted(WORKERS), added
        if name == proof.GATED_PATCH:   # one line per worker, the gated one
            assert all(len(n) == 1 for n in added.values()), added
    for f in WORKERS:
        lines = (tree / f).read_text().splitlines()
        start = next(i for i, s in enumerate(lines) if "def forward_batch_generation(" in s)
        body = lines[start:start + 20]
        counted = next(i for i, s in enumerate(body) if "self.steps_seen = " in s)
        gate = next(i for i, s in enumerate(body) if s.strip().startswith("if ") and ">= 4:" in s)
        largest = next(i for i, s in enumerate(body) if "self.largest_batch = " in s)
        indent = len(body[gate]) - len(body[gate].lstrip())
        assert counted < gate < largest and len(body[largest]) - len(body[largest].lstrip()) > indent, body
        assert len(body[counted]) - len(body[counted].lstrip()) == indent, "step-count's first line: every step"
