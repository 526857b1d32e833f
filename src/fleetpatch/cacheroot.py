"""Where fleetpatch keeps what it can fetch or work out again on this laptop: engine wheels,
the demo's unpacked trees and router, the probe's splice hints. $FLEETPATCH_CACHE, else
$XDG_CACHE_HOME/fleetpatch, else ~/.cache/fleetpatch."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("FLEETPATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fleetpatch"))
