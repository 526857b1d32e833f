"""Shared exception base classes.

Every error a user can cause before any host is changed (bad command line,
bad inventory, bad patch) is a `UsageError`: the CLI maps it to exit code 2.
Its `str()` is the whole message the user sees: which file, which key or line,
what is wrong, and when useful what to do.
"""
from __future__ import annotations


class FleetpatchError(Exception):
    """Base class of fleetpatch's own errors."""

    exit_code = 1


class UsageError(FleetpatchError):
    """A usage, inventory or patch error found before any host was changed (exit 2)."""

    exit_code = 2
