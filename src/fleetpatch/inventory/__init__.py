"""hosts.yaml -> validated, frozen `Host` records.

`defaults` is deep-merged under every host (mappings merge key by key, the host
wins; lists and scalars are replaced). Every key and type is checked; every
error is an `InventoryError` (exit 2) whose str() names the file, the dotted
key and the reason, e.g.::

    hosts.yaml: hosts.gpu-a02.port: expected an integer, got 'abc'

A wrong type or unknown key is reported where it was written (``defaults.…``
or ``hosts.<name>.…``); a missing required key is reported for the host that
lacks it, saying where it may be set.
"""
from __future__ import annotations
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import UsageError
from ..router import RouterConf, SmokeConf, build_router_conf, check_router_section
from .nodes import parse_nodes, refuse_partial
from .checks import (InventoryError, ENV_VAR, DEFAULT_STATE_DIR_ROOT, DEFAULT_STATE_DIR_USER, RESTART_KINDS,
                     RUNTIMES, CONTAINER_LOG, HOST_AGENT_PYTHON, GATEWAY_RE, HOST_NAME_RE, HOST_SCHEMA, Checker,
                     check_section, did_you_mean, expand_user, value_shown, key_shown, deep_merge, listed_names, or_default, load_yaml)


__all__ = [
    "InventoryError",
    "RestartConf",
    "EngineConf",
    "ServerConf",
    "Jump",
    "Host",
    "Inventory",
    "load_inventory",
    "units_of",
    "parse_inventory",
    "resolve_inventory_path",
    "load_yaml",
    "ENV_VAR",
    "DEFAULT_STATE_DIR_ROOT",
    "DEFAULT_STATE_DIR_USER",
    "RESTART_KINDS",
    "RUNTIMES",
]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RestartConf:
    kind: str                          # command | systemd | supervisor
    start: Optional[str] = None        # command: the launch command line ({python} is engine.python)
    env: Dict[str, str] = field(default_factory=dict, hash=False)  # hash=False keeps Host hashable
    workdir: Optional[str] = None
    pidfile: Optional[str] = None
    stop_grace: float = 10
    unit: Optional[str] = None         # systemd
    program: Optional[str] = None      # supervisor
    config: Optional[str] = None       # supervisor: supervisord.conf


@dataclass(frozen=True)
class EngineConf:
    kind: str
    python: str                        # the engine's interpreter (on a container host: inside the container)
    state_dir: str                     # on the host; on a container host the container's own folder below it
    container: Optional[str] = None    # the engine runs in this container on the host (name or id)
    runtime: str = "docker"            # docker | podman: the CLI the agent runs on the host
    probe: bool = True                 # False: no probe in this host's server; its patches are judged by markers alone

    @property
    def agent_python(self) -> str:
        """The interpreter that runs the agent: the host's own python3 on a container host."""
        return HOST_AGENT_PYTHON if self.container else self.python


@dataclass(frozen=True)
class ServerConf:
    log: str
    restart: RestartConf
    health_url: Optional[str] = None
    ready_timeout: float = 1800
    url: Optional[str] = None          # this worker as the routers list it (router section)
    smoke: SmokeConf = SmokeConf()     # the smoke request after a router-aware restart


@dataclass(frozen=True)
class Jump:
    """A resolved SSH gateway (ProxyJump): from "user@host:port" or another inventory host."""
    address: str
    user: Optional[str] = None
    port: Optional[int] = 22           # None (a gateway host without a port): ~/.ssh/config's Port, else 22
    host: Optional[str] = None         # the inventory host name, when the gateway names one


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    engine: EngineConf
    server: ServerConf
    user: Optional[str] = None             # None: ~/.ssh/config's User, else the local user
    port: Optional[int] = None             # None: ~/.ssh/config's Port, else 22
    identity_file: Optional[str] = None    # "~" expanded locally
    known_hosts: Optional[str] = None      # "~" expanded locally
    connect_timeout: float = 10
    gateway: Optional[str] = None          # as written: "user@host:port" or an inventory host name
    jump: Optional[Jump] = None            # the gateway, resolved
    groups: Tuple[str, ...] = ()           # the inventory groups naming this host (not "all")
    router: Optional[RouterConf] = None    # the routers in front of this worker (router section)
    # `servers:` (several servers sharing the host's install), in file order; () for the one-server form
    servers: Tuple[Tuple[str, "ServerConf"], ...] = ()
    server_name: Optional[str] = None      # a view of one server (server_views): which; None: the host as a whole
    node_group: Optional[str] = None       # `nodes:`: the multi-node server this host runs a rank of
    node_rank: Optional[int] = None        # its --node-rank (0 serves HTTP, takes the drain and the smoke request)

    def server_views(self) -> List["Host"]:
        """One Host per server of `servers`, each with that server as its `server` (the host itself
        for the one-server form): what is restarted, drained and judged on its own."""
        if not self.servers:
            return [self]
        import dataclasses
        return [dataclasses.replace(self, server=conf, server_name=name) for name, conf in self.servers]

    @property
    def target(self) -> str:
        """user@address:port, for messages."""
        port = f":{self.port}" if self.port else ""  # none: ~/.ssh/config decides
        return f"{self.user + '@' if self.user else ''}{self.address}{port}"


