"""`nodes:` groups in hosts.yaml: one multi-node server's hosts in node-rank order. Each mistake
is one line naming its key; a command that changes hosts takes every rank of a group or none."""
from __future__ import annotations

import pytest

from fleetpatch.errors import UsageError
from fleetpatch.inventory import InventoryError, parse_inventory, units_of

HOSTS = """\
defaults:
  engine: {python: /usr/bin/python3}
  server:
    log: /var/log/sglang.log
    restart: {kind: systemd, unit: sglang}
  router: {urls: ["http://10.0.0.100:30080"]}
hosts:
  b0: {address: 10.0.1.1, server: {url: "http://10.0.1.1:30000"}}
  b1: {address: 10.0.1.2, server: {url: "http://10.0.1.2:30000"}}
  b2: {address: 10.0.1.3, server: {url: "http://10.0.1.3:30000"}}
  p1: {address: 10.0.2.1, server: {url: "http://10.0.2.1:30000"}}
"""


def inv(nodes: str, extra: str = ""):
    return parse_inventory(HOSTS + extra + "nodes:\n" + nodes)


def test_the_hosts_of_a_node_group_are_its_ranks_in_order_and_only_rank_0_is_in_a_router():
    i = inv("  kimi-2n: {hosts: [b1, b0]}\n")
    assert i.node_groups == {"kimi-2n": ("b1", "b0")}
    assert (i.hosts["b1"].node_group, i.hosts["b1"].node_rank) == ("kimi-2n", 0)
    assert i.hosts["b0"].node_rank == 1 and i.hosts["p1"].node_group is None
    assert i.hosts["b1"].router is not None and i.hosts["b0"].router is None
    assert [h.name for h in i.group("kimi-2n")] == ["b1", "b0"]
    assert [[h.name for h in u] for u in units_of(list(i.hosts.values()))] == [["b1", "b0"], ["b2"], ["p1"]]


@pytest.mark.parametrize("nodes, extra, key, words", [
    ("  g: {hosts: [b0]}\n", "", "nodes.g.hosts", "2 hosts or more"),
    ("  g: {hosts: [b0, bx]}\n", "", "nodes.g.hosts[1]", "unknown host 'bx'"),
    ("  g: {hosts: [b0, b0]}\n", "", "nodes.g.hosts[1]", "twice in this group"),
    ("  g: {hosts: [b0, b1]}\n  h: {hosts: [b2, b1]}\n", "", "nodes.h.hosts[1]", "in node group g too (rank 1)"),
    ("  g: {host: [b0, b1]}\n", "", "nodes.g.host", "did you mean 'hosts'"),
    ("  g: {hosts: b0}\n", "", "nodes.g.hosts", "node-rank order (a list)"),
    ("  p1: {hosts: [b0, b1]}\n", "", "nodes.p1", "already a host"),
    ("  east: {hosts: [b0, b1]}\n", "groups:\n  east: [p1]\n", "nodes.east", "already a group"),
    ("  all: {hosts: [b0, b1]}\n", "", "nodes.all", "not a usable node group name"),
])
def test_a_mistake_in_nodes_is_one_line_naming_its_key(nodes, extra, key, words):
    with pytest.raises(InventoryError) as e:
        inv(nodes, extra)
    assert f": {key}: " in str(e.value) and words in str(e.value), str(e.value)


def test_a_rank_runs_one_server_and_every_rank_runs_the_same_engine():
    servers = HOSTS.replace('  b1: {address: 10.0.1.2, server: {url: "http://10.0.1.2:30000"}}',
                            '  b1:\n    address: 10.0.1.2\n    servers:\n      s0: {url: "http://10.0.1.2:30000"}\n'
                            '      s1: {url: "http://10.0.1.2:30001", log: /var/log/s1.log, restart: {unit: s1}}')
    with pytest.raises(InventoryError, match=r"nodes\.g\.hosts\[1\]: b1 has servers:"):
        parse_inventory(servers + "nodes:\n  g: {hosts: [b0, b1]}\n")


def test_a_command_that_changes_hosts_takes_every_rank_or_none():
    i = inv("  kimi-2n: {hosts: [b0, b1]}\n")
    with pytest.raises(UsageError) as e:
        i.select("b1,p1", None, changes_hosts=True)
    assert "node group kimi-2n (b0, b1) without b0 (rank 0)" in str(e.value) and "--group kimi-2n" in str(e.value)
    assert [h.name for h in i.select("b1", None, changes_hosts=False)] == ["b1"]   # reading one rank is fine
    assert [h.name for h in i.select("b0,b1", None, changes_hosts=True)] == ["b0", "b1"]
    assert [h.name for h in i.select(None, "kimi-2n", changes_hosts=True)] == ["b0", "b1"]
    with pytest.raises(UsageError, match="groups in .*: all, kimi-2n"):
        i.select(None, "kimi", changes_hosts=True)
