"""vLLM hosts of the demo fleet and the tests (``HostSpec(..., engine="vllm")``).

Such a host carries a vLLM release's real files in its site-packages: the members
of the release's PyPI wheel that fleetpatch's facts are read from (vllm/envs.py,
config/, engine/, entrypoints/, v1/worker/, v1/spec_decode/, ... and the
dist-info's METADATA, which is what ``importlib.metadata.version("vllm")`` reads),
fetched once by HTTP range (fleetpatch.engines.vllm_wheel.members) into
``~/.cache/fleetpatch/wheels/vllm-<release>.members/``, plus whatever more the
stand-in imports (its ``EXTRA_MEMBERS``, fetched the same way into a cache of its
own).  Beside them, the vLLM stand-in server as the package ``vllm_standin``
(fleetpatch_demo/standins/vllm/), started the way ``vllm serve`` is::

    <python> -m vllm_standin serve <mount>/models/demo \\
        --speculative-config '{"method": "eagle3", "model": "<mount>/models/demo-eagle3", \\
                               "num_speculative_tokens": 3}' --port P

and which model runner runs is chosen by the release's own rules from the
environment (``VLLM_USE_V2_MODEL_RUNNER``, ``VLLM_USE_V1``) and the model's
``config.json`` (``architectures``), as vLLM chooses it.

Everything here is pure: paths and strings for fleet.py, images.py and run_vllm.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
from pathlib import Path

from fleetpatch.engines import vllm_members, vllm_wheel

from .wheels import cache_dir

ENGINE = "vllm"
# The releases the tests and the demo carry: V0/V1 (0.10.2), V2 opt-in (0.20.2), V2 by default with
# V1 still shipped (0.33.0), V2 only (0.34.0).
TEST_RELEASES = ("0.10.2", "0.20.2", "0.33.0", "0.34.0")
STANDIN_PACKAGE = Path(__file__).resolve().parent / "standins" / "vllm"
STANDIN_MODULE = "vllm_standin"          # its name in a host's site-packages
MODEL = "models/demo"                    # under the host's mount point (or / in a container)
DRAFT_MODEL = "models/demo-eagle3"
MODEL_ARCHITECTURE = "LlamaForCausalLM"
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
DEFAULT_METHOD = "eagle3"
NUM_SPECULATIVE_TOKENS = 3


def speculative_config(model_root: str, method: str = DEFAULT_METHOD) -> str:
    """The --speculative-config JSON the hosts are launched with (the draft model in the host's models/)."""
    doc = {"method": method, "model": f"{model_root.rstrip('/')}/{DRAFT_MODEL}",
           "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    return json.dumps(doc)


def serve_args(model_root: str, port: int, method: str = DEFAULT_METHOD, args=()) -> list:
    """What follows ``vllm serve`` (and ``python -m vllm_standin serve``): the model, the
    speculative config, the port, any extra flags."""
    return [f"{model_root.rstrip('/')}/{MODEL}", "--speculative-config", speculative_config(model_root, method),
            "--port", str(port), *(str(a) for a in args)]


def start_command(port: int, model_root: str, method: str = DEFAULT_METHOD, args=()) -> str:
    """The inventory's ``server.restart.start`` of a vLLM host (``{python}`` unexpanded)."""
    return "{python} -m " + STANDIN_MODULE + " serve " + shlex.join(serve_args(model_root, port, method, args))


def model_files(root: Path, architecture: str = MODEL_ARCHITECTURE) -> None:
    """The target and the draft model's config.json under `root` (the host's mount point, or an
    image's /): the stand-in reads ``architectures`` from them, as vLLM does from a model's config."""
    for sub, arch in ((MODEL, architecture), (DRAFT_MODEL, DRAFT_ARCHITECTURE)):
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "llama"}, indent=1) + "\n")


# ---------------------------------------------------------------- the release's files


def extra_pattern() -> str:
    """The stand-in's EXTRA_MEMBERS (a regex over wheel member names, in its __init__.py): the
    members it imports beyond the facts' own, or "" when it names none."""
    init = STANDIN_PACKAGE / "__init__.py"
    try:
        text = init.read_text()
    except OSError:
        return ""
    m = re.search(r"^EXTRA_MEMBERS\s*=\s*r?(['\"])(.*?)\1\s*$", text, re.M)
    return m.group(2) if m else ""


def trees_dir(base: Path) -> Path:
    """One folder per member selection (the facts' members as cached under `base`, and the
    stand-in's pattern), so that a process holding another selection keeps reading its own
    trees while this one is built beside them."""
    names = sorted(str(p.relative_to(base)) for p in base.rglob("*.py"))
    key = hashlib.sha256("\n".join([extra_pattern(), *names]).encode()).hexdigest()[:8]
    return cache_dir() / "trees" / f"vllm-{key}"


def vllm_tree(version: str) -> Path:
    """A directory holding ``vllm/…`` and ``vllm-<version>.dist-info/METADATA`` from the real wheel
    (read-only use): the facts' members, and the stand-in's extra members where it names some."""
    base = vllm_wheel.members(version)
    files = base.root / "files"
    dest = trees_dir(files) / version
    if (dest / ".complete").exists():
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(files, tmp)
    pattern = extra_pattern()
    if pattern:
        more = _extra_cache(version, pattern) / "files"
        for src in more.rglob("*"):
            out = tmp / src.relative_to(more)
            if src.is_file() and not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out)
    (tmp / ".complete").write_text(base.wheel + "\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(dest)
    except OSError:   # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _extra_cache(version: str, pattern: str) -> Path:
    """The stand-in's extra members of vllm==version, fetched by range once (keyed by its pattern)."""
    key = hashlib.sha256(pattern.encode()).hexdigest()[:8]
    dest = cache_dir() / "wheels" / f"vllm-{version}.standin-{key}.members"
    if (dest / "wheel.json").is_file():
        return dest
    shutil.rmtree(dest.with_name(dest.name + ".part"), ignore_errors=True)
    wanted = re.compile(pattern)
    try:
        info = vllm_members.wheel_file(version)
        vllm_members.fetch_members(info["url"], info["size"], lambda n: bool(wanted.match(n)), dest,
                                   info["filename"])
    except OSError as e:
        raise RuntimeError(f"could not fetch vllm=={version}'s wheel members for the stand-in: {e}") from None
    return dest


def install_standin(site: Path) -> Path:
    """The stand-in package put into `site` as ``vllm_standin/`` by its own installer (its host-side
    modules and ``release.json``, the facts of the release in ``site/vllm``); returned."""
    if not (STANDIN_PACKAGE / "__init__.py").is_file():
        raise FileNotFoundError(f"the vLLM stand-in is missing: {STANDIN_PACKAGE}")
    from .standins.vllm import install as standin_install
    dest = standin_install.install_standin(site)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def standin_available() -> bool:
    return (STANDIN_PACKAGE / "__init__.py").is_file()
