"""fleetpatch.router against real sglang-router binaries of each API generation.

0.1.9: /add_worker, /remove_worker, /list_workers. 0.2.4: GET/POST /workers,
DELETE /workers/{url} (ids are the URLs). 0.3.2 (the installed one): the same
routes keyed by UUID. Each wheel comes from PyPI once (cached)."""
from __future__ import annotations

import json
import urllib.request

import pytest

from fleetpatch_demo.routerproc import LocalWorker, RouterProcess, router_command, router_install, standin_site
from fleetpatch.router import LEGACY, REST, Router

pytestmark = pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")


@pytest.mark.parametrize("version, kind, description", [
    ("0.1.9", LEGACY, "sglang-router 0.1.x-0.2.1 API"),
    ("0.2.4", REST, "sglang-router 0.2.x API"),
    ("0.3.2", REST, "sglang-router 0.3.x API"),
])
def test_every_api_generation(tmp_path, version, kind, description):
    site = standin_site(tmp_path / "site")
    install = router_install(version)
    w1 = LocalWorker(site, tmp_path / "w1.log").start()
    w2 = LocalWorker(site, tmp_path / "w2.log").start()
    try:
        with RouterProcess(tmp_path / "router.log", install_dir=install) as rp:
            r = Router(rp.url)
            assert r.detect().kind == kind
            first = r.add(w1.url, timeout=20)
            r.add(w2.url, timeout=20)
            api = Router(rp.url).detect()
            assert api.kind == kind and api.description.startswith(description), api
            assert sorted(w.url for w in r.list_workers()) == sorted([w1.url, w2.url])
            assert r.remove(w1.url, timeout=10) == first
            assert [w.url for w in r.list_workers()] == [w2.url]
            assert r.add(w1.url, timeout=20).url == w1.url
            assert sorted(w.url for w in r.list_workers()) == sorted([w1.url, w2.url])
            req = urllib.request.Request(rp.url + "/generate", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode())
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert isinstance(json.loads(resp.read())["text"], str)
    finally:
        w1.stop()
        w2.stop()
