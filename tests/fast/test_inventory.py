"""inventory: hosts.yaml -> validated Host records; every error names file + key."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from fleetpatch.errors import UsageError
from fleetpatch.inventory import (
    Host,
    Inventory,
    InventoryError,
    Jump,
    load_inventory,
    parse_inventory,
    resolve_inventory_path,
)
from support.paths import REPO

# The contract's example, verbatim.
CONTRACT_EXAMPLE = """\
defaults:                      # deep-merged under every host
  user: root
  port: 22
  identity_file: ~/.ssh/id_ed25519   # optional; ssh-agent and ~/.ssh/config are honoured
  known_hosts: ~/.ssh/known_hosts    # optional extra known_hosts file
  connect_timeout: 10
  engine:
    kind: sglang
    python: /opt/sglang/.venv/bin/python   # the interpreter that imports sglang on the host
    state_dir: /var/lib/fleetpatch          # default; ~/.local/state/fleetpatch when not root
  server:
    log: /data/logs/sglang.log
    health_url: http://127.0.0.1:30000/health   # probed from the host itself
    ready_timeout: 1800
    restart:
      kind: command            # command | systemd | supervisor
      start: "{python} -m sglang.launch_server --model-path /models/kimi --speculative-algorithm EAGLE3 --speculative-eagle-topk 4 --port 30000"
      env: {}                  # environment for start, e.g. {SGLANG_ENABLE_SPEC_V2: "True"}
      workdir: /data
      pidfile: /run/sglang.pid
      # kind: systemd    -> unit: sglang.service
      # kind: supervisor -> program: sglang, config: /etc/supervisor/supervisord.conf
groups:
  canary: [gpu-a01]
hosts:
  gpu-a01:
    address: 10.1.230.174
  gpu-a02:
    address: 10.1.230.175
    port: 2222
    server: {restart: {env: {SGLANG_ENABLE_SPEC_V2: "True"}}}
"""

MINIMAL = """\
defaults:
  engine: {python: /usr/bin/python3}
  server:
    log: /tmp/sglang.log
    restart: {kind: systemd, unit: sglang.service}
