"""The SSH socket: `dial` connects, a failed connect comes back to `describe` as
it was raised, and Ctrl-C ends a first contact's connect that is still waiting.
Real sockets on loopback; the whole SSH path is covered by every fleet test."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from fleetpatch import dialer
from fleetpatch import ssh_errors
from fleetpatch.errors import Status


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def full_port():
    """A port whose accept queue is full: the kernel drops new SYNs, so a connect
    waits (as towards a host that is down behind a firewall)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    time.sleep(0.1)
    yield port
    for c in fillers:
        c.close()
    srv.close()


def test_the_socket_is_connected_and_watched(listener):
    sock = dialer.dial("127.0.0.1", listener, 5)
    try:
        assert isinstance(sock, dialer.WatchedSocket)
        assert sock.getpeername() == ("127.0.0.1", listener)
    finally:
        sock.close()


def test_small_writes_go_out_at_once_and_what_is_read_is_acked_at_once():
    """The agent's protocol is small requests and replies in turn. Nagle's algorithm on this
    side, or the kernel's delayed ACK of what sshd sends, held each for up to 40 ms."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def echo():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(100):
                conn.sendall(data)
    threading.Thread(target=echo, daemon=True).start()
    sock = dialer.dial("127.0.0.1", srv.getsockname()[1], 5)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        if hasattr(socket, "TCP_QUICKACK"):
            # after a few exchanges the kernel goes over to delayed ACKs (a plain socket reads 0
            # here from the second on); every read turns them off again
            for _ in range(6):
                sock.sendall(b"x")
                assert sock.recv(10) == b"x"
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
    finally:
        sock.close()
        srv.close()


def test_the_dials_own_error_comes_back_to_describe():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()   # nothing listens there
    with pytest.raises(ConnectionRefusedError) as exc:
        dialer.dial("127.0.0.1", port, 5)
    failure = ssh_errors.describe(exc.value, ssh_errors.Attempt(
        where="gpu-a01 (root@127.0.0.1)", address="127.0.0.1", port=port, banner_timeout=1))
    assert failure.status == Status.UNREACHABLE and "connection refused" in failure.message


def test_in_a_first_contact_the_same_error_comes_back():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    interrupt = dialer.Interrupt()
    with interrupt.first_contact(), pytest.raises(ConnectionRefusedError):
        dialer.dial("127.0.0.1", port, 5, interrupt)


def test_ctrl_c_ends_a_first_contacts_connect_that_still_waits(full_port):
    outcome = {}
    interrupt = dialer.Interrupt()   # one run's Ctrl-C

    def connect():
        with interrupt.first_contact():
            try:
                dialer.dial("127.0.0.1", full_port, 30, interrupt)
            except BaseException as e:
                outcome["raised"] = e

    th = threading.Thread(target=connect, daemon=True)
    th.start()
    time.sleep(0.3)
    interrupt.fire()
    th.join(10)
    assert not th.is_alive(), "the connect still waits after Ctrl-C"
    assert isinstance(outcome["raised"], dialer.HandshakeAborted)
    # another run's first contact is not this run's Ctrl-C
    assert not dialer.Interrupt().is_set()
