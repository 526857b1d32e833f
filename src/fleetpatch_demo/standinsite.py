"""The stand-in servers put into a host's site-packages, as the demo and the tests do.

``fleetpatch_demo/standins/common/`` goes in as the package ``fleetpatch_standin_common``
(COMMON_PACKAGE: the name an engine's stand-in imports it by) and the SGLang stand-in as
``sglang_standin`` (started with ``python -m sglang_standin <launch flags>``).
"""
from __future__ import annotations

import shutil
from pathlib import Path

STANDINS = Path(__file__).with_name("standins")
COMMON_SOURCE = STANDINS / "common"
COMMON_PACKAGE = "fleetpatch_standin_common"
SGLANG_SOURCE = STANDINS / "sglang"
SGLANG_PACKAGE = "sglang_standin"


def sglang_standin_available() -> bool:
    """Whether this checkout holds the SGLang stand-in."""
    return (SGLANG_SOURCE / "__main__.py").is_file()


def install_package(source: Path, site: Path, name: str) -> Path:
    """The package folder `source` copied (its .py files) into `site` as package `name`,
    replacing what was there; its path."""
    dest = Path(site) / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def install_sglang_standin(site: Path) -> list[Path]:
    """The SGLang stand-in and the common package installed in `site`; what was written."""
    return [install_package(COMMON_SOURCE, site, COMMON_PACKAGE),
            install_package(SGLANG_SOURCE, site, SGLANG_PACKAGE)]


def sglang_standin_installed(site: Path) -> bool:
    """Whether `site` holds the SGLang stand-in."""
    return (Path(site) / SGLANG_PACKAGE / "__main__.py").is_file()
