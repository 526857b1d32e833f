"""The SSH paths with the speed-ups switched off (FLEETPATCH_SPEEDUPS=0): connect,
log in, deploy and verify over real sshd, and a port that never speaks is still
named for what it did. Every other fleet test runs them with the switch on."""
from __future__ import annotations

import os
import socket

import pytest
import yaml

from fleetpatch import speedups
from fleetpatch.errors import HostFailure
from fleetpatch.inventory import parse_inventory
from fleetpatch.remote import SSHTransport

OFF = {speedups.SWITCH: "0"}
needs_sshd = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"),
                                reason="needs root and /usr/sbin/sshd")


@pytest.fixture
def switched_off(monkeypatch):
    monkeypatch.setenv(speedups.SWITCH, "0")


def fleet_host(fleet, name):
    return parse_inventory(yaml.safe_dump(fleet.inventory())).hosts[name]


@needs_sshd
def test_rollout_with_the_switch_off_deploys_and_verifies(operator, fleet):
    doc = operator.inventory()
    doc["hosts"] = {n: doc["hosts"][n] for n in ("v1a", "v2a")}
    operator.write_inventory(doc)
    run = operator.run("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "1", env=OFF)
    assert run.code == 0, run
    assert run.host("v1a")["executed_path"] == "EAGLEWorker"
    assert run.host("v2a")["executed_path"] == "EAGLEWorkerV2"
    assert len(fleet.commands("v1a")) == len(fleet.commands("v2a")) == 1   # one agent per host, as with it on
    status = operator.run("status", env=OFF)
    assert status.code == 0, status
    assert status.host("v1a")["status"] == "ok"


@needs_sshd
def test_the_switch_reaches_the_connection(fleet, switched_off):
    """The login works on a plain socket: no socket option of the speed-ups on it."""
    fleet.reset("v1a")
    transport = SSHTransport(fleet_host(fleet, "v1a"))
    transport.open()
    try:
        sock = transport._conn.connect_kwargs["sock"]
        assert transport._conn.client.get_transport().is_authenticated()
        assert not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock._after_read is None
        chan = transport.start(["/bin/echo", "agent-start"])
        out = b""
        while (chunk := chan.recv(5)) not in (None, b""):
            out += chunk
        assert chan.exit_status() == 0 and out.strip() == b"agent-start"
    finally:
        transport.close()


def test_a_port_that_never_speaks_is_named_so(switched_off, tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    doc = {"defaults": {"identity_file": str(tmp_path / "none"), "known_hosts": str(tmp_path / "kh")},
           "hosts": {"quiet": {"address": "127.0.0.1", "port": srv.getsockname()[1], "connect_timeout": 1,
                               "engine": {"kind": "sglang", "python": "/usr/bin/python3", "state_dir": "/tmp/x"},
                               "server": {"log": "/tmp/x.log", "restart": {"kind": "systemd", "unit": "x"}}}}}
    host = parse_inventory(yaml.safe_dump(doc)).hosts["quiet"]
    try:
        with pytest.raises(HostFailure) as failure:
            SSHTransport(host).open()
    finally:
        srv.close()
    assert failure.value.status == "unreachable", failure.value.message
    assert "stays silent" in failure.value.message
