"""The TCP connection under an SSH session, on the standard library alone.

`dial` opens it with the options the handshake wants; `early_dial` starts it
before paramiko and Fabric are imported, so on a slow link its round trip
passes while they load (~0.1 s of the laptop's start-up) instead of after.
This module imports nothing heavy: that is its point.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading

_KEEP = 120  # bytes of a non-SSH greeting kept to quote in the message


class WatchedSocket:
    """A connected TCP socket that remembers the first bytes the server sent,
    so a failed handshake can say whether the server spoke at all."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.received = b""
        self._quickack = getattr(socket, "TCP_QUICKACK", None)   # Linux

    def recv(self, n: int, *flags) -> bytes:
        data = self._sock.recv(n, *flags)
        if len(self.received) < _KEEP:
            self.received += data[:_KEEP - len(self.received)]
        if self._quickack is not None:
            # ACK what came at once (Linux drops quick-ack mode by itself, hence at every
            # read): sshd sends small messages the client need not answer (hostkeys-00 after
            # the login), and with its Nagle on, its next message (the channel's confirmation)
            # waits for our ACK, which the kernel would delay 40 ms.
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, self._quickack, 1)
            except OSError:
                self._quickack = None
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


def dial(address: str, port: int, timeout: float | None) -> WatchedSocket:
    """Open the TCP connection paramiko will use (pass it as `sock=`).

    TCP_NODELAY: paramiko writes each SSH message as it is ready, so the handshake is
    full of small writes that follow one another (NEWKEYS then SERVICE_REQUEST, say); with
    Nagle's algorithm the second waits for the first one's ACK, which the server delays
    (40 ms on Linux) because it is waiting for that very second message."""
    sock = socket.create_connection((address, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass   # a socket that refuses it keeps Nagle: slower, not wrong
    return WatchedSocket(sock)


# ssh_config keywords that can send a host's connection elsewhere than its inventory
# address and port, as paramiko reads the files (it has no Include). Where one is
# written, the address is left for Fabric to resolve and nothing is dialled early.
_REDIRECTING = frozenset({"hostname", "port", "proxyjump", "proxycommand", "match",
                          "canonicalizehostname", "canonicaldomains"})
SSH_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")   # the two Fabric reads
_redirecting_files: dict = {}


def _redirects(path: str) -> bool:
    path = os.path.expanduser(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True   # cannot tell: do not guess
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _redirecting_files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return True
        _redirecting_files[key] = any(
            (words := line.replace("=", " ").split()) and words[0].lower() in _REDIRECTING for line in lines)
    return _redirecting_files[key]


class EarlyDial:
    """A `dial` started in a thread of its own; `take` gives its socket to the
    handshake once Fabric has resolved where the host really is."""

    def __init__(self, address: str, port: int, timeout: float | None):
        self.address, self.port = address, port
        self._sock: WatchedSocket | None = None
        self._error: BaseException | None = None
        self._discarded = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True,
                                        name=f"fleetpatch-dial-{address}:{port}")
        self._thread.start()

    def _run(self, timeout: float | None) -> None:
        try:
            sock = dial(self.address, self.port, timeout)
        except BaseException as e:   # raised again, in the caller's thread, by take()
            self._error = e
            return
        with self._lock:
            if self._discarded:
                sock.close()
            else:
                self._sock = sock

    def take(self, address: str, port: int) -> WatchedSocket | None:
        """The connected socket if it went to `address`:`port` (else None, and it
        is closed); the dial's own error if it failed, as `dial` raises it."""
        if (address, port) != (self.address, self.port):
            self.discard()
            return None
        while self._thread.is_alive():
            self._thread.join(0.1)
            if first_contact_aborted():
                self.discard()
                raise HandshakeAborted(f"{self.address}:{self.port}")
        if self._error is not None:
            raise self._error
        return self._sock

    def discard(self) -> None:
        with self._lock:
            self._discarded = True
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def early_dial(address: str, port: int | None, timeout: float | None, through_jump: bool) -> EarlyDial | None:
    """Dial the inventory's address now, unless a jump host or an ssh_config entry
    could send the connection elsewhere."""
    if through_jump or any(_redirects(p) for p in SSH_CONFIG_FILES):
        return None
    return EarlyDial(address, port or 22, timeout)


# Ctrl-C while a host's first connection is still being made: nothing has been sent
# to the host yet, so the connection is dropped at once instead of waited out (up to
# its banner timeout). Only inside `first_contact` (the thread making a host's first
# connection of the run): every later connection (a redial to release a lock, a via
# host putting a worker back into its router) is always let finish.
_in_first_contact = threading.local()
_handshaking: set = set()
_handshaking_lock = threading.Lock()
_aborted = threading.Event()


class HandshakeAborted(Exception):
    """Ctrl-C came while this host's first connection was being made."""


@contextlib.contextmanager
def first_contact():
    _in_first_contact.on = True
    try:
        yield
    finally:
        _in_first_contact.on = False


def _in_first() -> bool:
    return getattr(_in_first_contact, "on", False)


def first_contact_aborted() -> bool:
    return _in_first() and _aborted.is_set()


def _shutdown(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)   # paramiko's reader sees the end; its owner closes it
    except OSError:
        pass


def abort_first_contacts() -> None:
    _aborted.set()
    with _handshaking_lock:
        socks = list(_handshaking)
    for sock in socks:
        _shutdown(sock)


def reset_first_contacts() -> None:
    _aborted.clear()


@contextlib.contextmanager
def handshaking(sock):
    """The SSH handshake on `sock`: dropped by `abort_first_contacts` if it is a first contact."""
    if sock is None or not _in_first():
        yield
        return
    with _handshaking_lock:
        _handshaking.add(sock)
    if _aborted.is_set():
        _shutdown(sock)
    try:
        yield
    finally:
        with _handshaking_lock:
            _handshaking.discard(sock)
