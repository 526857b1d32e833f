"""Real SGLang source files, taken from the PyPI wheel and cached.

The demo fleet and the tests use the files exactly as released, never a copy
checked into this repo, so a patch that applies here applies to a real install.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import sys
import zipfile
from pathlib import Path

from fleetpatch.cacheroot import cache_root

# What a host tree needs: enough for importlib.metadata to report the version,
# for `find_spec("sglang")` to work, and every file a shipped patch or the
# stand-in touches (arg_groups/: from 0.5.20 ServerArgs is assembled from the
# msgspec Structs declared in arg_groups/fields/).
TREE_MEMBERS = (
    "sglang/__init__.py",
    "sglang/version.py",
    "sglang/srt/server_args.py",
    "sglang/srt/speculative/*",
    "sglang/srt/arg_groups/*",
    "sglang-*.dist-info/*",
)


def wheel_path(version: str) -> Path:
    """The sglang wheel for `version`, downloaded once with pip."""
    from fleetpatch.engines import sglang_wheel   # here: the demo's other commands need none of it

    return sglang_wheel.download(version)   # into sglang_wheel.cache_dir(), the one wheel cache


def trees_dir() -> Path:
    """Where the trees of this TREE_MEMBERS live: one folder per member list, so
    that processes holding another list (other checkouts, running tests) keep
    reading their own trees while this one is built beside them."""
    key = hashlib.sha256("\n".join(TREE_MEMBERS).encode()).hexdigest()[:8]
    return cache_root() / "trees" / key


def tree_is_cached(version: str) -> bool:
    """Whether sglang_tree(version) is already on disk (no download needed)."""
    return (trees_dir() / version / ".complete").exists()


def sglang_tree(version: str) -> Path:
    """A directory holding `sglang/…` and its dist-info from the real wheel (read-only use)."""
    dest = trees_dir() / version
    done = dest / ".complete"
    if done.exists():
        return dest
    whl = wheel_path(version)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(whl) as zf:
        for member in zf.namelist():
            if any(fnmatch.fnmatch(member, pat) for pat in TREE_MEMBERS):
                zf.extract(member, tmp)
    (tmp / ".complete").write_text(whl.name + "\n")
    try:
        tmp.rename(dest)
    except OSError:  # another process got there first
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


if __name__ == "__main__":
    for v in sys.argv[1:] or ["0.5.9"]:
        print(sglang_tree(v))
