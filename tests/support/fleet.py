"""The shared test fleet's hosts (the `fleet` fixture starts them) and the mark that
skips a test on a machine that cannot run real sshd hosts."""
from __future__ import annotations

import os

import pytest

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo.fleet import HostSpec

# v1 hosts: launched without SGLANG_ENABLE_SPEC_V2 and with topk 4 (the
# motivating configuration); v2 hosts: SGLANG_ENABLE_SPEC_V2=True, topk 1.
FLEET_SPECS = [
    HostSpec("v1a", version="0.5.9", spec_v2=False),
    HostSpec("v2a", version="0.5.9", spec_v2=True),
    HostSpec("v1b", version="0.5.9", spec_v2=False),
    HostSpec("v2b", version="0.5.9", spec_v2=True),
    HostSpec("old", version="0.5.8", spec_v2=False),
]

needs_fleet = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd")
