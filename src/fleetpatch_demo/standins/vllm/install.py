"""Put the vLLM stand-in (and, for tests and the demo, a release's real vLLM files) into a
host's site-packages directory.  Runs on the controller (not copied to hosts).

* ``install_standin(site_dir)``: ``site_dir/vllm_standin/`` = this package's host-side modules
  (and ``fleetpatch_standin_common/``, which they import), plus ``release.json``: the facts of the release installed in ``site_dir/vllm`` (fleetpatch's
  shipped facts, generated from the same wheel).
* ``install_vllm_files(site_dir, release)``: the release's real files from the PyPI wheel: the
  members fleetpatch's facts read (cached by ``vllm_members``) and the few more the stand-in
  quotes (``vllm/compilation/*.py``, ``vllm/entrypoints/**/api_server.py``) or reads its
  process names from (``vllm/v1/engine/utils.py``, ``vllm/v1/executor/multiproc_executor.py``),
  fetched by HTTP range once per machine.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from fleetpatch.engines import vllm_wheel
from fleetpatch.engines.vllm_members import fetch_members, wheel_file
from fleetpatch_demo.standinsite import COMMON_PACKAGE, COMMON_SOURCE, install_package

HERE = Path(__file__).resolve().parent
PACKAGE = "vllm_standin"
CONTROLLER_ONLY = {"install.py"}
CACHE = Path.home() / ".cache" / "fleetpatch" / "wheels"


EXTRA_FILES = ("vllm/v1/engine/utils.py", "vllm/v1/executor/multiproc_executor.py")


def _extra_member(name: str) -> bool:
    return name.endswith(".py") and (name.startswith("vllm/compilation/") or name in EXTRA_FILES
                                     or (name.startswith("vllm/entrypoints/") and "api_server" in name))


def installed_version(site_dir: Path) -> str:
    import re
    text = (Path(site_dir) / "vllm" / "_version.py").read_text(encoding="utf-8")
    m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
    if not m:
        raise ValueError(f"{site_dir}/vllm/_version.py: no __version__")
    return m.group(1)


def install_standin(site_dir: Path, facts_dir: Path = vllm_wheel.FACTS_DIR) -> Path:
    """Copy the stand-in into site_dir/vllm_standin/ with the facts of the installed release, and
    the stand-ins' common package (fleetpatch_standin_common) it imports."""
    site_dir = Path(site_dir)
    version = installed_version(site_dir)
    facts = Path(facts_dir) / f"{version}.json"
    if not facts.is_file():
        raise ValueError(f"vllm {version} in {site_dir}: fleetpatch has no facts for it ({facts})")
    dest = site_dir / PACKAGE
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for src in sorted(HERE.glob("*.py")):
        if src.name not in CONTROLLER_ONLY:
            shutil.copyfile(src, dest / src.name)
    shutil.copyfile(facts, dest / "release.json")
    install_package(COMMON_SOURCE, site_dir, COMMON_PACKAGE)
    return dest


def members_dirs(release: str, cache: Path = CACHE) -> list:
    """The cached member trees of `release` (fetched if missing): the facts' and the stand-in's."""
    base = cache / f"vllm-{release}.members"
    extra = cache / f"vllm-{release}.standin2.members"
    missing = [d for d in (base, extra) if not d.is_dir()]
    if missing:
        w = wheel_file(release)
        for d in missing:
            wanted = vllm_wheel.wanted if d == base else _extra_member
            fetch_members(w["url"], w["size"], wanted, d, w["filename"])
    return [base / "files", extra / "files"]


def install_vllm_files(site_dir: Path, release: str, cache: Path = CACHE) -> Path:
    """Copy the release's real vLLM files into site_dir (vllm/ and its dist-info)."""
    site_dir = Path(site_dir)
    site_dir.mkdir(parents=True, exist_ok=True)
    for d in members_dirs(release, cache):
        shutil.copytree(d, site_dir, dirs_exist_ok=True)
    return site_dir / "vllm"
