"""Groups as host lists or as {hosts, router}: a group's router reaches every host in it,
host > group > defaults, and conflicts and bad keys are named by their key path."""
from __future__ import annotations

import textwrap

import pytest

from fleetpatch.inventory import InventoryError, parse_inventory

BASE = """\
defaults:
  engine: {python: /usr/bin/python3}
  server:
    log: /var/log/sglang.log
    restart: {kind: systemd, unit: sglang}
{defaults}
hosts:
  e1: {address: 10.0.1.1, server: {url: "http://10.0.1.1:30000"}}
  e2: {address: 10.0.1.2, server: {url: "http://10.0.1.2:30000"}}
  w1: {address: 10.0.2.1, server: {url: "http://10.0.2.1:30000"}}
  solo:
    address: 10.0.3.1
    server: {url: "http://10.0.3.1:30000"}
{solo}
groups:
{groups}
"""

EAST = "http://10.0.1.100:30080"
WEST = "http://10.0.2.100:30080"


def inv(groups: str, defaults: str = "", solo: str = ""):
    text = (BASE.replace("{defaults}", textwrap.indent(defaults, "  ") if defaults else "")
            .replace("{solo}", textwrap.indent(solo, "    ") if solo else "")
            .replace("{groups}", textwrap.indent(textwrap.dedent(groups), "  ")))
    return parse_inventory(text)


def error(groups: str, defaults: str = "", solo: str = "") -> str:
    with pytest.raises(InventoryError) as e:
        inv(groups, defaults, solo)
    return str(e.value)


def urls(inventory, name):
    r = inventory.hosts[name].router
    return None if r is None else r.urls


def test_a_group_router_applies_to_its_hosts_only_and_the_list_form_still_works():
    i = inv(f"""\
        east: {{hosts: [e1, e2], router: {{urls: ["{EAST}"]}}}}
        west: {{hosts: [w1], router: {{urls: ["{WEST}"]}}}}
        canary: [e1]
        """)
    assert urls(i, "e1") == urls(i, "e2") == (EAST,)
    assert urls(i, "w1") == (WEST,)
    assert urls(i, "solo") is None
    assert i.groups == {"east": ["e1", "e2"], "west": ["w1"], "canary": ["e1"]}
    assert i.hosts["e1"].groups == ("east", "canary")
    assert [h.name for h in i.group("east")] == ["e1", "e2"]


def test_precedence_host_over_group_over_defaults():
    i = inv(f"""\
        east: {{hosts: [e1, e2, solo], router: {{urls: ["{EAST}"]}}}}
        """, defaults=f'router: {{urls: ["{WEST}"], via: w1}}',
        solo='router: {urls: ["http://10.0.3.100:30080"]}')
    assert urls(i, "w1") == (WEST,)                           # defaults only
    assert urls(i, "e1") == (EAST,)                           # group over defaults
    assert i.hosts["e1"].router.via == "w1"                   # ... merged key by key, like defaults
    assert urls(i, "solo") == ("http://10.0.3.100:30080",)    # host over group


def test_a_group_router_null_switches_the_defaults_router_off_for_its_hosts():
    i = inv("quiet: {hosts: [e1], router: null}\n", defaults=f'router: {{urls: ["{WEST}"]}}')
    assert urls(i, "e1") is None and urls(i, "e2") == (WEST,)


def test_two_groups_with_the_same_router_are_fine():
    i = inv(f"""\
        a: {{hosts: [e1], router: {{urls: ["{EAST}"]}}}}
        b: {{hosts: [e1, e2], router: {{urls: ["{EAST}"]}}}}
        """)
    assert urls(i, "e1") == urls(i, "e2") == (EAST,)


def test_a_host_in_two_groups_with_different_routers_is_refused_naming_both_and_the_host():
    msg = error(f"""\
        east: {{hosts: [e1, e2], router: {{urls: ["{EAST}"]}}}}
        west: {{hosts: [w1, e2], router: {{urls: ["{WEST}"]}}}}
        """)
    assert msg.startswith("hosts.yaml: hosts.e2: is in groups east and west, which set different routers"), msg
    assert "groups.east.router" in msg and "groups.west.router" in msg


@pytest.mark.parametrize("groups, expected", [
    ('east: {hosts: [e1], router: {urls: ["10.0.1.100:30080"]}}\n',
     "hosts.yaml: groups.east.router.urls[0]: expected an http:// or https:// URL, got '10.0.1.100:30080'"),
    (f'east: {{hosts: [e1], router: {{urls: ["{EAST}", "{EAST}/"]}}}}\n',
     f"hosts.yaml: groups.east.router.urls[1]: '{EAST}/' is listed twice"),
    (f'east: {{hosts: [e1], router: {{url: ["{EAST}"]}}}}\n',
     "hosts.yaml: groups.east.router.url: unknown key; known keys here: urls, via, proxy"),
    ('east: {hosts: [e1], router: [x]}\n', "hosts.yaml: groups.east.router: expected a mapping, got a list"),
    (f'east: {{hosts: [e1], router: {{urls: ["{EAST}"], via: nowhere}}}}\n',
     "hosts.yaml: groups.east.router.via: unknown host 'nowhere'"),
    ('east: {hosts: [e1], router: {urls: ["https://10.0.1.100:30443"], via: w1}}\n',
     "hosts.yaml: groups.east.router.urls[0]: 'https://10.0.1.100:30443': a router reached through router.via"),
    ('east: {hosts: [e1, zz]}\n', "hosts.yaml: groups.east.hosts[1]: unknown host 'zz'"),
    ('east: {hosts: e1}\n', "hosts.yaml: groups.east.hosts: expected a list of host names, got 'e1'"),
    (f'east: {{hsts: [e1], router: {{urls: ["{EAST}"]}}}}\n',
     "hosts.yaml: groups.east.hsts: unknown key (did you mean 'hosts'?); known keys here: hosts, router"),
    ('east: 3\n', "hosts.yaml: groups.east: expected a list of host names, got 3 (or a mapping {hosts: [...], "),
])
def test_group_errors_name_the_key_path(groups, expected):
    assert error(groups).startswith(expected), error(groups)


def test_a_group_router_needs_server_url_on_its_hosts():
    text = BASE.replace("{defaults}", "").replace("{solo}", "").replace(
        "{groups}", f'  east: {{hosts: [e1, bare], router: {{urls: ["{EAST}"]}}}}').replace(
        "hosts:\n", "hosts:\n  bare: {address: 10.0.9.9}\n", 1)
    with pytest.raises(InventoryError) as e:
        parse_inventory(text)
    assert str(e.value).startswith("hosts.yaml: hosts.bare.server.url: required when a router section applies")


def test_via_resolves_to_the_via_hosts_record():
    i = inv(f'east: {{hosts: [e1, e2], router: {{urls: ["{EAST}"], via: w1}}}}\n')
    r = i.hosts["e1"].router
    assert r.via == "w1" and r.via_host.address == "10.0.2.1"
    assert i.hosts["w1"].router is None
