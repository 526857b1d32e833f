"""The laptop's router calls go direct, whatever http_proxy/https_proxy the
operator's environment sets (a router on a private address must not be asked
through the operator's proxy), and through `router.proxy` when the inventory
names one. The proxy is a real local listener that records every request and
forwards it; the router is the real sglang-router."""
from __future__ import annotations

import http.client
import http.server
import os
import threading
import urllib.parse

import pytest

from fleetpatch.inventory import InventoryError, parse_inventory
from fleetpatch.router import Router, RouterError, worker_loads
from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo.routerproc import LocalWorker, RouterProcess, free_port, router_command, standin_site
from support.paths import FIXTURE_PATCHES

needs_router = pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")
needs_fleet = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD),
                                 reason="needs root and /usr/sbin/sshd")
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")


class RecordingProxy:
    """A plain HTTP forward proxy on loopback: records (method, absolute URL) of each
    request it gets, and forwards it to the URL's host."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def forward(self):
                proxy.seen.append((self.command, self.path))
                target = urllib.parse.urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
                conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=30)
                try:
                    conn.request(self.command, (target.path or "/") + (f"?{target.query}" if target.query else ""),
                                 body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict:
        return {name: self.url for name in PROXY_VARS} | {"no_proxy": "", "NO_PROXY": ""}


@pytest.fixture
def proxy():
    with RecordingProxy() as p:
        yield p


# ----------------------------------------------------------------- inventory

INVENTORY = """\
defaults:
  engine: {python: /usr/bin/python3}
  server:
    log: /var/log/sglang.log
    restart: {kind: systemd, unit: sglang}
  router: {urls: ["http://10.1.0.5:30080"]%s}
hosts:
  gpu-a:
    address: 10.0.0.1
    server: {url: "http://10.0.0.1:30000"}
  gpu-b:
    address: 10.0.0.2
    server: {url: "http://10.0.0.2:30000"}
"""


def test_router_proxy_is_read_and_checked():
    inv = parse_inventory(INVENTORY % ', proxy: "http://proxy.corp:3128"')
    assert inv.hosts["gpu-a"].router.proxy == "http://proxy.corp:3128"
    assert parse_inventory(INVENTORY % "").hosts["gpu-a"].router.proxy is None
    with pytest.raises(InventoryError) as e:
        parse_inventory(INVENTORY % ", proxy: proxy.corp:3128")
    assert "hosts.yaml: defaults.router.proxy: expected an http:// or https:// URL, got 'proxy.corp:3128'" in str(e.value)
    with pytest.raises(InventoryError) as e:
        parse_inventory(INVENTORY % ", via: gpu-b, proxy: \"http://proxy.corp:3128\"")
    assert "defaults.router.proxy: router.via (gpu-b) already says how the routers are reached" in str(e.value)


# ----------------------------------------------------------------- the client against the real router

@needs_router
def test_router_calls_go_direct_despite_the_environment_and_through_router_proxy(tmp_path, proxy, monkeypatch):
    site = standin_site(tmp_path / "site")
    with RouterProcess(tmp_path / "router.log") as router:
        worker = LocalWorker(site, tmp_path / "w.log").start()
        try:
            for name, value in proxy.env().items():
                monkeypatch.setenv(name, value)
            direct = Router(router.url)
            assert direct.add(worker.url, timeout=15).healthy is True
            assert [w.url for w in direct.list_workers()] == [worker.url]
            assert worker_loads(worker.url) == (0, 0)
            assert direct.remove(worker.url, timeout=10) is not None
            assert proxy.seen == [], "the environment's proxy was used"

            through = Router(router.url, proxy=proxy.url)
            assert through.add(worker.url, timeout=15).healthy is True
            assert through.remove(worker.url, timeout=10) is not None
            methods = {(m, urllib.parse.urlsplit(u).path.split("/")[1]) for m, u in proxy.seen}
            assert {("GET", "workers"), ("POST", "workers"), ("DELETE", "workers")} <= methods, proxy.seen
            assert all(u.startswith(router.url + "/") for _, u in proxy.seen), proxy.seen
        finally:
            worker.stop()


def test_a_proxy_that_is_down_is_named_in_the_error(monkeypatch):
    down = "http://user:secret@127.0.0.1:%d" % free_port()
    with pytest.raises(RouterError) as e:
        Router("http://127.0.0.1:%d" % free_port(), proxy=down, http_timeout=2).list_workers()
    msg = str(e.value)
    assert "(through proxy http://127.0.0.1:" in msg and "secret" not in msg, msg


# ----------------------------------------------------------------- the installed program

@pytest.fixture
def routed(operator, fleet, tmp_path):
    """v2a and v2b behind a real router, listed there (never the last healthy worker);
    the other hosts without a router."""
    with RouterProcess(tmp_path / "router.log") as router:
        doc = operator.inventory()
        for name in ("v2a", "v2b"):
            url = f"http://127.0.0.1:{fleet.hosts[name].http_port}"
            Router(router.url).add(url, timeout=20)
            doc["hosts"][name].setdefault("server", {})["url"] = url
            doc["hosts"][name]["router"] = {"urls": [router.url]}
        operator.write_inventory(doc)
        yield operator, router, doc


@needs_fleet
@needs_router
def test_deploy_behind_a_router_ignores_the_environments_proxy_unless_the_inventory_names_one(routed, proxy):
    from pathlib import Path
    operator, router, doc = routed
    fixtures = str(FIXTURE_PATCHES)
    run = operator.run("deploy-patch", "--patch", "v2-only-beacon", "--patches", fixtures, "--hosts", "v2a",
                       "--timeout", "60", env=proxy.env())
    assert run.code == 0, run
    assert run.host("v2a")["router"]["removed"] and run.host("v2a")["router"]["readded"]
    assert proxy.seen == [], f"the environment's proxy saw {proxy.seen}"

    doc["hosts"]["v2a"]["router"]["proxy"] = proxy.url
    operator.write_inventory(doc)
    back = operator.run("rollback", "--hosts", "v2a", "--patches", fixtures, "--timeout", "60", env=proxy.env())
    assert back.code == 0, back
    assert back.host("v2a")["router"]["readded"], back.host("v2a")
    paths = [urllib.parse.urlsplit(u).path for _, u in proxy.seen]
    assert all(u.startswith(router.url + "/") for _, u in proxy.seen), proxy.seen
    assert {"GET", "DELETE", "POST"} <= {m for m, _ in proxy.seen} and "/workers" in paths, proxy.seen
