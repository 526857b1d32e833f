"""Ports for servers that a test starts in another process.

A port from `bind(("127.0.0.1", 0))`, closed and handed on, is free only until the server binds
it: the kernel can hand the same port to another xdist process doing the same in between, and
that server then dies with "Address already in use". Each test process therefore draws from a
block of its own, below the kernel's ephemeral range (which bind(0) and outgoing connections use),
which also keeps them under 55535, the highest --port that SGLang 0.5.15 takes (port + 10000 is its
gRPC port).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

BLOCK = 800
MAX_PROCESSES = 10


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def process_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")      # "gw3"; unset without xdist
    digits = "".join(c for c in worker if c.isdigit())
    return int(digits or 0) % MAX_PROCESSES


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the servers bind
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortBlock:
    """This process's ports, handed out in turn; one that something else holds is passed over."""

    def __init__(self, low: int, size: int):
        self.low, self.size, self.turn = low, size, 0

    @classmethod
    def for_this_process(cls) -> "PortBlock":
        top = ephemeral_low()
        low = top - BLOCK * (process_index() + 1)
        if low < 10000:                       # an unusual range: the kernel's choice, as before
            return cls(0, 0)
        return cls(low, BLOCK)

    def take(self) -> int:
        for _ in range(self.size):
            port = self.low + self.turn % self.size
            self.turn += 1
            if bindable(port):
                return port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


PORTS = PortBlock.for_this_process()


def free_port() -> int:
    return PORTS.take()
