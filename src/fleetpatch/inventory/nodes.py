"""`nodes:` in hosts.yaml: one SGLang server that runs on several hosts (`--nnodes N
--node-rank R`), named as a group of hosts in node-rank order.

A node group is one unit for everything that changes hosts: every rank gets the
same revision or none does, every rank is restarted together, and a rollout counts
the group once. So a host may sit in one group only, the ranks share one engine,
and a command that changes hosts takes all of a group's ranks or none of them.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ..errors import UsageError
from .checks import HOST_NAME_RE, Checker, did_you_mean, value_shown, key_shown, listed_names

NODE_KEYS = ("hosts",)


def parse_nodes(v: Checker, node, hosts: dict, groups: Dict[str, List[str]]) -> Dict[str, Tuple[str, ...]]:
    """nodes: name -> its hosts in node-rank order (rank 0 first), each checked."""
    if node is None:
        return {}
    node = v.mapping("nodes", node)
    out: Dict[str, Tuple[str, ...]] = {}
    rank_of: Dict[str, Tuple[str, int]] = {}
    for gname, section in node.items():
        key = f"nodes.{key_shown(gname)}"
        if not isinstance(gname, str) or not HOST_NAME_RE.match(gname) or gname == "all":
            raise v.fail(key, "not a usable node group name (letters, digits, '.', '-', '_'; not 'all')")
        if gname in groups or gname in hosts:
            what = "a group (groups.%s)" % gname if gname in groups else "a host"
            raise v.fail(key, f"the name is already {what}; --group picks a node group by its name, so give it "
                              "another")
        section = v.mapping(key, section)
        for k in section:
            if k not in NODE_KEYS:
                raise v.fail(f"{key}.{key_shown(k)}", f"unknown key{did_you_mean(str(k), NODE_KEYS)}; a node "
                                                     "group has only hosts: [rank 0, rank 1, ...]")
        members = section.get("hosts")
        if not isinstance(members, list):
            raise v.fail(f"{key}.hosts", f"expected the group's hosts in node-rank order (a list), got "
                                         f"{value_shown(members)}")
        if len(members) < 2:
            raise v.fail(f"{key}.hosts", "a node group spans 2 hosts or more (--nnodes); a server on one host "
                                         "needs no group")
        for i, m in enumerate(members):
            at = f"{key}.hosts[{i}]"
            if not isinstance(m, str):
                raise v.fail(at, f"expected a host name, got {value_shown(m)}")
            if m not in hosts:
                raise v.fail(at, f"unknown host {m!r}{did_you_mean(m, hosts)}; hosts: {listed_names(hosts)}")
            if m in rank_of:
                other, r = rank_of[m]
                where = "twice in this group" if other == gname else f"in node group {other} too (rank {r})"
                raise v.fail(at, f"{m} is {where}; a host runs one rank of one multi-node server")
            rank_of[m] = (gname, i)
            _check_rank_host(v, at, hosts[m])
        first = hosts[members[0]]
        for i, m in enumerate(members[1:], 1):
            if hosts[m].engine.kind != first.engine.kind:
                raise v.fail(f"{key}.hosts[{i}]", f"{m} runs engine {hosts[m].engine.kind!r} and rank 0 "
                                                  f"({members[0]}) {first.engine.kind!r}; every rank of a "
                                                  "multi-node server runs the same engine")
        out[gname] = tuple(members)
    return out


def _check_rank_host(v: Checker, at: str, host) -> None:
    if host.servers:
        raise v.fail(at, f"{host.name} has servers:; a host in a node group runs that group's one server "
                         f"(hosts.{host.name}.server)")
    if host.server.restart.kind == "container":
        # every rank is stopped before any starts, and a stopped container cannot be started by
        # the request that finds it stopped: not supported yet
        raise v.fail(at, f"{host.name}'s server is its container (restart.kind: container), which fleetpatch "
                         "does not yet stop apart from its start; run the rank with restart.kind: command "
                         "inside a long-running container")


def partial_groups(chosen: Sequence, node_groups: Dict[str, Tuple[str, ...]]) -> List[str]:
    """One line per node group that `chosen` takes only some ranks of."""
    names = {h.name for h in chosen}
    lines = []
    for gname, members in node_groups.items():
        taken = [m for m in members if m in names]
        if taken and len(taken) != len(members):
            left = [f"{m} (rank {members.index(m)})" for m in members if m not in names]
            lines.append(f"node group {gname} ({', '.join(members)}) without {', '.join(left)}")
    return lines


def refuse_partial(chosen: Sequence, node_groups: Dict[str, Tuple[str, ...]]) -> None:
    """A command that changes hosts takes every rank of a node group or none: one rank patched
    or restarted alone would leave a server whose ranks run different code."""
    lines = partial_groups(chosen, node_groups)
    if lines:
        first = next(iter(g for g in node_groups if lines[0].startswith(f"node group {g} ")))
        raise UsageError("a node group is changed as a whole, every rank or none: the selection takes "
                         + "; ".join(lines) + f"; add the missing hosts, or select the group with --group {first}")
