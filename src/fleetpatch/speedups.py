"""Speed tricks, fenced: every step fleetpatch takes only to be faster than the
standard library's and paramiko's defaults is here, and one switch turns all of
them off.

    FLEETPATCH_SPEEDUPS=0 fleetpatch rollout …     # also: off, no, false

With the switch off fleetpatch runs on the defaults alone; a fault that goes
away with it is one of these tricks (the test suite runs the SSH paths both
ways). A trick stays only while it saves at least 5 % of the bench's 8-host
rollout (bench/README.md, "Speed tricks"); both left are socket options on the
laptop's own SSH socket, no private API of paramiko and no process-wide state.
Where the platform lacks an option (TCP_QUICKACK is Linux's), that trick is off.
"""
from __future__ import annotations

import os
import socket

SWITCH = "FLEETPATCH_SPEEDUPS"
_OFF = ("0", "off", "no", "false")


def enabled() -> bool:
    """Read at every use, so the switch holds for whatever the process does next."""
    return os.environ.get(SWITCH, "").strip().lower() not in _OFF


def tune_socket(sock: socket.socket) -> None:
    """TCP_NODELAY on the SSH socket. paramiko writes each SSH message as it is ready,
    so the handshake is full of small writes that follow one another (NEWKEYS then
    SERVICE_REQUEST, say); with Nagle's algorithm the second waits for the first
    one's ACK, which the server delays (40 ms on Linux) because it is waiting for
    that very second message."""
    if not enabled():
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass   # a socket that refuses it keeps Nagle: slower, not wrong


class QuickAck:
    """TCP_QUICKACK after every read of the SSH socket: ACK what came at once.
    sshd sends small messages the client need not answer (hostkeys-00 after the
    login), and with its Nagle on, its next message (the channel's confirmation)
    waits for our ACK, which the kernel would delay 40 ms. Linux leaves quick-ack
    mode by itself, hence at every read."""

    def __init__(self, option: int):
        self.option = option
        self.working = True

    def __call__(self, sock: socket.socket) -> None:
        if not self.working:
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, self.option, 1)
        except OSError:
            self.working = False


def quick_ack() -> QuickAck | None:
    """What to call after each read of a new SSH socket, or None (switch off, not Linux)."""
    option = getattr(socket, "TCP_QUICKACK", None)
    if option is None or not enabled():
        return None
    return QuickAck(option)
