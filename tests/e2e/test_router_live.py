"""fleetpatch.router against the real sglang-router binary on loopback, in front of stand-ins."""
from __future__ import annotations

import re

import pytest

from fleetpatch_demo.routerproc import LocalWorker, RouterProcess, free_port, router_command, standin_site
from fleetpatch.router import REST, Router, RouterError, Routers, worker_loads

pytestmark = pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")


@pytest.fixture
def site(tmp_path):
    return standin_site(tmp_path / "site")


@pytest.fixture
def router(tmp_path):
    with RouterProcess(tmp_path / "router.log") as rp:
        yield rp


def test_detect_add_remove_readd_on_the_real_router(tmp_path, site, router):
    w1 = LocalWorker(site, tmp_path / "w1.log").start()
    w2 = LocalWorker(site, tmp_path / "w2.log").start()
    try:
        r = Router(router.url)
        api = r.detect()
        assert api.kind == REST and "no worker listed yet" in api.description
        assert r.list_workers() == []

        a1 = r.add(w1.url, timeout=15)
        a2 = r.add(w2.url, timeout=15)
        assert (a1.url, a1.healthy, a2.url, a2.healthy) == (w1.url, True, w2.url, True)
        assert Router(router.url).detect().description.startswith("sglang-router 0.3.x API")
        assert a1.id != a1.url  # 0.3.x: keyed by UUID
        # what the router asked the worker when it was added
        log = w1.text_since_start()
        for line in ('"GET /health HTTP/1.1" 200', '"GET /server_info HTTP/1.1" 200', '"GET /model_info HTTP/1.1" 200'):
            assert line in log, line
        assert r.add(w1.url, timeout=5) == a1  # listed healthy already: nothing sent, same id

        removed = r.remove(w1.url, timeout=10)
        assert removed == a1
        assert [w.url for w in r.list_workers()] == [w2.url]
        assert r.remove(w1.url, timeout=10) is None  # not listed: nothing to do

        back = r.add(w1.url, timeout=15)
        assert back.healthy is True and back.id != a1.id  # a re-added worker gets a new id
        assert sorted(w.url for w in r.list_workers()) == sorted([w1.url, w2.url])
        assert worker_loads(w1.url) == (0, 0)
    finally:
        w1.stop()
        w2.stop()


def test_a_url_that_differs_by_a_trailing_slash_is_another_worker(tmp_path, site, router):
    w1 = LocalWorker(site, tmp_path / "w1.log").start()
    try:
        r = Router(router.url)
        r.add(w1.url + "/", timeout=15)
        with pytest.raises(RouterError) as e:
            r.require_listed(w1.url)
        msg = str(e.value)
        assert msg.startswith("router %s: worker %s is not in its list" % (router.url, w1.url))
        assert "it lists %s/ - server.url must be exactly the URL the router lists" % w1.url in msg
        assert r.require_listed(w1.url + "/").url == w1.url + "/"
        assert r.remove(w1.url, timeout=5) is None  # the slash-less URL is not listed: untouched
        assert [w.url for w in r.list_workers()] == [w1.url + "/"]
    finally:
        w1.stop()


def test_router_down_or_not_a_router_is_a_clear_error(tmp_path, site):
    url = "http://127.0.0.1:%d" % free_port()
    with pytest.raises(RouterError) as e:
        Router(url, http_timeout=2).detect()
    assert str(e.value).startswith("router %s: GET /workers: cannot reach the router (" % url)
    assert "is router.urls in the inventory right?" in str(e.value)
    w = LocalWorker(site, tmp_path / "w.log").start()
    try:
        with pytest.raises(RouterError) as e:
            Router(w.url).detect()
        assert str(e.value) == ("router %s: does not answer like an sglang-router (GET /workers: HTTP 404, "
                                "GET /list_workers: HTTP 404); is this the router's URL, not a worker's?" % w.url)
    finally:
        w.stop()


def test_adding_a_worker_that_never_gets_healthy_times_out_naming_both(tmp_path, site, router):
    w = LocalWorker(site, tmp_path / "w.log", env={"FLEETPATCH_STANDIN_NEVER_READY": "1"})
    w.start(wait=False)
    try:
        r = Router(router.url)
        with pytest.raises(RouterError) as e:
            r.add(w.url, timeout=2)
        assert re.match(r"router %s: worker %s not listed 2 s after it was added \(the router keeps retrying"
                        % (re.escape(router.url), re.escape(w.url)), str(e.value)), str(e.value)
        assert r.list_workers() == []
    finally:
        w.stop()


def test_routers_remove_is_all_or_nothing(tmp_path, site):
    w = LocalWorker(site, tmp_path / "w.log").start()
    other = LocalWorker(site, tmp_path / "o.log").start()
    try:
        with RouterProcess(tmp_path / "r1.log") as r1, RouterProcess(tmp_path / "r2.log") as r2:
            Router(r1.url).add(w.url, timeout=15)
            Router(r1.url).add(other.url, timeout=15)
            Router(r2.url).add(other.url, timeout=15)  # w is missing from the second router
            both = Routers([r1.url, r2.url])
            with pytest.raises(RouterError) as e:
                both.remove(w.url, timeout=10)
            assert str(e.value).startswith("router %s: worker %s is not in its list" % (r2.url, w.url))
            assert Router(r1.url).find(w.url).healthy is True  # put back where it had been taken out
            Router(r2.url).add(w.url, timeout=15)
            removed = both.remove(w.url, timeout=10)
            assert [r.url for r, _ in removed] == [r1.url, r2.url]
            assert Router(r1.url).find(w.url) is None and Router(r2.url).find(w.url) is None
            assert [x.healthy for x in both.add(w.url, timeout=15)] == [True, True]
    finally:
        w.stop()
        other.stop()
