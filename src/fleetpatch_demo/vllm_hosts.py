"""vLLM hosts of the demo fleet and the tests (``HostSpec(..., engine="vllm")``).

Such a host carries a vLLM release's real files in its site-packages: the members
of the release's PyPI wheel that fleetpatch's facts are read from (vllm/envs.py,
config/, engine/, entrypoints/, v1/worker/, v1/spec_decode/, ... and the
dist-info's METADATA, which is what ``importlib.metadata.version("vllm")`` reads),
fetched once by HTTP range into ``~/.cache/fleetpatch/wheels/vllm-<release>.members/``,
plus the few more the stand-in quotes (``vllm-<release>.standin.members/``; both by
the stand-in's ``install.members_dirs``).  Beside them, the vLLM stand-in server as the package ``vllm_standin``
(fleetpatch_demo/standins/vllm/), started the way ``vllm serve`` is::

    <python> -m vllm_standin serve <mount>/models/demo \\
        --speculative-config '{"method": "eagle3", "model": "<mount>/models/demo-draft", \\
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
import shlex
import shutil
from pathlib import Path

from .standins.vllm import install as standin_install
from fleetpatch.cacheroot import cache_root

ENGINE = "vllm"
# The releases the tests and the demo carry: V0/V1 (0.10.2), V2 opt-in (0.20.2), V2 by default with
# V1 still shipped (0.33.0), V2 only (0.34.0).
TEST_RELEASES = ("0.10.2", "0.20.2", "0.33.0", "0.34.0")
STANDIN_PACKAGE = Path(__file__).resolve().parent / "standins" / "vllm"
STANDIN_MODULE = "vllm_standin"          # its name in a host's site-packages
MODEL = "models/demo"                    # under the host's mount point (or / in a container)
DRAFT_MODEL = "models/demo-draft"
MODEL_ARCHITECTURE = "LlamaForCausalLM"
# the draft model's architecture per method, as vLLM's model registry names EAGLE drafts
DRAFT_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "Eagle3LlamaForCausalLM"}
# EAGLE-3, as most EAGLE deployments run it (EagleProposer on Model Runner V1, EagleSpeculator on V2).
DEFAULT_METHOD = "eagle3"
NUM_SPECULATIVE_TOKENS = 3


def speculative_config(model_root: str, method: str = DEFAULT_METHOD) -> str:
    """The --speculative-config JSON the hosts are launched with (the draft model in the host's models/)."""
    doc = {"method": method, "model": f"{model_root.rstrip('/')}/{DRAFT_MODEL}",
           "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    return json.dumps(doc)


ENTRYPOINTS = ("serve", "api_server")   # `vllm serve MODEL`, or `-m vllm.entrypoints.openai.api_server --model M`


def serve_args(model_root: str, port: int, method: str = DEFAULT_METHOD, args=(), entrypoint: str = "serve") -> list:
    """What follows ``vllm serve`` (and ``python -m vllm_standin serve``): the model, the
    speculative config, the port, any extra flags.  The older ``api_server`` entrypoint takes
    the model as ``--model``."""
    model = f"{model_root.rstrip('/')}/{MODEL}"
    return [*([model] if entrypoint == "serve" else ["--model", model]),
            "--speculative-config", speculative_config(model_root, method), "--port", str(port),
            *(str(a) for a in args)]


def start_command(port: int, model_root: str, method: str = DEFAULT_METHOD, args=(), entrypoint: str = "serve") -> str:
    """The inventory's ``server.restart.start`` of a vLLM host (``{python}`` unexpanded): the stand-in
    as ``vllm serve`` is started, or (``api_server``) as ``python -m vllm.entrypoints.openai.api_server``."""
    module = f"{STANDIN_MODULE} serve" if entrypoint == "serve" else f"{STANDIN_MODULE}.api_server"
    return "{python} -m " + module + " " + shlex.join(serve_args(model_root, port, method, args, entrypoint))


def model_files(root: Path, architecture: str = MODEL_ARCHITECTURE, method: str = DEFAULT_METHOD) -> None:
    """The target and the draft model's config.json under `root` (the host's mount point, or an
    image's /): the stand-in reads ``architectures`` from them, as vLLM does from a model's config."""
    draft = DRAFT_ARCHITECTURES.get(method, DRAFT_ARCHITECTURES[DEFAULT_METHOD])
    for sub, arch in ((MODEL, architecture), (DRAFT_MODEL, draft)):
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "llama"}, indent=1) + "\n")


# ---------------------------------------------------------------- the release's files


def trees_dir(member_dirs) -> Path:
    """One folder per member selection (the file lists of the cached members), so that a process
    holding another selection keeps reading its own trees while this one is built beside them."""
    names = sorted(f"{i}:{p.relative_to(d)}" for i, d in enumerate(member_dirs) for p in Path(d).rglob("*.py"))
    return cache_root() / "trees" / f"vllm-{hashlib.sha256(chr(10).join(names).encode()).hexdigest()[:8]}"


def vllm_tree(version: str) -> Path:
    """A directory holding ``vllm/…`` and ``vllm-<version>.dist-info/METADATA`` from the real wheel
    (read-only use): the members fleetpatch's facts read and the few more the stand-in quotes,
    both cached by HTTP range once per machine (the stand-in's install.members_dirs)."""
    dirs = standin_install.members_dirs(version)
    dest = trees_dir(dirs) / version
    if (dest / ".complete").exists():
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for d in dirs:
        shutil.copytree(d, tmp, dirs_exist_ok=True)
    (tmp / ".complete").write_text(version + "\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(dest)
    except OSError:   # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def install_standin(site: Path) -> Path:
    """The stand-in package copied into `site` (which holds a release's vllm/) as ``vllm_standin/``,
    with the facts of that release (the stand-in's install.install_standin); returned."""
    dest = standin_install.install_standin(site)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def standin_available() -> bool:
    return (STANDIN_PACKAGE / "__init__.py").is_file()