@dataclass
class Inventory:
    path: Path
    hosts: Dict[str, Host]                 # in file order
    groups: Dict[str, List[str]]           # in file order; "all" is implicit
    # `nodes:`: each multi-node server's hosts in node-rank order; --group selects one by its name
    node_groups: Dict[str, Tuple[str, ...]] = field(default_factory=dict)

    def group(self, name: str) -> List[Host]:
        if name == "all":
            return list(self.hosts.values())
        if name in self.node_groups:
            return [self.hosts[n] for n in self.node_groups[name]]
        if name not in self.groups:
            known = [*self.groups, *self.node_groups]
            raise UsageError(f"unknown group {name!r}{did_you_mean(name, known)}; "
                             f"groups in {self.path}: {listed_names(['all', *known])}")
        members = set(self.groups[name])
        return [h for n, h in self.hosts.items() if n in members]

    def select(self, hosts: Union[str, Sequence[str], None], group: Optional[str], *,
               changes_hosts: bool) -> List[Host]:
        """The hosts named by exactly one of `hosts` ("a,b") / `group`, in inventory order."""
        if hosts is not None and not isinstance(hosts, str):
            hosts = ",".join(hosts)
        if hosts is not None and not hosts.strip():
            hosts = None if hosts == "" else hosts
        if hosts is not None and group is not None:
            raise UsageError("give either --hosts or --group, not both")
        if hosts is None and group is None:
            if changes_hosts:
                raise UsageError("say which hosts to change: --hosts a,b or --group G "
                                 f"(--group all for every host; groups: {listed_names(['all', *self.groups])})")
            return list(self.hosts.values())
        if group is not None:
            chosen = self.group(group)
            if not chosen:
                raise UsageError(f"group {group!r} in {self.path} has no hosts")
            if changes_hosts:
                refuse_partial(chosen, self.node_groups)
            return chosen
        names = [n.strip() for n in hosts.split(",")]
        if not any(names):
            raise UsageError(f"--hosts {hosts!r} names no host; known hosts: {listed_names(self.hosts)}")
        if not all(names):
            # `a,,b` is a name left out by mistake, not a shorter list: nothing is selected from it
            raise UsageError(f"--hosts {hosts!r}: host name {names.index('') + 1} of {len(names)} is empty; "
                             "separate the names with single commas, e.g. --hosts a,b")
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            hint = did_you_mean(unknown[0], self.hosts)
            raise UsageError(
                f"unknown host{'s' if len(unknown) > 1 else ''} {', '.join(repr(n) for n in unknown)}{hint}; "
                f"known hosts in {self.path}: {listed_names(self.hosts)}")
        wanted = set(names)
        chosen = [h for n, h in self.hosts.items() if n in wanted]
        if changes_hosts:
            refuse_partial(chosen, self.node_groups)
        return chosen


def units_of(hosts: Sequence[Host]) -> List[List[Host]]:
    """`hosts` as the units a command changes: a host alone, or a node group's selected ranks
    in rank order, at the place of its first rank in `hosts`."""
    out: List[List[Host]] = []
    placed: Dict[str, List[Host]] = {}
    for h in hosts:
        if h.node_group is None:
            out.append([h])
        elif h.node_group in placed:
            placed[h.node_group].append(h)
        else:
            placed[h.node_group] = [h]
            out.append(placed[h.node_group])
    for unit in placed.values():
        unit.sort(key=lambda h: h.node_rank)
    return out


