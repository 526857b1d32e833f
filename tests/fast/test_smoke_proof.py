"""Proof under traffic (issue 31, 1): after every restart, once the server is ready and
before its verdict, fleetpatch sends it smoke requests from the host (patch.yaml's `prove`),
so a line that runs per request, or only for larger batches, gets its chance to run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetpatch import steps
from fleetpatch.errors import Status
from fleetpatch.patchset import PatchError, load_patch
from fleetpatch.engines import sglang
from support.localhost import EAGLE, LocalHost, job, template_env
from support.paths import FIXTURE_PATCHES


def newer_python() -> str | None:
    """A Python 3.12+ on this machine (PATH or pyenv): the probe's lines mode, which tells a
    function that ran from its lines that did (3.11's functions mode counts the function's start)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))) / "versions"
    for found in [shutil.which("python3.13"), shutil.which("python3.12")] + \
            [str(p) for p in sorted(pyenv.glob("3.1[2-9]*/bin/python3"), reverse=True)]:
        if found and subprocess.run([found, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"]).returncode == 0:
            return found
    return None


@pytest.fixture(scope="module")
def lines_template(tmp_path_factory):
    python = newer_python()
    if python is None:
        pytest.skip("needs a Python 3.12+ (the probe's lines mode) on PATH or in pyenv")
    return template_env(tmp_path_factory.mktemp("venv312"), python)


@pytest.fixture
def lh_lines(tmp_path, lines_template):
    """A local host whose server runs a Python 3.12+ (the probe in lines mode)."""
    h = LocalHost(tmp_path / "h1", lines_template)
    yield h
    h.stop()


def skipping_warmup(lh, **restart):
    """The host, its server started with --skip-server-warmup: no request runs before the smoke request."""
    start = lh.host().server.restart.start + " --skip-server-warmup"
    return lh.host(start=start, **restart)


def test_a_forward_only_patch_is_verified_by_the_smoke_request_without_a_router(lh):
    """No marker, lines only in forward_batch_generation: nothing runs them at start-up (the
    local host's stand-in has no warmup); the smoke request does."""
    host = skipping_warmup(lh)
    result = steps.deploy(job(lh, "forward-quiet", host=host)[0], host)
    assert result.ok and result.status == Status.VERIFIED, result.message
    assert EAGLE in result.details["execution"]["ran"], result.details["execution"]
    assert result.details["execution"]["proved_by"] == "smoke", result.details["execution"]
    smoke = result.details["smoke"]
    assert smoke["requests"] == 1 and smoke["statuses"] == [200], smoke
    assert smoke["started"] <= smoke["ended"], smoke


def test_a_gated_line_is_verified_with_prove_concurrency(lh_lines):
    """A line that runs only when a scheduler step holds 4 requests or more: 8 smoke requests at once."""
    lh = lh_lines
    assert steps.deploy(job(lh, "batch-gate")[0], lh.host()).ok
    result = steps.deploy(job(lh, "forward-gated-busy")[0], lh.host())
    assert result.ok and result.status == Status.VERIFIED, result.message
    assert result.details["smoke"]["statuses"] == [200] * 8, result.details["smoke"]


def test_a_gated_line_is_not_verified_by_one_smoke_request(lh_lines):
    lh = lh_lines
    assert steps.deploy(job(lh, "batch-gate")[0], lh.host()).ok
    result = steps.deploy(job(lh, "forward-gated")[0], lh.host())
    assert not result.ok and result.status == Status.UNPROVEN, result.message
    assert "forward_batch_generation (eagle_worker.py) ran" in result.message, result.message
    assert result.details["smoke"]["statuses"] == [200], result.details["smoke"]


def test_a_smoke_request_that_fails_is_smoke_failed_with_its_status_and_first_body_line(lh):
    """The server answers /generate 503 with a body: the verdict says so, whatever the markers said."""
    env = dict(lh.host().server.restart.env or {}, FLEETPATCH_STANDIN_GENERATE_STATUS="503")
    host = skipping_warmup(lh, env=env)
    result = steps.deploy(job(lh, "forward-quiet", host=host)[0], host)
    assert not result.ok and result.status == Status.SMOKE_FAILED, result.message
    assert "smoke-failed" in result.message and "HTTP 503" in result.message, result.message
    assert "the stand-in refuses /generate" in result.message, result.message


@pytest.mark.parametrize("body, key, says", [
    ("prove: 3", "prove", "expected a mapping"),
    ("prove: {requests: -1}", "prove.requests", "at least 0"),
    ("prove: {concurrency: 0}", "prove.concurrency", "at least 1"),
    ("prove: {wait: soon}", "prove.wait", "a number of seconds"),
    ("prove: {max_new_tokens: 2.5}", "prove.max_new_tokens", "a whole number"),
    ("prove: {request: 2}", "prove.request", "unknown key"),
])
def test_a_bad_prove_block_is_one_line_naming_the_key(tmp_path, body, key, says):
    folder = tmp_path / "forward-quiet"
    shutil.copytree(FIXTURE_PATCHES / "forward-quiet", folder)
    with open(folder / "patch.yaml", "a") as f:
        f.write(body + "\n")
    with pytest.raises(PatchError) as e:
        load_patch("forward-quiet", [tmp_path], sglang.PROFILE)
    text = str(e.value)
    assert "\n" not in text and f"patch.yaml: {key}:" in text and says in text, text


def test_prove_is_read(tmp_path):
    folder = tmp_path / "forward-quiet"
    shutil.copytree(FIXTURE_PATCHES / "forward-quiet", folder)
    with open(folder / "patch.yaml", "a") as f:
        f.write("prove: {requests: 8, concurrency: 4, max_new_tokens: 16, wait: 2.5}\n")
    patch, _ = load_patch("forward-quiet", [tmp_path], sglang.PROFILE)
    assert (patch.prove.requests, patch.prove.concurrency, patch.prove.max_new_tokens, patch.prove.wait) == \
        (8, 4, 16, 2.5)


def test_the_warmup_request_proves_a_forward_line_at_start_up(lh):
    """Without --skip-server-warmup the stand-in sends itself SGLang's warmup request before its
    ready line, and that request runs the worker's forward_batch_generation: the line ran before
    the smoke request began."""
    result = steps.deploy(job(lh, "forward-quiet")[0], lh.host())
    assert result.ok and result.status == Status.VERIFIED, result.message
    assert result.details["execution"]["proved_by"] == "startup", result.details["execution"]
    log = lh.log.read_text()
    ready = log.index("The server is fired up and ready to roll!")
    assert log.rfind('"GET /model_info HTTP/1.1" 200', 0, ready) >= 0, log
    assert log.rfind('"POST /generate HTTP/1.1" 200', 0, ready) >= 0, log


def test_with_skip_server_warmup_no_request_comes_before_ready(lh):
    host = skipping_warmup(lh)
    assert steps.deploy(job(lh, "forward-quiet", host=host)[0], host).ok
    log = lh.log.read_text()
    ready = log.index("The server is fired up and ready to roll!")
    assert "POST /generate" not in log[:ready] and "Prefill batch" not in log[:ready], log
    assert log.find('"POST /generate HTTP/1.1" 200', ready) > ready, log   # the smoke request, after it


def test_prove_requests_0_sends_none(lh, tmp_path):
    folder = tmp_path / "forward-quiet"
    shutil.copytree(FIXTURE_PATCHES / "forward-quiet", folder)
    with open(folder / "patch.yaml", "a") as f:
        f.write("prove: {requests: 0}\n")
    host = lh.host()
    j = job(lh, "forward-quiet", host=host)[0]
    j.patch, _ = load_patch("forward-quiet", [tmp_path], sglang.PROFILE)
    result = steps.deploy(j, host)
    assert result.ok, result.message   # the warmup ran the line
    assert "smoke" not in result.details
    log = lh.log.read_text()
    assert log.count('"POST /generate HTTP/1.1"') == 1, log   # the warmup's only



def behind(lh, router, tmp_path, first: str = "spec-path-beacon"):
    """The local host behind the real router with another stand-in worker (so that it may go
    out), started with --skip-server-warmup, `first` deployed before; its Host and the other worker."""
    import yaml
    from fleetpatch.inventory import parse_inventory
    from fleetpatch.router import Router
    from fleetpatch_demo.routerproc import LocalWorker
    from support.standin_sites import standin_site

    other = LocalWorker(standin_site(tmp_path / "site", "0.5.9"), tmp_path / "other.log").start()
    doc = lh.inventory(start=lh.host().server.restart.start + " --skip-server-warmup")
    me = doc["hosts"][lh.name]
    me["server"]["url"] = f"http://127.0.0.1:{lh.port}"
    me["router"] = {"urls": [router.url]}
    host = parse_inventory(yaml.safe_dump(doc), file=str(lh.root / "hosts.yaml")).hosts[lh.name]
    plain = lh.host()
    assert steps.deploy(job(lh, first, host=plain)[0], plain).ok   # a server up, to put into the router
    Router(router.url).add(other.url, timeout=20)
    Router(router.url).add(host.server.url, timeout=20)
    return host, other


def test_an_unproven_host_is_put_back_into_the_router(lh_lines, router, tmp_path):
    """unproven: healthy and on the right path, so it serves again; still a failure."""
    from fleetpatch.drain import Drainer
    from fleetpatch.router import Router
    host, other = behind(lh_lines, router, tmp_path, first="batch-gate")
    try:
        result = steps.deploy(job(lh_lines, "forward-gated", host=host, drain=Drainer(drain_timeout=10))[0], host)
        assert not result.ok and result.status == Status.UNPROVEN, result.message
        assert result.details["router"]["readded"] is True, result.details["router"]
        assert "put back into the router" in result.message, result.message
        assert any(w.url.rstrip("/") == host.server.url for w in Router(router.url).list_workers())
    finally:
        other.stop()


def test_a_forward_only_patch_is_verified_by_the_smoke_request_behind_a_router(lh, router, tmp_path):
    """Behind the real router: out, drained, restarted, the smoke request sent before the
    verdict (which it proves), and back in; the drain sends no second smoke request."""
    from fleetpatch.drain import Drainer
    from fleetpatch.router import Router
    host, other = behind(lh, router, tmp_path)
    try:
        mark = len(lh.log.read_text())
        result = steps.deploy(job(lh, "forward-quiet", host=host, drain=Drainer(drain_timeout=10))[0], host)
        assert result.ok and result.status == Status.VERIFIED, result.message
        assert EAGLE in result.details["execution"]["ran"], result.details["execution"]
        assert result.details["execution"]["proved_by"] == "smoke", result.details["execution"]
        assert result.details["smoke"]["statuses"] == [200] and result.details["router"]["readded"], result.details
        since = lh.log.read_text()[mark:]
        assert since.count('"POST /generate HTTP/1.1" 200') == 1, since   # the verdict's smoke request only
        assert any(w.url.rstrip("/") == host.server.url for w in Router(router.url).list_workers())
    finally:
        other.stop()


def test_a_server_that_dies_serving_the_smoke_request_is_smoke_failed_not_verified(lh):
    """breaks-generate's markers are logged at start-up (a proof); its forward_batch_generation
    raises, so the scheduler dies at the first request. The verdict waits for the smoke answer."""
    host = skipping_warmup(lh)
    result = steps.deploy(job(lh, "breaks-generate", host=host)[0], host)
    assert not result.ok and result.status == Status.SMOKE_FAILED, result.message
    assert "smoke request to http://127.0.0.1:" in result.message and "no answer" in result.message, result.message


def burst(url: str, n: int = 8) -> list[int]:
    """`n` /generate requests at once: a scheduler step with every one of them in flight."""
    import concurrent.futures
    import urllib.request

    def one(_):
        body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 8}}).encode()
        req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as res:
            return res.status
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_bake_turns_an_unproven_host_verified_once_real_traffic_runs_the_line(lh_lines):
    """deploy-patch --bake: unproven after one smoke request; then a burst of 8 concurrent requests
    (real traffic) runs the gated line, and the bake's next read of the probe says verified, by traffic."""
    from fleetpatch.bake import with_bake
    lh = lh_lines
    assert steps.deploy(job(lh, "batch-gate")[0], lh.host()).ok
    seen = {}

    def deploy_then_traffic(j, host):
        seen["deploy"] = steps.deploy(j, host)
        seen["burst"] = burst(f"http://127.0.0.1:{lh.port}")
        return seen["deploy"]

    j = job(lh, "forward-gated", bake_s=20)[0]
    result = with_bake(deploy_then_traffic, 20)(j, lh.host())
    assert seen["deploy"].status == Status.UNPROVEN, seen["deploy"].message
    assert seen["burst"] == [200] * 8
    assert result.ok and result.status == Status.VERIFIED, result.message
    assert result.details["bake"]["proved"] is True, result.details["bake"]
    assert "proved by traffic" in result.message, result.message


