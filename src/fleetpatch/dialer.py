"""The TCP connection under an SSH session, on the standard library alone.

`dial` opens it; in a host's first contact it is made in a thread of its own,
so Ctrl-C drops a connect that is still waiting (a host behind a firewall
holds it for its whole connect timeout) at once. `Interrupt.handshaking` lets
Ctrl-C cut the SSH handshake on it the same way. A run's Ctrl-C is one
`Interrupt`, which the run's Job carries.
"""
from __future__ import annotations

import contextlib
import socket
import threading

_KEEP = 120  # bytes of a non-SSH greeting kept to quote in the message
# Linux only (a laptop on macOS has no such option, and keeps the kernel's delayed ACKs)
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


class WatchedSocket:
    """A connected TCP socket that remembers the first bytes the server sent,
    so a failed handshake can say whether the server spoke at all.

    It also ACKs at once what it receives. sshd leaves Nagle's algorithm on in a
    session without a terminal, so of two small packets it sends in a row (the
    agent's reply lines, a channel's exit status after its data) the second waits
    for the ACK of the first, and the kernel delays that ACK by up to 40 ms: on
    loopback an exec round trip took 50 ms instead of 7, every agent request one
    such wait. TCP_QUICKACK does not stay set, so it is set after every read."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.received = b""

    def recv(self, n: int, *flags) -> bytes:
        data = self._sock.recv(n, *flags)
        if _QUICKACK is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass
        if len(self.received) < _KEEP:
            self.received += data[:_KEEP - len(self.received)]
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _connect(address: str, port: int, timeout: float | None) -> WatchedSocket:
    sock = socket.create_connection((address, port), timeout=timeout)
    # Without it each small write that follows an unacknowledged one (the handshake's and the
    # authentication's messages, a request after a decision) waits for the host's delayed ACK:
    # the publickey authentication took 52 ms instead of 9 on loopback.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return WatchedSocket(sock)


def dial(address: str, port: int, timeout: float | None, interrupt: "Interrupt | None" = None) -> WatchedSocket:
    """Open the TCP connection paramiko will use (pass it as `sock=`); raises what
    `socket.create_connection` raises, or HandshakeAborted on Ctrl-C (`interrupt`) in a first contact."""
    if interrupt is None or not interrupt.in_first_contact():
        return _connect(address, port, timeout)
    connecting = _Connecting(address, port, timeout, interrupt)
    return connecting.result()


class _Connecting:
    """`_connect` in a thread of its own, waited for in slices, so that Ctrl-C
    (`Interrupt.fire`) ends the wait at once; a socket that connects after
    that is closed."""

    def __init__(self, address: str, port: int, timeout: float | None, interrupt: "Interrupt"):
        self.where, self.interrupt = f"{address}:{port}", interrupt
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
            if self.interrupt.first_contact_aborted():
                with self._lock:
                    self._abandoned = True
                    sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
                raise HandshakeAborted(self.where)
        if self._error is not None:
            raise self._error
        return self._sock


class HandshakeAborted(Exception):
    """Ctrl-C came while this host's first connection was being made."""


def _shutdown(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)   # paramiko's reader sees the end; its owner closes it
    except OSError:
        pass


class Interrupt:
    """One run's Ctrl-C, as the hosts at work see it (`fire` is called once it came).

    A host still making its first connection has been sent nothing yet, so that
    connection is dropped at once instead of waited out (up to its banner timeout):
    only inside `first_contact` (the thread making a host's first connection of the
    run, or router.via's connection for a host's first router call), so that every
    later connection (a redial to release a lock, a via host putting a worker back
    into its router) is always let finish. A host still
    draining goes back into its routers untouched (drain.py asks `is_set`)."""

    def __init__(self) -> None:
        self.cause = "Ctrl-C"   # what fired it, for the messages: "Ctrl-C", "SIGTERM" or "SIGHUP"
        self._fired = threading.Event()
        self._first = threading.local()
        self._handshaking: set = set()
        self._lock = threading.Lock()

    def fire(self, cause: str = "Ctrl-C") -> None:
        self.cause = cause
        self._fired.set()
        with self._lock:
            socks = list(self._handshaking)
        for sock in socks:
            _shutdown(sock)

    def is_set(self) -> bool:
        return self._fired.is_set()

    @contextlib.contextmanager
    def first_contact(self):
        outer = self.in_first_contact()   # nested (a via host dialled for a host's first call): kept
        self._first.on = True
        try:
            yield
        finally:
            self._first.on = outer

    def in_first_contact(self) -> bool:
        return getattr(self._first, "on", False)

    def first_contact_aborted(self) -> bool:
        return self.in_first_contact() and self._fired.is_set()

    @contextlib.contextmanager
    def handshaking(self, sock):
        """The SSH handshake on `sock`: shut by `fire` if it is a first contact."""
        if sock is None or not self.in_first_contact():
            yield
            return
        with self._lock:
            self._handshaking.add(sock)
        if self._fired.is_set():
            _shutdown(sock)
        try:
            yield
        finally:
            with self._lock:
                self._handshaking.discard(sock)