def _build_host(v: Checker, name: str, d: dict, router_at: Optional[Dict[str, str]] = None) -> Host:
    pre = f"hosts.{name}"
    if d.get("address") is None:
        raise v.fail(f"{pre}.address", f"required but missing (set it under hosts.{name})")
    user = d.get("user")
    engine_d = d.get("engine", {})
    container = engine_d.get("container")
    if not container and engine_d.get("python") is None:
        raise v.fail(f"{pre}.engine.python", f"required but missing (set it under hosts.{name}.engine or "
                                             "under defaults.engine)")
    engine = _engine_conf(engine_d, user, None if container else engine_d["python"])
    servers: Tuple[Tuple[str, ServerConf], ...] = ()
    if d.get("servers"):
        if container:
            raise v.fail(f"{pre}.servers", "several servers on a container host are not supported: one "
                                           "container runs one server; list each container as a host")
        servers = tuple((s, _build_server(v, name, f"servers.{s}", deep_merge(d.get("server") or {}, conf), engine,
                                        engine_d))
                        for s, conf in d["servers"].items())
        _check_distinct(v, pre, servers)
        server = servers[0][1]
    else:
        if not container and d.get("server") is None:
            raise v.fail(f"{pre}.server", f"required but missing (set it under hosts.{name} or under defaults; "
                                          f"several servers: hosts.{name}.servers)")
        server = _build_server(v, name, "server", d.get("server") or {}, engine, engine_d)
    routers = [build_router_conf(v.fail, name, d.get("router"), conf.url, router_at or {},
                                 url_key=f"{pre}.{where}.url")
               for where, conf in ([(f"servers.{s}", c) for s, c in servers] or [("server", server)])]
    return Host(
        name=name,
        address=d["address"],
        engine=engine,
        server=server,
        servers=servers,
        user=user,
        port=d.get("port"),
        identity_file=expand_user(d.get("identity_file")),
        known_hosts=expand_user(d.get("known_hosts")),
        connect_timeout=or_default(d.get("connect_timeout"), 10),
        gateway=d.get("gateway"),
        router=routers[0],
    )


def _build_server(v: Checker, name: str, where: str, server_d: dict, engine: EngineConf, engine_d: dict) -> ServerConf:
    """One server of host `name`, written at hosts.<name>.<where> (server, or servers.<s>)."""
    pre = f"hosts.{name}"
    container = engine.container

    def need(section: dict, key: str, at: str) -> Any:
        if section.get(key) is not None:
            return section[key]
        parent = "." + at.rsplit(".", 1)[0] if "." in at else ""
        hint = (f"set it under hosts.{name}.server{parent} or under defaults.server{parent}" if where == "server"
                else f"set it under hosts.{name}.{where}{parent}, or under hosts.{name}.server{parent} for every "
                     "server of the host")
        raise v.fail(f"{pre}.{where}.{at}", f"required but missing ({hint})")

    log = or_default(server_d.get("log"), CONTAINER_LOG) if container else need(server_d, "log", "log")
    restart_d = server_d.get("restart") or {} if container else need(server_d, "restart", "restart")
    kind = or_default(restart_d.get("kind"), "container") if container else need(restart_d, "kind", "restart.kind")
    _check_container_host(v, pre, engine, log, kind, engine_d)
    rpre = f"{pre}.{where}.restart"
    required = {"command": ("start", "pidfile"), "systemd": ("unit",), "supervisor": ("program",),
                "container": ()}[kind]
    for key in required:
        if restart_d.get(key) is None:
            raise v.fail(f"{rpre}.{key}", f"required when {where}.restart.kind is {kind} (set it under "
                                          f"hosts.{name}.{where}.restart" +
                                          (" or under defaults.server.restart)" if where == "server" else ")"))
    if log == "journal" and kind != "systemd":
        raise v.fail(f"{pre}.{where}.log", f"\"journal\" (read the systemd journal) needs {where}.restart.kind "
                                           f"systemd, not {kind}; give the path of the server's log file")
    restart = RestartConf(
        kind=kind,
        start=restart_d.get("start"),
        env=dict(restart_d.get("env") or {}),
        workdir=restart_d.get("workdir"),
        pidfile=restart_d.get("pidfile"),
        stop_grace=or_default(restart_d.get("stop_grace"), 10),
        unit=restart_d.get("unit"),
        program=restart_d.get("program"),
        config=restart_d.get("config"),
    )
    return ServerConf(log=log, restart=restart, health_url=server_d.get("health_url"),
                      ready_timeout=or_default(server_d.get("ready_timeout"), 1800), url=server_d.get("url"),
                      smoke=SmokeConf(**(server_d.get("smoke") or {})))


