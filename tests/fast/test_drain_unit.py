"""The pure parts of the router-aware restart: the smoke verdict, the agent's copy of
the load parser, the refusals that come before any host is contacted."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fleetpatch.agent import base as agent_base
from fleetpatch_demo.routerproc import free_port
from fleetpatch.drain import Drainer, preflight, routers_of, smoke_verdict
from fleetpatch.errors import HostFailure, Status, UsageError
from fleetpatch.inventory import parse_inventory
from fleetpatch.router import parse_worker_loads

LOADS = [
    {"aggregate": {"total_running_reqs": 5, "total_waiting_reqs": 1, "total_reqs": 6}},
    {"aggregate": {"total_running_reqs": 0, "total_waiting_reqs": 0}},
    [{"dp_rank": 0, "num_reqs": 4, "num_waiting_reqs": 1, "num_tokens": 812},
     {"dp_rank": 1, "num_reqs": 2, "num_waiting_reqs": 2, "num_tokens": 10}],
]


@pytest.mark.parametrize("body", LOADS)
def test_the_agent_reads_a_load_with_the_laptops_own_parser(body):
    # one parser, in the protocol module the agent is sent with
    assert agent_base.protocol.parse_worker_loads is parse_worker_loads
    assert isinstance(parse_worker_loads(body), tuple)


@pytest.mark.parametrize("body", [{"aggregate": {"total_running_reqs": "0"}}, [{"num_tokens": 3}], "busy", None])
def test_the_agent_refuses_what_the_laptop_refuses(body):
    with pytest.raises(ValueError):
        parse_worker_loads(body)


def test_smoke_verdicts():
    ok = b'{"text": " Paris", "meta_info": {}}'
    assert smoke_verdict(200, ok, [], {}) is None
    assert smoke_verdict(200, ok, ["first batch decision"], {"missing": []}) is None
    status, why = smoke_verdict(200, ok, ["first batch decision"], {"missing": ["first batch decision"]})
    assert status == Status.NOT_EXECUTED and "'first batch decision'" in why and "smoke_expect" in why
    status, why = smoke_verdict(500, b'{"detail": "boom"}', [], {})
    assert status == Status.SMOKE_FAILED and "HTTP 500" in why
    status, why = smoke_verdict(200, b'{"error": "x"}', [], {})
    assert status == Status.SMOKE_FAILED and "'text'" in why
    status, why = smoke_verdict(None, b"Connection refused", [], {})
    assert status == Status.SMOKE_FAILED and "Connection refused" in why


def _hosts(router_url):
    inv = parse_inventory(yaml.safe_dump({
        "defaults": {"engine": {"python": "/usr/bin/python3"}, "router": {"urls": [router_url]},
                     "server": {"log": "/tmp/x.log", "restart": {"kind": "command", "start": "{python} -m x", "pidfile": "/tmp/x.pid"}}},
        "hosts": {"a": {"address": "10.0.0.1", "server": {"url": "http://10.0.0.1:30000"}},
                  "b": {"address": "10.0.0.2", "server": {"url": "http://10.0.0.2:30000"}}}}), "hosts.yaml")
    return list(inv.hosts.values())


def test_preflight_names_a_router_that_is_down():
    url = f"http://127.0.0.1:{free_port()}"
    hosts = _hosts(url)
    with pytest.raises(UsageError) as e:
        preflight(hosts, [hosts[:1], hosts[1:]], None)
    assert url in str(e.value) and "cannot reach the router" in str(e.value) and "no host was touched" in str(e.value)


def test_a_take_out_that_fails_gives_what_failed_as_data_beside_its_message():
    """steps.servers says a server's failed router step in its own words (the install was written,
    so "the host was not touched" is no longer so): it reads `reason`, never the message's text."""
    url = f"http://127.0.0.1:{free_port()}"
    host = _hosts(url)[0]
    with pytest.raises(HostFailure) as e:
        Drainer().take_out(host, routers_of(host.router))
    failed = e.value
    assert failed.status == Status.ROUTER_ERROR and url in failed.reason, failed.reason
    assert not failed.reason.startswith(host.name) and "not touched" not in failed.reason, failed.reason
    assert failed.message == f"{host.name}: {failed.reason}; the host was not touched", failed.message


@pytest.mark.parametrize("flag,value", [("--drain-timeout", "0"), ("--drain-timeout", "soon"),
                                        ("--max-unavailable", "0"), ("--bake", "-1")])
def test_bad_router_flags_are_usage_errors(tmp_path, flag, value):
    cmd = "rollout" if flag == "--bake" else "deploy-patch"
    r = subprocess.run([sys.executable, "-m", "fleetpatch", cmd, "--patch", "dynamic-spec-disable", flag, value],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert flag in r.stderr and "Traceback" not in r.stderr
