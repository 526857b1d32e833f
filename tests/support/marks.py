"""Skip marks for what a machine lacks."""
from __future__ import annotations

import os

import pytest

from fleetpatch_demo import fleet as fleetmod

# real sshd test hosts: root (mount namespaces, host users) and the OpenSSH server
needs_fleet = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd")

# a fault that only root can make on a local host (chattr +i: CAP_LINUX_IMMUTABLE)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr +i)")
