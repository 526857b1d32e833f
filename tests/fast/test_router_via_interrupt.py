"""Ctrl-C reaches router.via's own connection (issue 33, item 4).

The via host is a loopback port that accepts the TCP connection and never says a
word (a firewall that holds the SSH handshake for its whole timeout). A host's
first router call (taking its worker out) dials it through the run's tunnels;
the run's Ctrl-C (`dialer.Interrupt.fire`) must end that connect at once, and the
host ends `interrupted`, untouched, instead of waiting out the via host's
connect timeout.
"""
from __future__ import annotations

import threading

import yaml

from support.listeners import Listener
from support.waits import wait_for
from fleetpatch import drain, steps
from fleetpatch.errors import HostFailure, Status
from fleetpatch.inventory import parse_inventory
from fleetpatch.router_via import Tunnels


def inventory(port: int):
    return parse_inventory(yaml.safe_dump({
        "defaults": {"engine": {"python": "/usr/bin/python3"},
                     "server": {"log": "/tmp/x.log",
                                "restart": {"kind": "command", "start": "{python} -m x", "pidfile": "/tmp/x.pid"}}},
        "hosts": {"gate": {"address": "127.0.0.1", "port": port, "connect_timeout": 120},
                  "w1": {"address": "10.0.0.1", "server": {"url": "http://10.0.0.1:30000"},
                         "router": {"urls": ["http://10.9.0.5:30080"], "via": "gate"}}}}), "hosts.yaml")


def test_ctrl_c_drops_the_via_connection_of_a_hosts_first_router_call():
    silent = Listener(lambda conn: None)
    try:
        inv = inventory(silent.port)
        job = steps.Job(hosts_by_name=inv.hosts)
        outcome: dict = {}

        def restart_under_the_router():
            with Tunnels(job.accept_new_host_keys, job.interrupt) as tunnels:
                job.drain = drain.Drainer(tunnels=tunnels)
                try:
                    outcome["result"] = drain.around_restart(job, inv.hosts["w1"], None,
                                                             restart=lambda: outcome.setdefault("restarted", True))
                except HostFailure as f:
                    outcome["failure"] = f

        worker = threading.Thread(target=restart_under_the_router, daemon=True)
        worker.start()
        assert wait_for(lambda: silent.accepted == 1), "the via host was dialled"
        job.interrupt.fire()
        worker.join(60)   # a bound against a hang; the via host's own timeout is 120 s
        assert not worker.is_alive(), "Ctrl-C did not reach the via host's connect"
    finally:
        silent.close()
    failure = outcome.get("failure")
    assert failure is not None and failure.status == Status.INTERRUPTED, outcome
    assert "interrupted (Ctrl-C) while the SSH connection to the via host gate (router.via) was being made" \
        in failure.message, failure.message
    assert "the host was not touched" in failure.message
    assert "restarted" not in outcome and "result" not in outcome