def _check_distinct(v: Checker, pre: str, servers: Tuple[Tuple[str, ServerConf], ...]) -> None:
    """Two servers of one host never share a log, a pidfile, a unit or a URL: each is restarted and
    judged on its own, by what is its own."""
    seen: Dict[Tuple[str, Any], str] = {}
    for s, conf in servers:
        r = conf.restart
        for what, value in (("log", None if conf.log == "journal" else conf.log), ("restart.pidfile", r.pidfile),
                            ("restart.unit", r.unit), ("restart.program", r.program), ("url", conf.url),
                            ("health_url", conf.health_url)):
            if value is None:
                continue
            if (what, value) in seen:
                raise v.fail(f"{pre}.servers.{s}.{what}", f"{value!r} is servers.{seen[what, value]}'s too; each "
                                                          "server needs its own (it is restarted and judged alone)")
            seen[what, value] = s


def _engine_conf(engine_d: dict, user: Optional[str], python: Optional[str]) -> EngineConf:
    """engine.*; on a container host engine.python (inside the container) defaults to python3,
    and the state dir is the container's own folder below engine.state_dir, on the host: the
    ledger and the lock are kept per container."""
    container = engine_d.get("container")
    state_dir = engine_d.get("state_dir") or (DEFAULT_STATE_DIR_ROOT if user == "root" else DEFAULT_STATE_DIR_USER)
    if container:
        state_dir = f"{state_dir.rstrip('/') or '/'}/containers/{container}"
    return EngineConf(kind=or_default(engine_d.get("kind"), "sglang"), python=or_default(python, or_default(engine_d.get("python"),
                                                                                     HOST_AGENT_PYTHON)),
                      state_dir=state_dir, container=container, runtime=or_default(engine_d.get("runtime"), "docker"),
                      probe=engine_d.get("probe") is not False)


def _check_container_host(v: "Checker", pre: str, engine: EngineConf, log: str, kind: str, engine_d: dict) -> None:
    """The keys that only make sense together with engine.container, and the ones that cannot go with it."""
    if not engine.container:
        if kind == "container":
            raise v.fail(f"{pre}.server.restart.kind", "\"container\" restarts the engine's container: set "
                                                       "engine.container (the container's name or id)")
        if log == CONTAINER_LOG:
            raise v.fail(f"{pre}.server.log", "\"container\" reads the container's output: set engine.container "
                                              "(the container's name or id), or give the path of the server's log")
        if engine_d.get("runtime") is not None:
            raise v.fail(f"{pre}.engine.runtime", "only for a container host: set engine.container too")
        return
    if kind not in ("container", "command"):
        raise v.fail(f"{pre}.server.restart.kind", f"{kind!r} cannot restart a server inside the container "
                                                   f"{engine.container}: use container (the container's main "
                                                   "process is the server) or command (started in it by exec -d)")
    if kind == "command" and log == CONTAINER_LOG:
        raise v.fail(f"{pre}.server.log", "a server started in the container by exec -d writes nothing to the "
                                          "container's output: give the path of its log file inside the container")


def _resolve_gateway(v: Checker, host: Host, hosts: Dict[str, Host], written_at: str) -> Optional[Jump]:
    gw = host.gateway
    if not gw:
        return None
    key = f"{written_at}.gateway"
    if gw in hosts:
        if gw == host.name:
            raise v.fail(key, f"hosts.{host.name} names itself as its gateway "
                              f"(set gateway: null under hosts.{host.name})")
        other = hosts[gw]
        if other.gateway:
            raise v.fail(key, f"the gateway host {gw!r} has a gateway of its own ({other.gateway!r}); "
                              "chained gateways are not supported")
        return Jump(address=other.address, user=other.user, port=other.port, host=gw)
    m = GATEWAY_RE.match(gw)
    if not m:
        raise v.fail(key, f"expected 'user@host:port' (user and port optional) or the name of an inventory host, "
                          f"got {gw!r}")
    port = int(m.group("port")) if m.group("port") else 22
    if not 1 <= port <= 65535:
        raise v.fail(key, f"port {port} out of range in {gw!r}")
    address = m.group("host")
    if address.startswith("["):
        address = address[1:-1]
    return Jump(address=address, user=m.group("user"), port=port)


_GROUP_KEYS = ("hosts", "router")


