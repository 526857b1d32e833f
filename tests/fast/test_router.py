"""fleetpatch.router's pure parts and the inventory's router section.

The bodies parsed here are the real routers' answers: 0.3.2's as captured
from the binary on loopback, 0.2.0's and 0.1.9's as their server.rs builds
them (worker_to_info: id = url; list_workers: {"urls": [...]})."""
from __future__ import annotations

import textwrap

import pytest

from fleetpatch.inventory import InventoryError, parse_inventory
from fleetpatch.router import (LEGACY, REST, RouterApi, SmokeConf, Worker, capacity_problem, check_smoke_answer,
                               find_worker,
                               parse_worker_list, parse_worker_loads)

V032 = {"workers": [
    {"id": "1d2efbff-b73e-4b4f-863b-eed379502d03", "url": "http://127.0.0.1:31001", "model_id": "/models/x",
     "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": True, "load": 0,
     "connection_mode": "HTTP", "metadata": {"model_path": "/models/x"}, "disable_health_check": False},
    {"id": "35b4facc-e711-47e0-ad50-dd1680248f0b", "url": "http://127.0.0.1:31001/", "is_healthy": False},
], "total": 2, "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2}}
V020 = {"workers": [{"id": "http://10.0.0.7:30000", "url": "http://10.0.0.7:30000", "is_healthy": True}],
        "total": 1, "stats": {}}
V019 = {"urls": ["http://10.0.0.7:30000", "http://10.0.0.8:30000"]}


def test_parse_worker_lists_of_each_api():
    kind, workers = parse_worker_list(V032)
    assert kind == REST
    assert workers == [Worker("http://127.0.0.1:31001", "1d2efbff-b73e-4b4f-863b-eed379502d03", True),
                       Worker("http://127.0.0.1:31001/", "35b4facc-e711-47e0-ad50-dd1680248f0b", False)]
    kind, workers = parse_worker_list(V020)
    assert kind == REST and workers == [Worker("http://10.0.0.7:30000", "http://10.0.0.7:30000", True)]
    kind, workers = parse_worker_list(V019)
    assert kind == LEGACY and [w.url for w in workers] == V019["urls"] and workers[0].healthy is None
    assert parse_worker_list({"workers": [], "total": 0}) == (REST, [])


@pytest.mark.parametrize("body", [None, [], {"detail": "Not Found"}, {"workers": [{"id": "x"}]},
                                  {"urls": ["a", 3]}, {"workers": "none"}])
def test_parse_worker_list_refuses_other_bodies(body):
    with pytest.raises(ValueError):
        parse_worker_list(body)


def test_worker_urls_match_exactly_as_strings():
    _, workers = parse_worker_list(V032)
    assert find_worker(workers, "http://127.0.0.1:31001").id.startswith("1d2e")
    assert find_worker(workers, "http://127.0.0.1:31001/").id.startswith("35b4")
    assert find_worker(workers, "http://localhost:31001") is None
    assert find_worker(workers, "HTTP://127.0.0.1:31001") is None
    assert find_worker(workers, "http://127.0.0.1:3100") is None


def test_api_descriptions_name_the_version_range():
    assert "0.3.x" in RouterApi(REST, "uuid").description
    assert "0.2.x" in RouterApi(REST, "url").description
    assert "0.1.x-0.2.1" in RouterApi(LEGACY).description
    assert "no worker listed yet" in RouterApi(REST, None).description


def test_parse_worker_loads_of_v1_loads_and_get_load():
    v1 = {"timestamp": "x", "version": "0.5.9", "dp_rank_count": 2,
          "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1},
                    {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 0}],
          "aggregate": {"total_running_reqs": 5, "total_waiting_reqs": 1, "total_reqs": 6}}
    assert parse_worker_loads(v1) == (5, 1)
    get_load = [{"dp_rank": 0, "num_reqs": 4, "num_waiting_reqs": 1, "num_tokens": 812, "ts_tic": 1.0},
                {"dp_rank": 1, "num_reqs": 2, "num_waiting_reqs": 2, "num_tokens": 10, "ts_tic": 1.0}]
    assert parse_worker_loads(get_load) == (3, 3)
    assert parse_worker_loads({"aggregate": {"total_running_reqs": 0, "total_waiting_reqs": 0}}) == (0, 0)
    for bad in ({"aggregate": {"total_running_reqs": "0"}}, [{"num_tokens": 3}], "busy", None):
        with pytest.raises(ValueError):
            parse_worker_loads(bad)


def test_smoke_answer_must_be_200_json_with_text():
    assert check_smoke_answer(200, b'{"text": " Paris", "meta_info": {}}') is None
    assert "no text" in check_smoke_answer(200, b'{"text": ""}')   # an answer with no text fails (issue 31)
    assert "HTTP 503" in check_smoke_answer(503, b"")
    assert check_smoke_answer(503, b"\n  overloaded  \nsecond line") == "HTTP 503: overloaded"   # its first line
    assert "not JSON" in check_smoke_answer(200, b"data: [DONE]")
    assert "text" in check_smoke_answer(200, b'{"error": "x"}')
    assert "text" in check_smoke_answer(200, b'{"text": 3}')


# --------------------------------------------------------------------------- inventory

BASE = """\
defaults:
  engine: {python: /usr/bin/python3}
  server:
    log: /var/log/sglang.log
    restart: {kind: systemd, unit: sglang}
{extra}
hosts:
  gpu-a:
    address: 10.0.0.1
    server: {url: "http://10.0.0.1:30000"}
  gpu-b:
    address: 10.0.0.2
{host_b}
"""


