"""Engine profiles: what fleetpatch knows about each serving engine.

`get(kind)` returns the profile for an inventory's `engine.kind`.  A profile is
found in one of two ways, so that a new engine is one new file:

* a module of this package named after the kind (`engines/sglang.py` for
  "sglang") that sets `PROFILE`; it is imported the first time it is asked for;
* `register(profile)`, for a profile that lives elsewhere (a plugin, a test).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, Iterable, Tuple

from ..errors import UsageError
from .base import EngineProfile, Evidence, Facts, LaunchConfig, Prediction, Resolution, Signature, for_node_rank

DEFAULT_KIND = "sglang"   # what an inventory without engine.kind means (inventory.py says the same)

_REGISTERED: Dict[str, EngineProfile] = {}
_NOT_PROFILES = {"base", "sglang_facts", "sglang_wheel", "vllm_wheel", "vllm_members"}   # helpers of the profiles


class UnknownEngine(UsageError, ValueError):
    """An inventory names an engine kind fleetpatch has no profile for (exit 2)."""


def register(profile: EngineProfile) -> EngineProfile:
    """Make `profile` the one `get(profile.kind)` returns."""
    kind = _norm(profile.kind)
    if not kind:
        raise ValueError(f"engine profile {profile!r} has no kind")
    _REGISTERED[kind] = profile
    return profile


def _norm(kind: str) -> str:
    return (kind or "").strip().lower()


def _modules() -> Tuple[str, ...]:
    return tuple(m.name for m in pkgutil.iter_modules(__path__)
                 if not m.name.startswith("_") and m.name not in _NOT_PROFILES)


def kinds() -> Tuple[str, ...]:
    """Every engine kind fleetpatch has a profile for."""
    return tuple(sorted(set(_modules()) | set(_REGISTERED)))


def get(kind: str) -> EngineProfile:
    """The profile for engine `kind` (e.g. "sglang"); UnknownEngine for any other kind."""
    name = _norm(kind)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _modules():
        profile = getattr(importlib.import_module(f"{__name__}.{name}"), "PROFILE", None)
        if profile is None or _norm(profile.kind) != name:
            raise UnknownEngine(f"engine module fleetpatch/engines/{name}.py sets no PROFILE of kind {name!r}")
        return register(profile)
    raise UnknownEngine(
        f"unknown engine kind {kind!r}: fleetpatch has profiles for {', '.join(kinds())} "
        f"(set engine.kind in the inventory to one of them)"
    )


def for_hosts(hosts: Iterable) -> EngineProfile:
    """The one profile of the hosts' `engine.kind` (a patch is for one engine);
    UsageError naming the hosts when they run different engines."""
    by_kind: Dict[str, list] = {}
    for h in hosts:
        by_kind.setdefault(_norm(h.engine.kind) or DEFAULT_KIND, []).append(h.name)
    if len(by_kind) > 1:
        groups = "; ".join(f"{k}: {', '.join(names)}" for k, names in sorted(by_kind.items()))
        raise UsageError(f"the selected hosts run different engines ({groups}): a patch is for one engine; "
                         "select the hosts of one engine with --hosts or --group")
    return get(next(iter(by_kind), DEFAULT_KIND))


def __getattr__(name: str):
    # KINDS is computed when asked, so that a registered profile is a known kind too
    if name == "KINDS":
        return kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["get", "for_node_rank", "register", "kinds", "for_hosts", "KINDS", "DEFAULT_KIND", "UnknownEngine", "EngineProfile",
           "LaunchConfig", "Prediction", "Evidence", "Facts", "Resolution", "Signature"]
