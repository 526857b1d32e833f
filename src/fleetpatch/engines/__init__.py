"""Engine profiles: what fleetpatch knows about each serving engine.

`get(kind)` returns the profile object for an inventory's `engine.kind`.
"""
from __future__ import annotations

from ..errors import UsageError
from .base import LaunchConfig, Prediction

KINDS = ("sglang",)


class UnknownEngine(UsageError, ValueError):
    """An inventory names an engine kind fleetpatch has no profile for (exit 2)."""


def get(kind: str):
    """The profile for engine `kind` (e.g. "sglang"); UnknownEngine for any other kind."""
    name = (kind or "").strip().lower()
    if name == "sglang":
        from .sglang import PROFILE

        return PROFILE
    raise UnknownEngine(
        f"unknown engine kind {kind!r}: fleetpatch has profiles for {', '.join(KINDS)} "
        f"(set engine.kind in the inventory to one of them)"
    )


__all__ = ["get", "KINDS", "UnknownEngine", "LaunchConfig", "Prediction"]
