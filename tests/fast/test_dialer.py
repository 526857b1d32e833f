"""The early dial: the TCP connection is opened while paramiko and Fabric load,
used only where Fabric resolves the host to the same address, and never opened
where an ssh_config entry could send the host elsewhere. Real sockets on
loopback; the whole SSH path is covered by every fleet test."""
from __future__ import annotations

import socket
import threading

import pytest

from fleetpatch import dialer
from fleetpatch.errors import Status
from fleetpatch import ssh_errors


class Listener:
    """127.0.0.1, a free port; remembers whether each client hung up unused."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.hung_up = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
            conn.settimeout(5)
            if conn.recv(16) == b"":
                self.hung_up.set()
        except OSError:
            pass

    def close(self):
        self.sock.close()


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


@pytest.fixture
def no_ssh_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(dialer, "SSH_CONFIG_FILES", ("~/.ssh/config",))
    return tmp_path


def test_the_socket_is_used_where_fabric_resolves_the_same_address(listener, no_ssh_config):
    early = dialer.early_dial("127.0.0.1", listener.port, 5, through_jump=False)
    sock = early.take("127.0.0.1", listener.port)
    assert isinstance(sock, dialer.WatchedSocket)
    assert sock.getpeername() == ("127.0.0.1", listener.port)
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    sock.close()


def test_a_host_resolved_elsewhere_gets_the_early_socket_closed(listener, no_ssh_config):
    early = dialer.early_dial("127.0.0.1", listener.port, 5, through_jump=False)
    assert early.take("127.0.0.1", listener.port + 1) is None
    assert listener.hung_up.wait(5), "the unused early connection stayed open"


def test_the_dials_own_error_comes_back_to_describe(no_ssh_config):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()   # nothing listens there
    early = dialer.early_dial("127.0.0.1", port, 5, through_jump=False)
    with pytest.raises(ConnectionRefusedError) as exc:
        early.take("127.0.0.1", port)
    failure = ssh_errors.describe(exc.value, where="gpu-a01 (root@127.0.0.1)", address="127.0.0.1", port=port,
                                  banner_timeout=1)
    assert failure.status == Status.UNREACHABLE and "connection refused" in failure.message


@pytest.mark.parametrize("line", ["HostName 10.0.0.9", "  port=2222", "ProxyJump bastion", "Match host x",
                                  "proxycommand nc %h %p"])
def test_an_ssh_config_that_could_redirect_a_host_means_no_early_dial(no_ssh_config, line):
    (no_ssh_config / ".ssh").mkdir()
    (no_ssh_config / ".ssh" / "config").write_text(f"Host gpu-*\n{line}\n")
    assert dialer.early_dial("127.0.0.1", 22, 5, through_jump=False) is None


def test_an_ssh_config_without_redirects_and_no_jump(listener, no_ssh_config):
    (no_ssh_config / ".ssh").mkdir()
    (no_ssh_config / ".ssh" / "config").write_text("Host *\n  ServerAliveInterval 30\n  User root\n")
    early = dialer.early_dial("127.0.0.1", listener.port, 5, through_jump=False)
    assert early is not None
    early.discard()
    assert listener.hung_up.wait(5)
    assert dialer.early_dial("127.0.0.1", listener.port, 5, through_jump=True) is None
