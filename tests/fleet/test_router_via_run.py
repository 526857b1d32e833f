"""router.via's connections belong to the run that made them (issue 33, items 4 and 21).

Over real sshd hosts of the shared fleet: each run's `router_via.Tunnels` dials the
via host on its own connection, under the run's host-key policy, and closes it
when the run ends; another run's connection is not touched. A direct-tcpip
channel to the host's own stand-in server (`GET /health`) stands for a router call.
"""
from __future__ import annotations

import pytest

from support.marks import needs_fleet
from fleetpatch.inventory import load_inventory
from fleetpatch.router import TunnelError
from fleetpatch.router_via import Tunnels

pytestmark = needs_fleet

VIA = "v1a"


def health(tunnels: Tunnels, inv, fleet):
    """(status, the paramiko transport the call went over) of GET /health through the via host."""
    tunnel = tunnels.tunnel_for(inv.hosts[VIA], inv.hosts)
    status, _ = tunnel.request("127.0.0.1", fleet.hosts[VIA].http_port, "GET", "/health", None, {}, 10.0)
    chan = tunnel.channel("127.0.0.1", fleet.hosts[VIA].http_port, 10.0)
    transport = chan.get_transport()
    chan.close()
    return status, transport


def test_two_runs_have_their_own_via_connections_each_closed_when_its_run_ends(operator, fleet):
    inv = load_inventory(operator.inventory_path)
    with Tunnels() as first, Tunnels() as second:
        status_a, conn_a = health(first, inv, fleet)
        status_b, conn_b = health(second, inv, fleet)
        assert (status_a, status_b) == (200, 200)
        assert conn_a is not conn_b, "the runs share no SSH connection"
        first.close()   # the first run ends
        assert not conn_a.is_active(), "its connection is closed with it"
        assert conn_b.is_active(), "the other run's is not touched"
        assert health(second, inv, fleet)[0] == 200
    assert not conn_b.is_active(), "closed at the end of its run"


def test_the_via_connection_records_a_new_host_key_only_with_accept_new_host_keys(operator, fleet, tmp_path):
    known = tmp_path / "known_hosts_empty"
    known.write_text("")
    doc = operator.inventory()
    doc["defaults"]["known_hosts"] = str(known)
    inv = load_inventory(operator.write_inventory(doc, "unknown-keys.yaml"))
    with Tunnels() as strict, pytest.raises(TunnelError) as refused:
        health(strict, inv, fleet)
    assert f"cannot open the SSH connection to the via host {VIA} (router.via)" in str(refused.value)
    assert "--accept-new-host-keys" in str(refused.value), refused.value
    assert known.read_text() == ""
    with Tunnels(accept_new_host_keys=True) as accepting:
        assert health(accepting, inv, fleet)[0] == 200
    assert f"[127.0.0.1]:{fleet.hosts[VIA].ssh_port}" in known.read_text()