def _parse_groups(v: "Checker", groups_node, host_names) -> Tuple[Dict[str, List[str]], Dict[str, Optional[dict]]]:
    """groups: name -> list of known host names (each once), and name -> its router section
    as written (checked), for the groups that set one (None: `router: null`, "no router").

    A group is a list of host names, or a mapping {hosts: [...], router: {...}}."""
    groups: Dict[str, List[str]] = {}
    routers: Dict[str, Optional[dict]] = {}
    if groups_node is None:
        return groups, routers
    groups_node = v.mapping("groups", groups_node)
    for gname, node in groups_node.items():
        key = f"groups.{key_shown(gname)}"
        if gname == "all":
            raise v.fail(key, "'all' is every host and cannot be defined; choose another group name")
        if not HOST_NAME_RE.match(gname):
            raise v.fail(key, "not a usable group name (letters, digits, '.', '-', '_')")
        members, members_key = node, key
        if isinstance(node, dict):
            node = v.mapping(key, node)
            for k in node:
                if k not in _GROUP_KEYS:
                    raise v.fail(f"{key}.{key_shown(k)}", f"unknown key{did_you_mean(k, _GROUP_KEYS)}; "
                                                         "known keys here: hosts, router")
            members, members_key = node.get("hosts"), f"{key}.hosts"
            if "router" in node:
                r = node["router"]
                routers[gname] = None if r is None else check_router_section(v.fail, f"{key}.router",
                                                                             v.mapping(f"{key}.router", r))
        if members is None:
            members = []
        if not isinstance(members, list):
            hint = "" if members_key.endswith(".hosts") else " (or a mapping {hosts: [...], router: {...}})"
            raise v.fail(members_key, f"expected a list of host names, got {value_shown(members)}{hint}")
        names: List[str] = []
        for i, m in enumerate(members):
            if not isinstance(m, str):
                raise v.fail(f"{members_key}[{i}]", f"expected a host name, got {value_shown(m)}")
            if m not in host_names:
                raise v.fail(f"{members_key}[{i}]", f"unknown host {m!r}{did_you_mean(m, host_names)}; "
                                                    f"hosts: {listed_names(host_names)}")
            if m not in names:
                names.append(m)
        groups[gname] = names
    return groups, routers


def _group_router(v: "Checker", name: str, groups: Dict[str, List[str]],
                  routers: Dict[str, Optional[dict]]) -> Optional[Tuple[str, Optional[dict]]]:
    """(group, router section) that a host gets from its groups, or None; two of its groups
    setting different routers is an error (neither may silently win)."""
    found = [(g, routers[g]) for g in routers if name in groups[g]]
    for g, r in found[1:]:
        if r != found[0][1]:
            raise v.fail(f"hosts.{name}", f"is in groups {found[0][0]} and {g}, which set different routers "
                                          f"(groups.{found[0][0]}.router and groups.{g}.router); keep the "
                                          f"host in one of them, or give both the same router")
    return found[0] if found else None


def _router_origin(name: str, raw: dict, group: Optional[Tuple[str, Optional[dict]]]) -> Dict[str, str]:
    """Where each key of a host's merged router section was written ("hosts.X.router", …)."""
    at: Dict[str, str] = {}
    for key in ("urls", "via", "proxy"):
        if "router" in raw:
            if isinstance(raw["router"], dict) and key in raw["router"]:
                at[key] = f"hosts.{name}.router"
                continue
            if raw["router"] is None:
                at[key] = f"hosts.{name}.router"
                continue
        if group is not None and (group[1] is None or key in group[1]):
            at[key] = f"groups.{group[0]}.router"
        else:
            at[key] = "defaults.router"
    return at