def inv(extra="", host_b="    server: {url: \"http://10.0.0.2:30000\"}"):
    text = BASE.replace("{extra}", textwrap.indent(extra, "  ") if extra else "").replace("{host_b}", host_b)
    return parse_inventory(text)


def error(extra="", host_b="    server: {url: \"http://10.0.0.2:30000\"}") -> str:
    with pytest.raises(InventoryError) as e:
        inv(extra, host_b)
    return str(e.value)


def test_router_in_defaults_applies_to_every_host_with_its_server_url():
    hosts = inv("router: {urls: [\"http://10.0.0.9:30080\", \"http://10.0.0.10:30080\"]}").hosts
    assert hosts["gpu-a"].router.urls == ("http://10.0.0.9:30080", "http://10.0.0.10:30080")
    assert hosts["gpu-a"].router.via is None
    assert hosts["gpu-a"].server.url == "http://10.0.0.1:30000"
    assert hosts["gpu-b"].server.url == "http://10.0.0.2:30000"
    assert hosts["gpu-b"].server.smoke == SmokeConf()


def test_no_router_section_means_no_router():
    hosts = inv().hosts
    assert hosts["gpu-a"].router is None and hosts["gpu-a"].server.url == "http://10.0.0.1:30000"


def test_host_router_overrides_defaults_and_null_switches_it_off():
    hosts = inv("router: {urls: [\"http://10.0.0.9:30080\"], via: gpu-a}",
                "    server: {url: \"http://10.0.0.2:30000\", smoke: {prompt: Hi, max_new_tokens: 2}}\n"
                "    router: null").hosts
    assert hosts["gpu-a"].router.via == "gpu-a"
    assert hosts["gpu-b"].router is None
    assert hosts["gpu-b"].server.smoke == SmokeConf("Hi", 2)


def test_a_single_router_url_may_be_a_string():
    assert inv("router: {urls: \"http://10.0.0.9:30080\"}").hosts["gpu-a"].router.urls == ("http://10.0.0.9:30080",)


@pytest.mark.parametrize("extra, host_b, expected", [
    ("router: {urls: [\"http://r:1\"]}", "", "hosts.yaml: hosts.gpu-b.server.url: required when a router section "
                                              "applies to the host"),
    ("router: {urls: []}", None, "hosts.yaml: defaults.router.urls: expected a list of one or more router URLs"),
    ("router: {urls: [\"10.0.0.9:30080\"]}", None,
     "hosts.yaml: defaults.router.urls[0]: expected an http:// or https:// URL, got '10.0.0.9:30080'"),
    ("router: {urls: [\"http://r:1\", \"http://r:1/\"]}", None, "defaults.router.urls[1]: 'http://r:1/' is listed twice"),
    ("router: {urls: [\"http://r:99999\"]}", None, "defaults.router.urls[0]: bad port in 'http://r:99999'"),
    ("router: {url: [\"http://r:1\"]}", None, "defaults.router.url: unknown key; known keys here: urls, via, proxy"),
    ("router: [\"http://r:1\"]", None, "defaults.router: expected a mapping, got a list"),
    ("router: {urls: [\"http://r:1\"], via: gpu-z}", None, "hosts.yaml: defaults.router.via: unknown host 'gpu-z'"),
    ("router: {via: gpu-a}", None, None),
])
def test_router_section_errors_name_file_key_and_reason(extra, host_b, expected):
    host_b = "    server: {url: \"http://10.0.0.2:30000\"}" if host_b is None else host_b
    if expected is None:  # via without urls: no router applies
        assert inv(extra, host_b).hosts["gpu-a"].router is None
        return
    assert expected in error(extra, host_b)


def test_server_url_and_smoke_errors():
    assert ("hosts.gpu-b.server.url: expected an http:// or https:// URL, got '10.0.0.2:30000'"
            in error(host_b="    server: {url: \"10.0.0.2:30000\"}"))
    assert ("hosts.gpu-b.server.smoke.max_new_tokens: expected an integer from 1 to 4096, got 0"
            in error(host_b="    server: {url: \"http://h:1\", smoke: {max_new_tokens: 0}}"))
    assert ("hosts.gpu-b.server.smoke.text: unknown key; known keys here: prompt, max_new_tokens"
            in error(host_b="    server: {url: \"http://h:1\", smoke: {text: hi}}"))


def test_capacity_never_the_last_healthy_worker_and_max_unavailable():
    ws = [Worker("http://a:1", "1", True), Worker("http://b:1", "2", True), Worker("http://c:1", "3", False)]
    assert capacity_problem("http://r:9", ws, ["http://a:1"]) is None
    msg = capacity_problem("http://r:9", ws, ["http://a:1", "http://b:1"])
    assert msg == ("router http://r:9: taking out 2 workers at once would leave it no healthy worker "
                   "(2 healthy of 3 listed); use a smaller batch or add workers")
    assert capacity_problem("http://r:9", ws, ["http://a:1"], max_unavailable=1) == (
        "router http://r:9: 1 worker out at once plus 1 already unhealthy is more than --max-unavailable 1")
    assert capacity_problem("http://r:9", ws, ["http://a:1"], max_unavailable=2) is None
    assert capacity_problem("http://r:9", ws, ["http://z:1"]) is None  # not behind this router
    assert "no healthy worker" in capacity_problem("http://r:9", ws[:1], ["http://a:1"])
