"""An agent that stops answering (SIGSTOP) is waited out, then named a timeout with its
cause (issue 23, 6a): a fault that takes seconds by nature, so it is in this tier."""
from __future__ import annotations

import os
import signal

import pytest

from support.localhost import job
from fleetpatch import remote, steps
from fleetpatch.errors import HostFailure, NoAnswer, Status
from fleetpatch.transport_local import LocalTransport


def test_an_agent_that_does_not_answer_in_time_is_a_timeout_with_that_cause(lh):
    host = lh.host()
    j, _ = job(lh, None)
    with remote.Remote(host, transport=LocalTransport(host.name)) as r:
        r.call("probe", steps.base_request(host, j))
        proc = r._chan.proc
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(HostFailure) as e:
                r.call("probe", steps.base_request(host, j), timeout=1)
        finally:
            if proc.poll() is None:   # the Remote's close kills a stopped agent after its wait
                proc.kill()
    assert e.value.status == Status.TIMEOUT and e.value.cause == NoAnswer.TIMEOUT, e.value.message


def test_a_stall_during_verification_says_what_the_ledger_knows(lh):
    """The agent stops (SIGSTOP) once the new server is up: the result says the connection was
    lost during the verification, names the patch and version, and where the truth is."""
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "1"})
    j, _ = job(lh, host=host, timeout=1)
    stopped = []

    def progress(name, phase, detail=""):
        if phase == "verify" and not stopped:
            for pid in agent_pids(lh):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    j.progress = progress
    try:
        r = steps.deploy(j, host)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass   # the run's close already ended it
    assert stopped
    assert r.status == "timeout", r.message
    assert "connection was lost during the verification of spec-path-beacon@1" in r.message, r.message
    assert "its ledger says what was done" in r.message
    assert r.engine_version == "0.5.9" and r.patch == "spec-path-beacon@1"


def agent_pids(lh) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if cmd.startswith(str(lh.python).encode()) and b"-c" in cmd and b"sglang_standin" not in cmd:
                out.append(int(d))
    return out
