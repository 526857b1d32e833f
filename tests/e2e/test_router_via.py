"""router.via: the router's API reached through the SSH connection to an inventory host.

Two sshd hosts of the test fleet behind the real sglang-router. The router's
URL names it by a host name that resolves only inside host v0 (a hosts file
bind-mounted over /etc/hosts in v0's mount namespace): from this machine the
URL does not resolve at all, so a router call that succeeds went through v0's
sshd (a direct-tcpip channel on fleetpatch's SSH connection to v0).
"""
from __future__ import annotations

import socket

import pytest

from support.marks import needs_fleet
from support.operator import Operator
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.routerproc import RouterProcess, free_port, router_command
from fleetpatch.router import Router

pytestmark = [needs_fleet,
              pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")]

NAMES = ["v0", "v1"]
PRIVATE = "router.fleetpatch-via.internal"   # resolves on v0 only


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("viafleet")
    with Fleet(root, [HostSpec(n, startup_delay=0.2) for n in NAMES]) as f:
        hosts_file = root / "v0-etc-hosts"
        hosts_file.write_text("127.0.0.1 localhost\n127.0.0.1 %s\n" % PRIVATE)
        done = f.run_in_host("v0", "mount", "--bind", str(hosts_file), "/etc/hosts", capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        yield f


@pytest.fixture(scope="module")
def router(fleet, tmp_path_factory):
    with RouterProcess(tmp_path_factory.mktemp("router") / "router.log") as rp:
        yield rp


def url_of(fleet, name):
    return f"http://127.0.0.1:{fleet.hosts[name].http_port}"


@pytest.fixture
def op(fleet, router, tmp_path):
    fleet.reset_all()
    r = Router(router.url)   # the test's own setup talks to the router directly
    for name in NAMES:
        r.add(url_of(fleet, name), timeout=20)
    o = Operator(fleet, tmp_path)
    o.private_url = f"http://{PRIVATE}:{router.port}"
    return o


def via_inventory(op, fleet, via, urls=None):
    doc = op.inventory()
    doc["defaults"]["server"]["restart"]["stop_grace"] = 1
    for name in NAMES:
        doc["hosts"][name]["server"]["url"] = url_of(fleet, name)
    doc["groups"] = {"behind": {"hosts": list(NAMES), "router": {"urls": urls or [op.private_url]}}}
    if via:
        doc["groups"]["behind"]["router"]["via"] = via
    return op.write_inventory(doc)


def test_the_router_is_reached_through_the_via_hosts_ssh_connection(op, fleet, router):
    with pytest.raises(OSError):
        socket.getaddrinfo(PRIVATE, router.port)   # the premise: this machine cannot reach that URL

    via_inventory(op, fleet, via=None)
    direct = op.run("check-patch", "--patch", "dynamic-spec-disable", "--group", "all")
    assert direct.code == 1 and "cannot reach the router" in direct.output, direct

    via_inventory(op, fleet, via="v0")
    check = op.run("check-patch", "--patch", "dynamic-spec-disable", "--group", "all")
    assert check.code == 0, check
    for name in NAMES:
        assert (f"router {op.private_url} (reached via v0, over its SSH connection): sglang-router 0.3.x API"
                in check.output), check
        assert check.host(name)["routers"][op.private_url]["via"] == "v0"

    pid = fleet.server_pid("v1")
    run = op.run("deploy-patch", "--patch", "dynamic-spec-disable", "--hosts", "v1")
    assert run.code == 0, run
    h = run.host("v1")
    assert h["status"] == "verified", h
    assert h["router"]["removed"] is True and h["router"]["readded"] is True, h["router"]
    assert fleet.server_pid("v1") != pid
    # back in the router, healthy (a new id: it really left and came back)
    assert {w.url: w.healthy for w in Router(router.url).list_workers()} == {url_of(fleet, n): True for n in NAMES}


def test_an_unreachable_via_host_is_refused_before_any_host_is_changed(op, fleet, router):
    path = via_inventory(op, fleet, via="ghost")
    doc = op.inventory()
    doc["hosts"]["ghost"] = {"address": "127.0.0.1", "port": free_port(),   # nothing listens there
                             "server": {"restart": {"start": "true"}}}
    op.write_inventory(doc, path.name)
    pids = {n: fleet.server_pid(n) for n in NAMES}
    run = op.run("rollout", "--patch", "dynamic-spec-disable", "--hosts", "v0,v1", "--canary", "0", "--batch", "1")
    assert run.code == 2, run
    assert "router pre-flight refused, no host was touched" in run.output, run
    assert f"router {op.private_url} (via ghost)" in run.output, run
    assert "cannot open the SSH connection to the via host ghost (router.via)" in run.output, run
    assert "Traceback" not in run.output
    assert {n: fleet.server_pid(n) for n in NAMES} == pids
    assert len(Router(router.url).list_workers()) == 2

    check = op.run("check-patch", "--patch", "dynamic-spec-disable", "--hosts", "v0")
    assert check.code == 1 and "via host ghost" in check.output and op.private_url in check.output, check


def test_the_via_connection_honours_accept_new_host_keys(op, fleet, router, tmp_path):
    """The via host (v0) is not a selected host: only router.via's own connection meets its key."""
    path = via_inventory(op, fleet, via="v0")
    doc = op.inventory()
    known = tmp_path / "known_hosts_empty"
    known.write_text("")
    doc["defaults"]["known_hosts"] = str(known)
    op.write_inventory(doc, path.name)
    v0_key = f"[127.0.0.1]:{fleet.hosts['v0'].ssh_port}"

    refused = op.run("check-patch", "--patch", "dynamic-spec-disable", "--hosts", "v1")
    assert refused.code == 1, refused
    assert refused.host("v1")["status"] == "host-key-rejected", refused

    check = op.run("check-patch", "--patch", "dynamic-spec-disable", "--hosts", "v1", "--accept-new-host-keys")
    assert check.code == 0, check
    assert (f"router {op.private_url} (reached via v0, over its SSH connection): sglang-router 0.3.x API"
            in check.output), check
    assert v0_key in known.read_text(), "the via host's key was recorded"
    # recorded: the next run trusts it without the flag
    again = op.run("check-patch", "--patch", "dynamic-spec-disable", "--hosts", "v1")
    assert again.code == 0, again
