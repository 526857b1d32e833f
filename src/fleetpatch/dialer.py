"""The TCP connection under an SSH session, on the standard library alone.

`dial` opens it; in a host's first contact it is made in a thread of its own,
so Ctrl-C drops a connect that is still waiting (a host behind a firewall
holds it for its whole connect timeout) at once. `handshaking` lets Ctrl-C cut
the SSH handshake on it the same way.
"""
from __future__ import annotations

import contextlib
import socket
import threading

_KEEP = 120  # bytes of a non-SSH greeting kept to quote in the message


class WatchedSocket:
    """A connected TCP socket that remembers the first bytes the server sent,
    so a failed handshake can say whether the server spoke at all."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.received = b""

    def recv(self, n: int, *flags) -> bytes:
        data = self._sock.recv(n, *flags)
        if len(self.received) < _KEEP:
            self.received += data[:_KEEP - len(self.received)]
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _connect(address: str, port: int, timeout: float | None) -> WatchedSocket:
    return WatchedSocket(socket.create_connection((address, port), timeout=timeout))


def dial(address: str, port: int, timeout: float | None) -> WatchedSocket:
    """Open the TCP connection paramiko will use (pass it as `sock=`); raises what
    `socket.create_connection` raises, or HandshakeAborted on Ctrl-C in a first contact."""
    if not _in_first():
        return _connect(address, port, timeout)
    connecting = _Connecting(address, port, timeout)
    return connecting.result()


class _Connecting:
    """`_connect` in a thread of its own, waited for in slices, so that Ctrl-C
    (`abort_first_contacts`) ends the wait at once; a socket that connects after
    that is closed."""

    def __init__(self, address: str, port: int, timeout: float | None):
        self.where = f"{address}:{port}"
        self._sock: WatchedSocket | None = None
        self._error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(address, port, timeout), daemon=True,
                                        name=f"fleetpatch-dial-{self.where}")
        self._thread.start()

    def _run(self, address: str, port: int, timeout: float | None) -> None:
        try:
            sock = _connect(address, port, timeout)
        except BaseException as e:   # raised again, in the caller's thread, by result()
            self._error = e
            return
        with self._lock:
            if self._abandoned:
                sock.close()
            else:
                self._sock = sock

    def result(self) -> WatchedSocket:
        while self._thread.is_alive():
            self._thread.join(0.1)
            if first_contact_aborted():
                with self._lock:
                    self._abandoned = True
                    sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
                raise HandshakeAborted(self.where)
        if self._error is not None:
            raise self._error
        return self._sock


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