def parse_inventory(text: str, file: str = "hosts.yaml", path: Optional[Path] = None) -> Inventory:
    """Validate the text of a hosts.yaml; `file` is how messages name it."""
    v = Checker(file)
    doc = load_yaml(text, file, InventoryError)
    if doc is None:
        raise v.fail(None, "the inventory is empty; expected a mapping with 'hosts:' (and optionally "
                           "'defaults:' and 'groups:')")
    if not isinstance(doc, dict):
        raise v.fail(None, f"expected a mapping with 'hosts:' at the top, got {value_shown(doc)}")
    for k in doc:
        if k not in ("defaults", "groups", "hosts", "nodes"):
            hint = did_you_mean(str(k), ("defaults", "groups", "hosts", "nodes"))
            raise v.fail(key_shown(k), f"unknown key{hint}; the top level has defaults, groups, nodes and hosts")

    defaults = check_section(v, "defaults", doc.get("defaults") or {}, HOST_SCHEMA)
    if defaults.get("servers"):
        raise v.fail("defaults.servers", "servers are named per host (hosts.<name>.servers); keys every server "
                                         "shares go under defaults.server")

    hosts_node = doc.get("hosts")
    if hosts_node is None:
        raise v.fail("hosts", "required but missing: the hosts, by name")
    hosts_node = v.mapping("hosts", hosts_node)
    if not hosts_node:
        raise v.fail("hosts", "no hosts listed")

    names_ok = {}
    for name in hosts_node:
        if not HOST_NAME_RE.match(name) or name == "all":
            raise v.fail(f"hosts.{key_shown(name)}", "not a usable host name (letters, digits, '.', '-', '_'; not 'all')")
        names_ok[name] = True
    groups, group_routers = _parse_groups(v, doc.get("groups"), names_ok)

    hosts: Dict[str, Host] = {}
    written: Dict[str, str] = {}
    router_at: Dict[str, Dict[str, str]] = {}
    for name, section in hosts_node.items():
        key = f"hosts.{key_shown(name)}"
        raw = check_section(v, key, section if section is not None else {}, HOST_SCHEMA)
        group = _group_router(v, name, groups, group_routers)
        # precedence host > group > defaults; mappings merge key by key, as with defaults
        merged = deep_merge(defaults, {"router": group[1]}) if group is not None else defaults
        merged = deep_merge(merged, raw)
        router_at[name] = _router_origin(name, raw, group)
        hosts[name] = _build_host(v, name, merged, router_at[name])
        written[name] = key if "gateway" in raw else "defaults"

    for name, host in list(hosts.items()):
        jump = _resolve_gateway(v, host, hosts, written[name])
        if jump is not None:
            hosts[name] = _replace(host, jump=jump)

    for name, host in list(hosts.items()):
        if host.router is not None and host.router.via is not None:
            hosts[name] = _replace(host, router=_resolve_via(v, host, hosts, router_at[name]["via"]))

    member_of: Dict[str, List[str]] = {n: [] for n in hosts}
    for gname, names in groups.items():
        for n in names:
            member_of[n].append(gname)
    hosts = {n: _replace(h, groups=tuple(member_of[n])) for n, h in hosts.items()}
    node_groups = parse_nodes(v, doc.get("nodes"), hosts, groups)
    for gname, members in node_groups.items():
        for rank, n in enumerate(members):
            # ranks above 0 serve no HTTP (at most a dummy /health): no router lists them
            hosts[n] = _replace(hosts[n], node_group=gname, node_rank=rank,
                                router=hosts[n].router if rank == 0 else None)
    return Inventory(path=path if path is not None else Path(file), hosts=hosts, groups=groups,
                     node_groups=node_groups)


def _resolve_via(v: "Checker", host: Host, hosts: Dict[str, Host], written_at: str) -> RouterConf:
    """The router section with its via host's record attached (what the tunnel connects to)."""
    via = host.router.via
    key = f"{written_at}.via"
    if via not in hosts:
        raise v.fail(key, f"unknown host {via!r}{did_you_mean(via, hosts)}; router.via names the inventory "
                          f"host to reach the router through; hosts: {listed_names(hosts)}")
    target = hosts[via]
    peers = {via: target}
    if target.jump is not None and target.jump.host:
        peers[target.jump.host] = hosts[target.jump.host]   # its gateway's identity_file
    return _replace(host.router, via_hosts=peers)


def _replace(host, **changes):
    import dataclasses
    return dataclasses.replace(host, **changes)


def load_inventory(path: Union[str, Path]) -> Inventory:
    """Read and validate an inventory file."""
    p = Path(path)
    file = str(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InventoryError(file, None, "no such file (pass --inventory PATH or set "
                                         f"${ENV_VAR}; the default is ./hosts.yaml)") from None
    except IsADirectoryError:
        raise InventoryError(file, None, "is a directory, not an inventory file") from None
    except OSError as exc:
        raise InventoryError(file, None, f"cannot read: {exc.strerror or exc}") from None
    return parse_inventory(decode_utf8(data, file, InventoryError), file, p)


def decode_utf8(data: bytes, file: str, error) -> str:
    """The text of an input file; `error(file, None, reason)` when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(file, None, f"not UTF-8 text (byte {exc.start})") from None


def resolve_inventory_path(opt: Optional[str]) -> Path:
    """--inventory PATH, else $FLEETPATCH_INVENTORY, else ./hosts.yaml."""
    if opt:
        return Path(os.path.expanduser(opt))
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(os.path.expanduser(env))
    return Path("hosts.yaml")
