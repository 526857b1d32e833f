"""SSH failures in one line per host, against real sockets on loopback: a
listener that speaks HTTP, one that stays silent, one that hangs up, a closed
port, a name under .invalid, and a real SSH server (paramiko's) that refuses
the key or shows another host key. Nothing from paramiko reaches stderr."""
from __future__ import annotations

import socket
import time

import paramiko
import pytest

from fleetpatch import ssh_errors
from fleetpatch.errors import Status
from support.listeners import Listener, refusing_ssh_server

BANNER_TIMEOUT = 1.0


def attempt(port, address="127.0.0.1", **connect_kw):
    """Connect as remote.py should: our watched socket, paramiko's banner timeout."""
    sock = None
    tried = connect_kw.pop("tried_desc", None)
    try:
        sock = ssh_errors.dial(address, port, timeout=2)
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        for kind, key in connect_kw.pop("known", {}).items():
            client.get_host_keys().add(f"[127.0.0.1]:{port}", key.get_name(), key)
        client.connect("127.0.0.1", port=port, username="root", sock=sock, banner_timeout=BANNER_TIMEOUT,
                       auth_timeout=2, timeout=2, allow_agent=False, look_for_keys=False, **connect_kw)
    except Exception as e:  # noqa: BLE001 - the point is to classify whatever comes
        return ssh_errors.describe(e, ssh_errors.Attempt(
            where="h1 (root@127.0.0.1)", address=address, port=port, banner_timeout=BANNER_TIMEOUT,
            connect_timeout=2, user="root", tried=tried), sock)
    raise AssertionError("the connection was expected to fail")


@pytest.fixture(autouse=True)
def quiet():
    ssh_errors.silence_paramiko()


def test_a_port_that_speaks_http_is_not_an_ssh_server(capfd):
    lst = Listener(lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
    try:
        f = attempt(lst.port)
    finally:
        lst.close()
    assert f.status == Status.UNREACHABLE
    assert f.message.startswith("h1 (root@127.0.0.1): not an SSH server: no SSH banner within 1 s")
    assert "HTTP/1.1 400 Bad Request" in f.message and "\n" not in f.message
    assert capfd.readouterr().err == ""


def test_a_port_that_accepts_and_stays_silent_times_out_waiting_for_the_banner(capfd):
    lst = Listener(lambda c: time.sleep(10))
    t = time.monotonic()
    try:
        f = attempt(lst.port)
    finally:
        lst.close()
    assert time.monotonic() - t < 5
    assert f.status == Status.UNREACHABLE
    assert "timed out after 1 s waiting for the SSH banner" in f.message
    assert "accepts connections and stays silent" in f.message
    assert capfd.readouterr().err == ""


def test_a_port_that_hangs_up_at_once():
    lst = Listener(lambda c: c.close())
    try:
        f = attempt(lst.port)
    finally:
        lst.close()
    assert "closed the connection without an SSH banner" in f.message


def test_a_closed_port_is_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    f = attempt(port)
    assert f.status == Status.UNREACHABLE
    assert f"connection refused on port {port}: nothing listens there" in f.message


def test_a_name_under_invalid_does_not_resolve():
    t = time.monotonic()
    f = attempt(22, address="gpu-a01.invalid")
    assert time.monotonic() - t < 5
    assert f.status == Status.UNREACHABLE
    assert "the name 'gpu-a01.invalid' does not resolve" in f.message


# ------------------------------------------------------------ a real SSH server

@pytest.fixture(scope="module")
def host_key():
    return paramiko.Ed25519Key.from_private_key_file(_keyfile("host"))


def _keyfile(name, _cache={}):
    import subprocess
    import tempfile
    if name not in _cache:
        d = tempfile.mkdtemp()
        path = f"{d}/{name}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
        _cache[name] = path
    return _cache[name]


def test_a_refused_key_says_authentication_failed_and_what_was_tried(host_key, capfd):
    lst = refusing_ssh_server(host_key)
    try:
        f = attempt(lst.port, known={"k": host_key}, key_filename=[_keyfile("client")],
                    tried_desc=["publickey ~/.ssh/id_ed25519"])
    finally:
        lst.close()
    assert f.status == Status.AUTH_FAILED, f.message
    assert "authentication failed as root (tried: publickey ~/.ssh/id_ed25519" in f.message
    assert capfd.readouterr().err == ""


def test_an_unknown_host_key_is_refused(host_key):
    lst = refusing_ssh_server(host_key)
    try:
        f = attempt(lst.port, key_filename=[_keyfile("client")])
    finally:
        lst.close()
    assert f.status == Status.HOST_KEY_REJECTED
    assert "unknown host key" in f.message and "--accept-new-host-keys" in f.message


def test_a_changed_host_key_names_both_fingerprints(host_key):
    other = paramiko.Ed25519Key.from_private_key_file(_keyfile("other"))
    lst = refusing_ssh_server(host_key)
    try:
        f = attempt(lst.port, known={"k": other}, key_filename=[_keyfile("client")])
    finally:
        lst.close()
    assert f.status == Status.HOST_KEY_REJECTED
    assert "the host key CHANGED" in f.message
    assert ssh_errors.fingerprint(other) in f.message and ssh_errors.fingerprint(host_key) in f.message
    assert f"ssh-keygen -R [127.0.0.1]:{lst.port}" in f.message


def test_the_fingerprint_is_openssh_s(host_key):
    import subprocess
    out = subprocess.run(["ssh-keygen", "-l", "-f", _keyfile("host") + ".pub"], capture_output=True, text=True,
                         check=True).stdout
    assert ssh_errors.fingerprint(host_key) in out
