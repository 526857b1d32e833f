"""A site directory as a host has it: a release's real SGLang files (its PyPI wheel), writable,
with the stand-in server beside them as `sglang_standin`."""
from __future__ import annotations

import shutil
from pathlib import Path

from fleetpatch_demo.standinsite import install_sglang_standin
from fleetpatch_demo.wheels import sglang_tree


def standin_site(folder: Path, version: str) -> Path:
    """`folder` made such a site for `version`; returned."""
    shutil.copytree(sglang_tree(version), folder)
    for p in folder.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
    install_sglang_standin(folder)
    return folder
