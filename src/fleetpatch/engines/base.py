"""Records shared by every engine profile: how a server was launched, and what
the profile predicts from that launch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class LaunchConfig:
    """How the server was (or will be) started."""

    argv: List[str]            # the server's argv (from /proc/<pid>/cmdline, or shlex.split of start)
    env: Dict[str, str]        # its environment (from /proc/<pid>/environ, or restart.env)
    source: str = "inventory"  # "process" | "inventory"


@dataclass
class Prediction:
    """Which code path a launch configuration selects on one engine version.

    The six first fields are the documented interface (docs/internals.md);
    the rest are extras with defaults.
    """

    path: Optional[str]          # "EAGLEWorker", "EAGLEWorkerV2", ... or None (no speculative decoding / unknown)
    file: Optional[str]          # "sglang/srt/speculative/eagle_worker.py"
    starts: bool                 # False when the launch fails at startup (e.g. spec v2 + topk > 1)
    cause: str                   # human reason for the path (or for not starting)
    error: Optional[str]         # the startup error text when starts is False
    known_version: bool          # False: the profile does not know this engine version; nothing is guessed
    version: str = ""            # the engine version predicted for
    algorithm: Optional[str] = None   # speculative algorithm as ServerArgs ends up with it (NEXTN -> EAGLE)
    multi_layer: bool = False         # --enable-multi-layer-eagle
    overlap: Optional[bool] = None    # overlap scheduling on (None: unknown / not applicable)
    range: Optional[str] = None       # the profile's version range, e.g. "0.5.8-0.5.10"
    inputs: str = ""                  # the launch settings the prediction used, for messages
    notes: List[str] = field(default_factory=list)  # caveats (e.g. --config file not read)
