"""The SGLang releases the profile knows, read from the generated facts files.

`engines/sglang_releases/<release>.json` holds one release's facts (written by
`invoke engine-facts --version <release>` from its wheel, see sglang_wheel.py);
`signatures.json` is the reviewed catalog of the lines the profile recognises.
This module turns them into one `Release` per release.  A release whose
reviewed section is still pending review is not known: nothing is guessed.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from packaging.version import InvalidVersion, Version

from .base import Signature

FACTS_DIR = Path(__file__).resolve().parent / "sglang_releases"
TRACEBACK = "Traceback (most recent call last):"
# Not SGLang's own strings: Python's and argparse's.
F_TRACEBACK = Signature("TRACEBACK", TRACEBACK, "<python>", (), means="a Python exception")
F_ARGPARSE = Signature("ARGPARSE", "error: argument / unrecognized arguments", "<argparse>", (),
                       means="the command line was rejected",
                       regex=r"\berror: (argument -|unrecognized arguments: |the following arguments are required)")


@dataclass(frozen=True)
class Release:
    """What the profile knows of one SGLang release (one facts file)."""

    name: str                             # the release, e.g. "0.5.9"
    policy: str                           # "v2-opt-in" | "v2-default" | "v2-only-env" | "v2-only"
    env_default: Optional[bool]           # SGLANG_ENABLE_SPEC_V2's default; None: the variable is gone
    env_true: Tuple[str, ...]             # what EnvBool reads as true / false
    env_false: Tuple[str, ...]
    v2_algorithms: Tuple[str, ...]        # v2-opt-in: algorithms SGLANG_ENABLE_SPEC_V2 moves to v2
    algorithms: Tuple[str, ...]           # builtin algorithms (after NEXTN -> EAGLE)
    algorithm_choices: Optional[Tuple[str, ...]]  # argparse choices (exact case); None: free text
    multi_layer_any_algorithm: bool       # 0.5.7: scheduler.py checks enable_multi_layer_eagle first
    workers: Tuple[Tuple[str, Tuple[Optional[str], Optional[str]]], ...]  # family -> (v1, v2)
    paths: Tuple[Tuple[str, str], ...]    # worker class -> its file, every worker class of the release
    bases: Tuple[Tuple[str, str], ...]    # worker class -> worker class it inherits from
    siblings: Tuple[Tuple[str, str], ...]  # files that serve one role on the v1 and the v2 path
    files: Tuple[str, ...]                # what `fetch` copies (all exist in this release)
    signatures: Tuple[Signature, ...]     # path evidence in the log
    failures: Tuple[Signature, ...]
    pp_error: Optional[str]               # None: pipeline parallelism + speculative decoding may start
    dump_shape: str                       # "ServerArgs(...)" | "{...}"
    ready_sources: Tuple[str, ...]        # the files that print the ready line (a Rust .so from 0.5.22)
    requires_python: Optional[str]

    @property
    def verified(self) -> Tuple[str, ...]:
        return (self.name,)

    @property
    def worker_map(self) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
        return dict(self.workers)

    @property
    def path_names(self) -> List[str]:
        return [n for n, _ in self.paths]

    def contains(self, version: str) -> bool:
        return release_of(version) == self.name


# Asked for each signature check of each judgement (thousands of times a rollout) with the
# host's few version strings: parsing a Version each time was 0.3 ms a judgement (issue 34).
@functools.lru_cache(maxsize=256)
def release_of(version: Optional[str]) -> Optional[str]:
    """The known release a version string is (PEP 440: a local tag `+cu128` is its
    release); None for a pre-release or dev build, an unknown release or no version."""
    v = parse(version)
    if v is None or v.is_prerelease or v.is_devrelease:
        return None
    return BY_VERSION.get(Version(v.public))


def parse(version: Optional[str]) -> Optional[Version]:
    try:
        return Version(str(version).strip()) if version and str(version).strip() else None
    except InvalidVersion:
        return None


def _catalog_signatures(docs: List[dict], catalog: Dict[str, dict]) -> Dict[str, Signature]:
    """One Signature per catalog entry, with the line of its literal in every release that uses it."""
    lines: Dict[str, Dict[str, int]] = {}
    for doc in docs:
        for sid, found in doc["extracted"]["signature_lines"].items():
            if found:
                lines.setdefault(sid, {})[doc["release"]] = min(found)
    out = {}
    for sid, e in catalog.items():
        where = tuple(sorted(lines.get(sid, {}).items(), key=lambda kv: Version(kv[0])))
        out[sid] = Signature(e["key"], e["text"], e["source"], where, tuple(tuple(kv) for kv in e["sets"]),
                             e["means"], e.get("regex"), e.get("probe"))
    return out


def _release(doc: dict, sigs: Dict[str, Signature]) -> Release:
    r, x = doc["reviewed"], doc["extracted"]
    env = x["env"].get("SGLANG_ENABLE_SPEC_V2")
    env_bool = x["env"].get("EnvBool", {"true": ["true", "1", "yes", "y"], "false": ["false", "0", "no", "n"]})
    choices = x["algorithm_choices"]
    return Release(
        name=doc["release"], policy=r["policy"], env_default=env["default"] if env else None,
        env_true=tuple(env_bool["true"]), env_false=tuple(env_bool["false"]),
        v2_algorithms=tuple(r["v2_algorithms"]), algorithms=tuple(x["algorithms"]),
        algorithm_choices=tuple(choices) if choices is not None else None,
        multi_layer_any_algorithm=r["multi_layer_any_algorithm"],
        workers=tuple((fam, (pair[0], pair[1])) for fam, pair in sorted(r["workers"].items())),
        paths=tuple(sorted(x["workers"].items())), bases=tuple(sorted(x["bases"].items())),
        siblings=tuple((a, b) for a, b in x["siblings"]), files=tuple(x["files"]),
        signatures=tuple(sigs[s] for s in r["signatures"]),
        failures=tuple(sigs[s] for s in r["failures"]) + (F_TRACEBACK, F_ARGPARSE),
        pp_error=sigs[r["pp_error"]].text if r.get("pp_error") else None,
        dump_shape=x["server_args_dump"]["shape"], ready_sources=tuple(d["source"] for d in x["ready"]),
        requires_python=x.get("requires_python"))


def _load(facts_dir: Path = FACTS_DIR) -> Tuple[Tuple[Release, ...], Dict[str, Signature]]:
    catalog = json.loads((facts_dir / "signatures.json").read_text())
    docs = [json.loads(p.read_text()) for p in facts_dir.glob("*.json") if p.name[:1].isdigit()]
    docs = [d for d in docs if not str(d["reviewed"].get("status", "")).startswith("pending")]
    docs.sort(key=lambda d: Version(d["release"]))
    sigs = _catalog_signatures(docs, catalog)
    return tuple(_release(d, sigs) for d in docs), sigs


RELEASES, SIGNATURES = _load()
BY_VERSION: Dict[Version, str] = {Version(r.name): r.name for r in RELEASES}
BY_NAME: Dict[str, Release] = {r.name: r for r in RELEASES}


def _union_paths() -> Dict[str, str]:
    out: Dict[str, str] = {}
    for r in RELEASES:
        for name, f in r.paths:
            out.setdefault(name, f)
    return out


def _union_siblings() -> List[Tuple[str, str]]:
    out: List[Tuple[str, str]] = []
    for r in RELEASES:
        out += [p for p in r.siblings if p not in out]
    return out


PATH_FILES: Dict[str, str] = _union_paths()
SIBLING_PAIRS: List[Tuple[str, str]] = _union_siblings()
