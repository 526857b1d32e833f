"""The SSH transport's own promises that need no sshd: the connect timeout is
honoured as written (Fabric stores int(connect_timeout), so 0.5 became 0,
which it treats as no timeout at all)."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import yaml

from fleetpatch.errors import HostFailure
from fleetpatch.inventory import parse_inventory
from fleetpatch.remote import Remote, connection_for


def host_at(port: int, timeout: float, **extra):
    doc = {"hosts": {"h": {"address": "127.0.0.1", "port": port, "connect_timeout": timeout, **extra,
                           "engine": {"kind": "sglang", "python": "/usr/bin/python3", "state_dir": "/tmp/x"},
                           "server": {"log": "/tmp/x.log", "restart": {"kind": "systemd", "unit": "x"}}}}}
    return parse_inventory(yaml.safe_dump(doc)).hosts["h"]


@pytest.fixture
def silent_port():
    """A port whose accept queue is full: the kernel drops new SYNs, so a connect
    waits until its own timeout (as towards a host that is down behind a firewall)."""
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


def test_a_half_second_connect_timeout_gives_up_after_half_a_second(silent_port):
    host = host_at(silent_port, 0.5)
    outcome = {}

    def connect():
        t = time.monotonic()
        try:
            Remote(host).open()
        except HostFailure as f:
            outcome["failure"] = f
        outcome["s"] = time.monotonic() - t

    th = threading.Thread(target=connect, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "connect_timeout 0.5 was not honoured (the connect still waits after 10 s)"
    assert outcome["failure"].status == "unreachable" and "timed out" in outcome["failure"].message
    assert 0.4 <= outcome["s"] < 3


def test_the_gateway_gets_the_same_timeout():
    host = host_at(22, 0.5, gateway="root@127.0.0.1:2222")
    conn = connection_for(host, {})
    assert conn.connect_timeout == 0.5 and conn.gateway.connect_timeout == 0.5
