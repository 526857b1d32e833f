"""The login rides with the service request: with an ed25519 key the signed
login leaves before sshd's answer to the service request arrives (one round
trip fewer per connection), RSA keys keep paramiko's order, and a refused key
still falls through to the next. Real sshd, strict host keys."""
from __future__ import annotations

import os
import subprocess
import time

import paramiko
import pytest

from fleetpatch import sshauth
from support.marks import needs_fleet

pytestmark = needs_fleet

SERVICE_ACCEPT, USERAUTH_REQUEST = 6, 50


class Recording:
    """Notes the type of every message the client sends and receives, in order."""

    def __init__(self, base: type):
        events = self.events = []

        class Recorded(base):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                read = self.packetizer.read_message

                def read_and_note():
                    ptype, m = read()
                    events.append(("received", ptype))
                    return ptype, m
                self.packetizer.read_message = read_and_note

            def _send_message(self, data):
                events.append(("sent", data.asbytes()[0]))
                return super()._send_message(data)
        self.factory = Recorded

    def first(self, event) -> int:
        return self.events.index(event)


def log_in(fleet, key_files, factory) -> paramiko.SSHClient:
    host = fleet.hosts["v1a"]
    client = paramiko.SSHClient()
    client.load_host_keys(str(fleet.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect("127.0.0.1", port=host.ssh_port, username="root", key_filename=[str(k) for k in key_files],
                   look_for_keys=False, allow_agent=False, timeout=10, transport_factory=factory)
    return client


def test_the_signed_login_leaves_before_the_service_is_granted(fleet):
    assert sshauth.transport_factory() is sshauth.Transport
    ours = Recording(sshauth.Transport)
    client = log_in(fleet, [fleet.identity], ours.factory)
    try:
        assert client.get_transport().is_authenticated()
    finally:
        client.close()
    assert ours.first(("sent", USERAUTH_REQUEST)) < ours.first(("received", SERVICE_ACCEPT))

    stock = Recording(paramiko.Transport)   # the control: paramiko alone waits for the answer
    client = log_in(fleet, [fleet.identity], stock.factory)
    client.close()
    assert stock.first(("sent", USERAUTH_REQUEST)) > stock.first(("received", SERVICE_ACCEPT))


def test_a_refused_key_falls_through_to_the_next_one(fleet, tmp_path):
    stranger = tmp_path / "id_stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    ours = Recording(sshauth.Transport)
    client = log_in(fleet, [stranger, fleet.identity], ours.factory)
    try:
        assert client.get_transport().is_authenticated()
    finally:
        client.close()
    assert [e for e in ours.events if e == ("sent", USERAUTH_REQUEST)] == [("sent", USERAUTH_REQUEST)] * 2


def test_an_rsa_key_keeps_paramikos_order(fleet, tmp_path):
    rsa = tmp_path / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)], check=True)
    authorized = fleet.authorized_keys
    before = authorized.read_bytes()
    authorized.write_bytes(before + (tmp_path / "id_rsa.pub").read_bytes())
    try:
        ours = Recording(sshauth.Transport)
        client = log_in(fleet, [rsa], ours.factory)
        try:
            assert client.get_transport().is_authenticated()
        finally:
            client.close()
    finally:
        authorized.write_bytes(before)
    assert ours.first(("sent", USERAUTH_REQUEST)) > ours.first(("received", SERVICE_ACCEPT))


def test_an_agent_key_keeps_paramikos_order(fleet, tmp_path):
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        subprocess.run(["ssh-add", str(fleet.identity)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True)
        os.environ["SSH_AUTH_SOCK"], before = str(sock), os.environ.get("SSH_AUTH_SOCK")
        try:
            keys = paramiko.Agent().get_keys()
        finally:
            if before is None:
                os.environ.pop("SSH_AUTH_SOCK")
            else:
                os.environ["SSH_AUTH_SOCK"] = before
        assert len(keys) == 1
        ours = Recording(sshauth.Transport)
        host = fleet.hosts["v1a"]
        client = paramiko.SSHClient()
        client.load_host_keys(str(fleet.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect("127.0.0.1", port=host.ssh_port, username="root", pkey=keys[0], look_for_keys=False,
                       allow_agent=False, timeout=10, auth_timeout=10, transport_factory=ours.factory)
        try:
            assert client.get_transport().is_authenticated()
        finally:
            client.close()
        assert ours.first(("sent", USERAUTH_REQUEST)) > ours.first(("received", SERVICE_ACCEPT))
    finally:
        agent.terminate()
        agent.wait()
