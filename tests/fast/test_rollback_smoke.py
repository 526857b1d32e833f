"""After a rollback's restart the server gets the deploy's smoke requests before its check
(issue 31): a rolled-back server must still answer requests, and one that does not is
`smoke-failed`, as after a deploy. The check judges the probe's import records: the
restored files are what the server imported, and no line of the patch ran."""
from __future__ import annotations

from fleetpatch import steps
from fleetpatch.errors import Status
from support.localhost import job

WORKER = "sglang.srt.speculative.eagle_worker"


def skipping_warmup(lh, **restart):
    """The host, its server started with --skip-server-warmup: only the smoke request serves a request."""
    return lh.host(start=lh.host().server.restart.start + " --skip-server-warmup", **restart)


def test_a_rollback_sends_the_smoke_request_and_says_it_was_answered(lh):
    host = skipping_warmup(lh)
    assert steps.deploy(job(lh, "forward-quiet", host=host)[0], host).ok
    rb = steps.rollback(job(lh, "forward-quiet", host=host)[0], host)
    assert rb.ok and rb.status == Status.ROLLED_BACK, rb.message
    assert lh.is_pristine()
    smoke = rb.details["smoke"]
    assert smoke["requests"] == 1 and smoke["statuses"] == [200], smoke
    assert smoke["started"] <= smoke["ended"], smoke
    assert "the restarted server answered its smoke request (HTTP 200)" in rb.message, rb.message
    # the log the rolled-back server wrote since its restart: ready, then the smoke request served
    log = lh.log.read_text()
    restart = log.rindex("server_args=ServerArgs(")
    assert log.index('"POST /generate HTTP/1.1" 200', restart) > log.index("fired up and ready to roll", restart), log
    # the probe's import records: the restored worker was imported, and nothing of the patch ran
    execution = rb.details["execution"]
    assert WORKER in execution["imported"], execution
    assert execution["ran"] == {}, execution


def test_a_rollback_whose_server_refuses_requests_is_smoke_failed(lh):
    host = skipping_warmup(lh)
    assert steps.deploy(job(lh, "forward-quiet", host=host)[0], host).ok
    refusing = skipping_warmup(lh, env=dict(host.server.restart.env or {}, FLEETPATCH_STANDIN_GENERATE_STATUS="503"))
    rb = steps.rollback(job(lh, "forward-quiet", host=refusing)[0], refusing)
    assert not rb.ok and rb.status == Status.SMOKE_FAILED, rb.message
    assert "smoke-failed" in rb.message and "HTTP 503" in rb.message, rb.message
    assert "the stand-in refuses /generate" in rb.message, rb.message
    assert lh.is_pristine(), "the files are restored all the same"