def test_a_rank_above_0_that_ran_the_line_waits_for_rank_0s_smoke_answers_before_its_verdict(lh):
    """A rank above 0 serves no HTTP: the line it runs for rank 0's smoke request is called
    `smoke` by when rank 0's requests began, which comes on rank 0's own stream and may arrive
    after this rank's record of the line. A success there waits for rank 0's answers (which come
    after their start on that stream); a failure does not, nor a rank whose rank 0 ended without them."""
    import dataclasses as dc
    from fleetpatch import evidence
    from fleetpatch.steps.context import new_run
    from fleetpatch.steps.follow import EventLog, Judging, PeerSmoke, Watch
    j, host = job(lh, "forward-quiet")
    rank1 = new_run(j, dc.replace(host, node_group="g", node_rank=1))
    peer = PeerSmoke()

    def judging():
        watch = Watch({}, None, [j.patch], ["forward-quiet@1"], peer_smoke=peer)
        return Judging(rank1, watch, EventLog(rank1.profile.ready_line, None, None))

    verdict = evidence.Verdict(Status.VERIFIED, True, "EAGLEWorker", [], "", [], [], "")
    failed = dc.replace(verdict, status=Status.NOT_EXECUTED)
    assert judging()._smoke_unanswered([verdict], False), "rank 0's requests not begun: it may not say `smoke` yet"
    assert not judging()._smoke_unanswered([failed], False)
    assert not judging()._smoke_unanswered([verdict], True), "at the deadline it decides"
    peer.started(1.0e9)
    assert judging()._smoke_unanswered([verdict], False), "begun, not answered"
    peer.answered()
    assert not judging()._smoke_unanswered([verdict], False)
    ended = PeerSmoke()
    ended.finish()   # rank 0's follow ended without answers: its own failure decides the group
    watch = Watch({}, None, [j.patch], ["forward-quiet@1"], peer_smoke=ended)
    assert not Judging(rank1, watch, EventLog(rank1.profile.ready_line, None, None))._smoke_unanswered([verdict], False)


def test_a_patch_without_markers_is_shown_waiting_for_an_added_line_not_for_markers(lh):
    """The progress line a verification starts with names what proves it: a marker, or for a patch
    with none (the probe proves it), an added line."""
    def shown(patch):
        seen = []
        host = skipping_warmup(lh)
        j = job(lh, patch, host=host, progress=lambda name, phase, detail="": seen.append((phase, detail)))[0]
        assert steps.deploy(j, host).ok
        return [detail for phase, detail in seen if phase == "verify"]
    assert shown("forward-quiet")[0] == "waiting for an added line to run"
    assert shown("spec-path-beacon")[0] == "waiting for markers"
