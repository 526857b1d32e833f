"""Issue 23's items on the per-host steps: a typed cause for an answer that never
came (6a), status failing a host whose last verification failed (7a), fetch naming
the patches the host's files carry (7g), on the real agent and stand-in server on the local transport (-v, 7h, is in
tests/fleet/test_verbose_evidence.py; an agent that stalls is waited
out in tests/fleet/test_stalled_agent.py)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from support.localhost import job
from fleetpatch import remote, steps
from fleetpatch.errors import HostFailure, NoAnswer, Status
from fleetpatch.transport_local import LocalTransport


# ----------------------------------------------------------------- 6a

def test_an_agent_that_dies_before_answering_is_a_failure_with_that_cause(lh):
    host = lh.host()
    j, _ = job(lh, None)
    with remote.Remote(host, transport=LocalTransport(host.name)) as r:
        r.call("probe", steps.base_request(host, j))
        os.killpg(r._chan.proc.pid, signal.SIGKILL)
        r._chan.proc.wait()
        with pytest.raises(HostFailure) as e:
            r.call("probe", steps.base_request(host, j))
    assert e.value.cause == NoAnswer.AGENT_EXITED, e.value.message
    assert steps.no_answer(e.value)


def test_the_words_of_a_message_never_make_an_answer_a_lost_connection():
    """The host answered, and its message happens to quote such words: not a lost connection."""
    answered = HostFailure(Status.ERROR, "h1: the host agent said: upstream connection dropped without an answer")
    assert not steps.no_answer(answered)
    lost = HostFailure(Status.ERROR, "h1: something else entirely", NoAnswer.SEND_FAILED)
    assert steps.no_answer(lost)


# ----------------------------------------------------------------- 7a

def test_status_fails_a_host_whose_last_verification_failed(lh):
    j, host = job(lh, "v2-only-beacon", force=True)
    assert steps.deploy(j, host).status == "not-executed"
    r = steps.status(job(lh, None)[0], host)
    assert not r.ok, r.message
    assert r.status == "not-executed"
    assert "last verification" in r.message and "v2-only-beacon@1" in r.message and "not-executed" in r.message


def test_status_is_ok_once_the_failed_patch_is_rolled_back(lh):
    j, host = job(lh, "v2-only-beacon", force=True)
    assert steps.deploy(j, host).status == "not-executed"
    assert steps.rollback(job(lh, None)[0], host).ok
    r = steps.status(job(lh, None)[0], host)
    assert r.ok and r.status == "ok", r.message


# ----------------------------------------------------------------- 7g

def test_fetch_names_the_patches_the_hosts_files_already_carry(lh, tmp_path):
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    fj, _ = job(lh, None, dest=tmp_path / "src")
    r = steps.fetch(fj, host)
    assert r.ok, r.message
    meta = json.loads((tmp_path / "src" / host.name / "fetch.json").read_text())
    assert meta["patches"] == ["spec-path-beacon@1"]
    assert "already carry spec-path-beacon@1" in r.message


def test_fetch_of_a_pristine_host_names_no_patch(lh, tmp_path):
    fj, host = job(lh, None, dest=tmp_path / "src")
    r = steps.fetch(fj, host)
    meta = json.loads((tmp_path / "src" / host.name / "fetch.json").read_text())
    assert meta["patches"] == [] and "carry" not in r.message