hosts:
"""


def parse(text: str) -> Inventory:
    return parse_inventory(textwrap.dedent(text), "hosts.yaml")


def minimal(hosts: str, extra: str = "") -> Inventory:
    return parse(MINIMAL + textwrap.indent(textwrap.dedent(hosts), "  ") + textwrap.dedent(extra))


def err(text: str) -> str:
    with pytest.raises(InventoryError) as ei:
        parse(text)
    assert isinstance(ei.value, UsageError)
    msg = str(ei.value)
    assert msg.startswith("hosts.yaml: "), msg
    return msg


def minimal_err(hosts: str, extra: str = "") -> str:
    return err(MINIMAL + textwrap.indent(textwrap.dedent(hosts), "  ") + textwrap.dedent(extra))


# ---------------------------------------------------------------------- happy paths


def test_contract_example_loads_verbatim(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text(CONTRACT_EXAMPLE)
    inv = load_inventory(p)
    assert list(inv.hosts) == ["gpu-a01", "gpu-a02"]
    assert inv.groups == {"canary": ["gpu-a01"]}
    a1, a2 = inv.hosts["gpu-a01"], inv.hosts["gpu-a02"]
    assert isinstance(a1, Host)
    assert a1.address == "10.1.230.174" and a1.port == 22 and a1.user == "root"
    assert a2.port == 2222
    assert a1.identity_file == os.path.expanduser("~/.ssh/id_ed25519")
    assert a1.known_hosts == os.path.expanduser("~/.ssh/known_hosts")
    assert "~" not in a1.identity_file
    assert a1.connect_timeout == 10
    assert a1.engine.kind == "sglang"
    assert a1.engine.python == "/opt/sglang/.venv/bin/python"
    assert a1.engine.state_dir == "/var/lib/fleetpatch"
    assert a1.server.log == "/data/logs/sglang.log"
    assert a1.server.health_url == "http://127.0.0.1:30000/health"
    assert a1.server.ready_timeout == 1800
    r1, r2 = a1.server.restart, a2.server.restart
    assert r1.kind == "command" and r1.start.startswith("{python} -m sglang.launch_server")
    assert r1.workdir == "/data" and r1.pidfile == "/run/sglang.pid" and r1.stop_grace == 10
    assert r1.env == {}
    # deep merge: gpu-a02 only set env, everything else under restart came from defaults
    assert r2.env == {"SGLANG_ENABLE_SPEC_V2": "True"}
    assert r2.start == r1.start and r2.pidfile == r1.pidfile and r2.kind == "command"
    assert a2.server.log == a1.server.log
    assert a1.groups == ("canary",) and a2.groups == ()
    assert a1.gateway is None and a1.jump is None
    assert inv.path == p


def test_records_are_frozen_and_hashable():
    inv = parse(CONTRACT_EXAMPLE)
    h = inv.hosts["gpu-a01"]
    with pytest.raises(Exception):
        h.port = 1  # type: ignore[misc]
    with pytest.raises(Exception):
        h.server.restart.kind = "systemd"  # type: ignore[misc]
    assert len({h, inv.hosts["gpu-a02"]}) == 2


def test_repo_example_inventory_loads():
    repo = REPO
    if (repo / "hosts.yaml").exists():
        inv = load_inventory(repo / "hosts.yaml")
        assert inv.hosts


def test_state_dir_default_depends_on_user():
    inv = minimal("""\
        r: {address: h1, user: root}
        u: {address: h2, user: ubuntu}
        n: {address: h3}
        s: {address: h4, engine: {state_dir: /srv/fp}}
    """)
    assert inv.hosts["r"].engine.state_dir == "/var/lib/fleetpatch"
    assert inv.hosts["u"].engine.state_dir == "~/.local/state/fleetpatch"
    assert inv.hosts["n"].engine.state_dir == "~/.local/state/fleetpatch"
    assert inv.hosts["n"].user is None
    assert inv.hosts["s"].engine.state_dir == "/srv/fp"
    # no port in the inventory: ~/.ssh/config's Port applies, else 22
    assert inv.hosts["r"].port is None and inv.hosts["r"].connect_timeout == 10
    assert inv.hosts["r"].server.ready_timeout == 1800
    assert inv.hosts["r"].engine.kind == "sglang"


def test_env_scalars_are_coerced_to_strings():
    inv = minimal("""\
        a:
          address: h
          server: {restart: {env: {SGLANG_ENABLE_SPEC_V2: true, N: 1, F: 1.5, S: "x y", DISABLED: no}}}
    """)
    assert inv.hosts["a"].server.restart.env == {
        "SGLANG_ENABLE_SPEC_V2": "True", "N": "1", "F": "1.5", "S": "x y", "DISABLED": "False"}


def test_restart_kinds():
    inv = minimal("""\
        sd: {address: h1}
        sv: {address: h2, server: {restart: {kind: supervisor, program: sglang, config: /etc/supervisord.conf}}}
        cm: {address: h3, server: {restart: {kind: command, start: "python -m x", pidfile: /run/x.pid, stop_grace: 0}}}
    """)
    assert inv.hosts["sd"].server.restart.unit == "sglang.service"
    sv = inv.hosts["sv"].server.restart
    assert (sv.kind, sv.program, sv.config) == ("supervisor", "sglang", "/etc/supervisord.conf")
    cm = inv.hosts["cm"].server.restart
    assert (cm.kind, cm.start, cm.pidfile, cm.stop_grace) == ("command", "python -m x", "/run/x.pid", 0)


def test_gateway_forms():
    inv = minimal("""\
        bastion: {address: 192.0.2.1, user: jump, port: 2200}
        a: {address: 10.0.0.1, gateway: bastion}
        b: {address: 10.0.0.2, gateway: "ops@gw.example.com:2222"}
        c: {address: 10.0.0.3, gateway: gw.example.com}
        d: {address: 10.0.0.4, gateway: "root@[2001:db8::1]:22"}
    """)
    assert inv.hosts["a"].gateway == "bastion"
    assert inv.hosts["a"].jump == Jump(address="192.0.2.1", user="jump", port=2200, host="bastion")
    assert inv.hosts["b"].jump == Jump(address="gw.example.com", user="ops", port=2222)
    assert inv.hosts["c"].jump == Jump(address="gw.example.com", user=None, port=22)
    assert inv.hosts["d"].jump == Jump(address="2001:db8::1", user="root", port=22)
    assert inv.hosts["bastion"].jump is None


def test_gateway_from_defaults_with_null_override():
    text = MINIMAL.replace("defaults:\n", "defaults:\n  gateway: bastion\n") + textwrap.indent(textwrap.dedent("""\
        bastion: {address: 192.0.2.1, gateway: null}
        a: {address: 10.0.0.1}
    """), "  ")
    inv = parse(text)
    assert inv.hosts["bastion"].gateway is None
    assert inv.hosts["a"].jump.host == "bastion"


def test_null_host_section_and_null_values_mean_unset():
    msg = minimal_err("a:\n")
    assert "hosts.a.address: required but missing" in msg
    inv = minimal("a: {address: h, identity_file: null, server: null}\n")
    assert inv.hosts["a"].identity_file is None
    assert inv.hosts["a"].server.log == "/tmp/sglang.log"


# ---------------------------------------------------------------------- select


@pytest.fixture
def inv():
    return minimal("""\
        a1: {address: h1}
        a2: {address: h2}
        a3: {address: h3}
    """, "groups:\n  canary: [a1]\n  rest: [a3, a2]\n  empty: []\n")


def test_select_hosts_in_inventory_order(inv):
    assert [h.name for h in inv.select("a3,a1", None, changes_hosts=True)] == ["a1", "a3"]
    assert [h.name for h in inv.select(" a2 , a2", None, changes_hosts=True)] == ["a2"]
    assert [h.name for h in inv.select(["a3", "a2"], None, changes_hosts=True)] == ["a2", "a3"]


@pytest.mark.parametrize("hosts,which", [("a1,,a3", "host name 2 of 3"), ("a1,", "host name 2 of 2"),
                                         (",a1", "host name 1 of 2"), ("a1, ,a3", "host name 2 of 3")])
def test_an_empty_host_name_is_a_usage_error_not_a_shorter_list(inv, hosts, which):
    for changes in (True, False):
        with pytest.raises(UsageError) as ei:
            inv.select(hosts, None, changes_hosts=changes)
        assert str(ei.value) == (f"--hosts {hosts!r}: {which} is empty; separate the names with single commas, "
                                 "e.g. --hosts a,b")


def test_select_group(inv):
    assert [h.name for h in inv.select(None, "rest", changes_hosts=True)] == ["a2", "a3"]
    assert [h.name for h in inv.select(None, "all", changes_hosts=True)] == ["a1", "a2", "a3"]
    assert [h.name for h in inv.select(None, "canary", changes_hosts=False)] == ["a1"]


def test_select_neither(inv):
    assert [h.name for h in inv.select(None, None, changes_hosts=False)] == ["a1", "a2", "a3"]
    with pytest.raises(UsageError, match="--hosts a,b or --group G"):
        inv.select(None, None, changes_hosts=True)


def test_select_both_is_usage_error(inv):
    with pytest.raises(UsageError, match="not both"):
        inv.select("a1", "canary", changes_hosts=False)


def test_select_unknown_names(inv):
    with pytest.raises(UsageError) as ei:
        inv.select("a1,zz", None, changes_hosts=True)
    assert "'zz'" in str(ei.value) and "a1, a2, a3" in str(ei.value)
    with pytest.raises(UsageError) as ei:
        inv.select("a4", None, changes_hosts=True)
    assert "known hosts in hosts.yaml: a1, a2, a3" in str(ei.value)
    with pytest.raises(UsageError) as ei:
        inv.select(None, "canry", changes_hosts=True)
    assert "'canry'" in str(ei.value) and "all, canary, rest, empty" in str(ei.value)
    with pytest.raises(UsageError, match="has no hosts"):
        inv.select(None, "empty", changes_hosts=True)
    with pytest.raises(UsageError, match="names no host"):
        inv.select(",", None, changes_hosts=True)


def test_groups_field_on_hosts(inv):
    assert inv.hosts["a2"].groups == ("rest",)
    assert inv.hosts["a1"].groups == ("canary",)


# ---------------------------------------------------------------------- resolution


def test_resolve_inventory_path(monkeypatch, tmp_path):
    monkeypatch.delenv("FLEETPATCH_INVENTORY", raising=False)
    assert resolve_inventory_path(None) == Path("hosts.yaml")
    monkeypatch.setenv("FLEETPATCH_INVENTORY", str(tmp_path / "env.yaml"))
    assert resolve_inventory_path(None) == tmp_path / "env.yaml"
    assert resolve_inventory_path("x/inv.yaml") == Path("x/inv.yaml")
    assert resolve_inventory_path("~/inv.yaml") == Path(os.path.expanduser("~/inv.yaml"))
    monkeypatch.setenv("FLEETPATCH_INVENTORY", "")
    assert resolve_inventory_path(None) == Path("hosts.yaml")


# ---------------------------------------------------------------------- errors


def test_brief_example_message():
    msg = err(CONTRACT_EXAMPLE.replace("port: 2222", "port: abc"))
    assert msg == "hosts.yaml: hosts.gpu-a02.port: expected an integer, got 'abc'"


@pytest.mark.parametrize("line,key,reason", [
    ("port: 70000", "hosts.a.port", "expected an integer from 1 to 65535"),
    ("port: true", "hosts.a.port", "expected an integer, got true"),
    ("port: 22.5", "hosts.a.port", "expected an integer, got 22.5"),
    ("address: 1234", "hosts.a.address", "expected a string, got 1234 (quote it)"),
    ("address: ''", "hosts.a.address", "must not be empty"),
    ("address: [a, b]", "hosts.a.address", "expected a string, got a list"),
    ("user: {x: 1}", "hosts.a.user", "expected a string, got a mapping"),
    ("connect_timeout: soon", "hosts.a.connect_timeout", "expected a number of seconds"),
    ("connect_timeout: 0", "hosts.a.connect_timeout", "must be more than 0"),
    ("engine: /usr/bin/python", "hosts.a.engine", "expected a mapping, got '/usr/bin/python'"),
    ("engine: {python: 3}", "hosts.a.engine.python", "expected a string, got 3"),
    ("engine: {kind: tgi}", "hosts.a.engine.kind", "unknown engine kind 'tgi'; fleetpatch has profiles for sglang, vllm"),
    ("engine: {pyhton: /x}", "hosts.a.engine.pyhton", "unknown key (did you mean 'python'?)"),
    ("server: {log: [x]}", "hosts.a.server.log", "expected a string, got a list"),
    ("server: {ready_timeout: -1}", "hosts.a.server.ready_timeout", "must be more than 0"),
    ("server: {health_url: 'localhost:30000'}", "hosts.a.server.health_url", "expected an http://"),
    ("server: {restart: {kind: docker}}", "hosts.a.server.restart.kind",
     "expected one of command, systemd, supervisor, container, got 'docker'"),
    ("server: {restart: {stop_grace: -2}}", "hosts.a.server.restart.stop_grace", "must not be negative"),
    ("server: {restart: {env: [A]}}", "hosts.a.server.restart.env", "expected a mapping, got a list"),
    ("server: {restart: {env: {A: [1]}}}", "hosts.a.server.restart.env.A", "expected a string, got a list"),
    ("server: {restart: {env: {A: null}}}", "hosts.a.server.restart.env.A", "expected a string, got null"),
    ("server: {restart: {env: {1A: x}}}", "hosts.a.server.restart.env.1A", "not a valid environment variable"),
    ("server: {restart: {unti: x}}", "hosts.a.server.restart.unti", "unknown key (did you mean 'unit'?)"),
    ("prot: 22", "hosts.a.prot", "unknown key (did you mean 'port'?)"),
    ("gateway: 'a b c'", "hosts.a.gateway", "expected 'user@host:port'"),
    ("gateway: 'u@h:99999'", "hosts.a.gateway", "out of range"),
    ("gateway: a", "hosts.a.gateway", "names itself"),
    ("server: {restart: {env: {OFF: x}}}", "hosts.a.server.restart.env.false", "quote the key"),
])
def test_host_key_errors(line, key, reason):
    msg = minimal_err(f"a:\n  address: h\n  {line}\n" if not line.startswith("address") else f"a:\n  {line}\n")
    assert msg.startswith(f"hosts.yaml: {key}: "), msg
    assert reason in msg, msg


@pytest.mark.parametrize("hosts_text,key,reason", [
    ("a: {user: root}\n", "hosts.a.address", "required but missing (set it under hosts.a)"),
    ("a: {address: h, engine: {}}\n", None, None),  # python still comes from defaults
])
def test_required_keys(hosts_text, key, reason):
    if key is None:
        minimal(hosts_text)
        return
    msg = minimal_err(hosts_text)
    assert msg.startswith(f"hosts.yaml: {key}: {reason}"), msg


def test_missing_engine_python_and_server():
    msg = err("hosts:\n  a: {address: h}\n")
    assert msg.startswith("hosts.yaml: hosts.a.engine.python: required but missing "
                          "(set it under hosts.a.engine or under defaults.engine)")
    msg = err("hosts:\n  a: {address: h, engine: {python: /p}}\n")
    assert msg.startswith("hosts.yaml: hosts.a.server: required but missing")
    msg = err("hosts:\n  a: {address: h, engine: {python: /p}, server: {log: /l}}\n")
    assert msg.startswith("hosts.yaml: hosts.a.server.restart: required but missing")
    msg = err("hosts:\n  a: {address: h, engine: {python: /p}, server: {restart: {kind: systemd, unit: u}}}\n")
    assert msg.startswith("hosts.yaml: hosts.a.server.log: required but missing")
    msg = err("hosts:\n  a: {address: h, engine: {python: /p}, server: {log: /l, restart: {unit: u}}}\n")
    assert msg.startswith("hosts.yaml: hosts.a.server.restart.kind: required but missing")


@pytest.mark.parametrize("restart,key", [
    ("{kind: command, pidfile: /p}", "start"),
    ("{kind: command, start: x}", "pidfile"),
    ("{kind: systemd}", "unit"),
    ("{kind: supervisor, config: /c}", "program"),
])
def test_restart_kind_requirements(restart, key):
    msg = err(f"hosts:\n  a: {{address: h, engine: {{python: /p}}, server: {{log: /l, restart: {restart}}}}}\n")
    kind = restart.split(",")[0].split(":")[1].strip().rstrip("}")
    assert msg.startswith(f"hosts.yaml: hosts.a.server.restart.{key}: required when server.restart.kind is {kind}"), msg


def test_errors_in_defaults_name_defaults():
    msg = err(MINIMAL.replace("engine: {python: /usr/bin/python3}", "engine: {python: /usr/bin/python3}\n  port: x")
              + "  a: {address: h}\n")
    assert msg.startswith("hosts.yaml: defaults.port: expected an integer, got 'x'")
    msg = err(MINIMAL.replace("defaults:\n", "defaults:\n  colour: blue\n") + "  a: {address: h}\n")
    assert msg.startswith("hosts.yaml: defaults.colour: unknown key")


def test_top_level_errors():
    assert err("").startswith("hosts.yaml: the inventory is empty")
    assert err("- a\n- b\n").startswith("hosts.yaml: expected a mapping with 'hosts:' at the top, got a list")
    assert err("defaults: {}\n").startswith("hosts.yaml: hosts: required but missing")
    assert err("hosts: {}\n").startswith("hosts.yaml: hosts: no hosts listed")
    assert err("hosts: [a, b]\n").startswith("hosts.yaml: hosts: expected a mapping, got a list")
    assert err("host:\n  a: {}\n").startswith("hosts.yaml: host: unknown key (did you mean 'hosts'?)")
    assert "hosts.all" in err(MINIMAL + "  all: {address: h}\n")
    assert "hosts.a b" in err(MINIMAL + "  a b: {address: h}\n")


def test_group_errors():
    base = MINIMAL + "  a: {address: h}\n"
    msg = err(base + "groups:\n  canary: [a, zz]\n")
    assert msg.startswith("hosts.yaml: groups.canary[1]: unknown host 'zz'"), msg
    assert "hosts: a" in msg
    assert err(base + "groups:\n  canary: a\n").startswith(
        "hosts.yaml: groups.canary: expected a list of host names, got 'a'")
    assert err(base + "groups:\n  all: [a]\n").startswith("hosts.yaml: groups.all: 'all' is every host")
    assert err(base + "groups:\n  canary: [1]\n").startswith("hosts.yaml: groups.canary[0]: expected a host name")
    assert err(base + "groups: [a]\n").startswith("hosts.yaml: groups: expected a mapping, got a list")


def test_gateway_chain_refused():
    msg = minimal_err("""\
        g1: {address: x}
        g2: {address: y, gateway: g1}
        a: {address: z, gateway: g2}
    """)
    assert msg.startswith("hosts.yaml: hosts.a.gateway: the gateway host 'g2' has a gateway of its own")


def test_gateway_in_defaults_naming_itself():
    text = MINIMAL.replace("defaults:\n", "defaults:\n  gateway: bastion\n") + "  bastion: {address: x}\n"
    msg = err(text)
    assert msg.startswith("hosts.yaml: defaults.gateway: hosts.bastion names itself"), msg
    assert "gateway: null" in msg


def test_yaml_errors():
    msg = err("hosts:\n  a: {address: h\n")
    assert msg.startswith("hosts.yaml: not valid YAML at line"), msg
    msg = err(MINIMAL + "  a: {address: h}\n  a: {address: i}\n")
    assert "duplicate key 'a'" in msg, msg
    assert "line" in msg


@pytest.mark.parametrize("text, where, reason", [
    # PyYAML's own constructors raised a bare ValueError for these (found by tests/fast/test_input_fuzz.py)
    ("hosts:\n  a: {address: h, port: 2001-02-30}\n", "line 2, column 25", "'2001-02-30' is not a valid timestamp"),
    ("hosts:\n  a: {address: !!float abc}\n", "line 2, column 16", "'abc' is not a valid float"),
    ("hosts: !!int x\n", "line 1, column 8", "'x' is not a valid int"),
    ("hosts: {a: {address: h, port: !!int }}\n", "line 1, column 31", "'' is not a valid int (string index"),
    ("? 2001-99-99\n: 1\n", "line 1, column 3", "is not a valid timestamp (month must be in 1..12)"),
])
def test_values_yaml_cannot_build_are_yaml_errors(text, where, reason):
    msg = err(text)
    assert msg.startswith(f"hosts.yaml: not valid YAML at {where}: "), msg
    assert reason in msg and "quote it" in msg, msg


def test_deeply_nested_yaml_is_refused():
    assert err("hosts: " + "[" * 20000 + "]" * 20000 + "\n") == "hosts.yaml: not valid YAML: nested too deeply"


def test_odd_keys_are_named_quoted():
    assert err('"": 1\nhosts: {a: {address: h}}\n').startswith("hosts.yaml: '': unknown key")
    msg = minimal_err("  a: {address: h, ' port': 22}\n")
    assert msg.startswith("hosts.yaml: hosts.a.' port': unknown key"), msg
    assert minimal_err('  "": {address: h}\n').startswith("hosts.yaml: hosts.'': not a usable host name")


def test_file_errors(tmp_path):
    with pytest.raises(InventoryError) as ei:
        load_inventory(tmp_path / "nope.yaml")
    assert str(ei.value).startswith(f"{tmp_path / 'nope.yaml'}: no such file")
    assert "--inventory" in str(ei.value) and "FLEETPATCH_INVENTORY" in str(ei.value)
    with pytest.raises(InventoryError, match="is a directory"):
        load_inventory(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"hosts:\n  a: {address: \xff}\n")
    with pytest.raises(InventoryError, match="not UTF-8"):
        load_inventory(bad)
    if os.geteuid() != 0:
        locked = tmp_path / "locked.yaml"
        locked.write_text(CONTRACT_EXAMPLE)
        locked.chmod(0)
        with pytest.raises(InventoryError, match="cannot read"):
            load_inventory(locked)


def test_error_names_the_file_as_given(tmp_path):
    p = tmp_path / "fleet.yaml"
    p.write_text(CONTRACT_EXAMPLE.replace("port: 2222", "port: abc"))
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    assert str(ei.value) == f"{p}: hosts.gpu-a02.port: expected an integer, got 'abc'"
    assert ei.value.key == "hosts.gpu-a02.port"
    assert ei.value.file == str(p)
