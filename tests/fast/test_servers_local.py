"""Several servers on one host (`servers:`), on the real agent and stand-ins over the
local transport: the install patched once, each server restarted and judged on its own."""
from __future__ import annotations

import dataclasses
import os
import signal

import pytest
import yaml

from support.localhost import job
from support.ports import free_port
from fleetpatch import steps
from fleetpatch.drain import Drainer
from fleetpatch.errors import Status
from fleetpatch.inventory import parse_inventory


def two_servers(lh, router=None, s1_port=None, **env):
    """lh's host with servers s0 and s1: one install, two stand-ins on their own ports, logs and pidfiles
    (`router`: the URL of a router in front of both)."""
    doc = lh.inventory()
    h = doc["hosts"][lh.name]
    if router:
        h["router"] = {"urls": [router]}
    one = h.pop("server")
    h["servers"] = {}
    for name in ("s0", "s1"):
        port = lh.port if name == "s0" else s1_port or free_port()
        rs = dict(one["restart"], start=one["restart"]["start"].replace(f"--port {lh.port}", f"--port {port}"),
                  pidfile=str(lh.root / "run" / f"{name}.pid"), env=dict(one["restart"]["env"], **env.get(name, {})))
        h["servers"][name] = {"log": str(lh.root / "logs" / f"{name}.log"), "health_url": f"http://127.0.0.1:{port}/health",
                              "ready_timeout": 20, "restart": rs}
        if router:
            h["servers"][name]["url"] = f"http://127.0.0.1:{port}"
    return parse_inventory(yaml.safe_dump(doc), file=str(lh.root / "hosts.yaml")).hosts[lh.name]


def pid_of(lh, name):
    try:
        return int((lh.root / "run" / f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError):
        return None


def stop_all(lh):
    for name in ("s0", "s1"):
        pid = pid_of(lh, name)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_two_servers_are_patched_once_and_each_restarted_and_verified(lh):
    host = two_servers(lh)
    try:
        r = steps.deploy(job(lh, host=host)[0], host)
        assert r.ok and r.status == Status.VERIFIED, r.message
        assert set(r.details["servers"]) == {"s0", "s1"}
        for name in ("s0", "s1"):
            s = r.details["servers"][name]
            assert s["status"] == "verified" and s["executed_path"] == "EAGLEWorker", s
            assert 0 < s["duration_s"] < r.duration_s, s   # its own part of the host's time
            log = (lh.root / "logs" / f"{name}.log").read_text()
            assert "fleetpatch spec-path-beacon: EAGLEWorker" in log, name
        assert not lh.is_pristine()
        ledger = lh.ledger()
        assert set(ledger["servers"]) == {"s0", "s1"} and not ledger["restart_pending"]
        assert ledger["servers"]["s0"]["last_restart"]["pid"] != ledger["servers"]["s1"]["last_restart"]["pid"]

        seen = steps.verify_logs(job(lh, host=host)[0], host)
        assert seen.ok and {s["status"] for s in seen.details["servers"].values()} == {"verified"}, seen.message
        st = steps.status(job(lh, host=host, patch=None)[0], host)
        assert st.ok and st.details["server_up"], st.message
        assert {n: s["last_verification"]["status"] for n, s in st.details["servers"].items()} == \
            {"s0": "verified", "s1": "verified"}
        assert st.details["servers"]["s0"]["server_pid"] == pid_of(lh, "s0") != pid_of(lh, "s1")

        again = steps.deploy(job(lh, host=host)[0], host)
        assert again.ok and again.status == Status.ALREADY_APPLIED, again.message
        assert {s["status"] for s in again.details["servers"].values()} == {"already-applied"}

        rb = steps.rollback(job(lh, host=host)[0], host)
        assert rb.ok and rb.status == Status.ROLLED_BACK, rb.message
        assert lh.is_pristine()
        assert set(rb.details["servers"]) == {"s0", "s1"}
    finally:
        stop_all(lh)


def test_one_server_that_fails_to_start_fails_the_host_naming_it_and_the_other_is_verified(lh):
    host = two_servers(lh, s1={"FLEETPATCH_STANDIN_CRASH_AFTER_INIT": "1"})
    try:
        r = steps.deploy(job(lh, host=host, timeout=15)[0], host)
        assert not r.ok, r.message
        assert r.details["servers"]["s0"]["status"] == "verified", r.details["servers"]["s0"]
        assert r.details["servers"]["s1"]["ok"] is False
        assert "1 of 2 servers failed: s1" in r.message, r.message
        assert pid_of(lh, "s0") and os.path.exists(f"/proc/{pid_of(lh, 's0')}")
        st = steps.status(job(lh, host=host, patch=None)[0], host)
        assert not st.ok and "server s1: the last verification" in st.message, st.message
        assert st.details["servers"]["s0"]["server_up"] and not st.details["servers"]["s1"]["server_up"]
    finally:
        stop_all(lh)


def test_a_second_server_whose_inventory_would_not_start_it_refuses_the_deploy_and_the_rollback_untouched(lh):
    """Only the first server's launch is read from /proc, but each server is restarted with its own
    start and env: hosts.yaml now gives s1 spec v2 with topk 4, which does not start. The deploy is
    refused by the pre-flight, naming s1, and so is a rollback: nothing written or restored, neither
    server restarted."""
    host = two_servers(lh)
    try:
        assert steps.deploy(job(lh, host=host)[0], host).ok
        assert steps.rollback(job(lh, None, host=host)[0], host).ok   # both run, unpatched
        pids = (pid_of(lh, "s0"), pid_of(lh, "s1"))
        broken = two_servers(lh, s1={"SGLANG_ENABLE_SPEC_V2": "True"})
        for r in (steps.check_patch(job(lh, host=broken)[0], broken), steps.deploy(job(lh, host=broken)[0], broken)):
            assert r.status == "not-executed", r.message
            assert "the server would not start: Spec v2 currently only supports topk = 1" in r.message, r.message
            assert "(server s1: launch configuration from the inventory's start and env" in r.message, r.message
            assert r.message.count("would not start") == 1, r.message   # the cause does not say it again
        assert lh.is_pristine() and (pid_of(lh, "s0"), pid_of(lh, "s1")) == pids
        # a rollback would restart s1 with it too: refused, the patch left in place
        assert steps.deploy(job(lh, host=host)[0], host).ok
        pids = (pid_of(lh, "s0"), pid_of(lh, "s1"))
        r = steps.rollback(job(lh, None, host=broken)[0], broken)
        assert r.status == "error" and "rollback refused: server s1: the inventory's start and env would not start" \
            in r.message, r.message
        assert not lh.is_pristine() and (pid_of(lh, "s0"), pid_of(lh, "s1")) == pids
        # status names the server a restart would not bring back, and only that one
        st = steps.status(job(lh, host=broken, patch=None)[0], broken)
        (note,) = st.details["notes"]
        assert st.ok and note.startswith("server s1: a restart would not start the server, which now runs "
                                         "EAGLEWorker: with the inventory's start and env"), (st.message, note)
        assert "it would stop with \"Spec v2 currently only supports topk = 1" in note, note
    finally:
        stop_all(lh)


def test_without_markers_each_server_is_proven_by_its_own_probe_records_and_verify_logs_rereads_them(lh):
    """both-quiet has no marker: each server's verdict is its own processes' probe records,
    kept per server, so verify-logs of the first server still finds its own after the second's restart."""
    host = two_servers(lh)
    try:
        r = steps.deploy(job(lh, "both-quiet", host=host)[0], host)
        assert r.ok and r.status == Status.VERIFIED, r.message
        for name in ("s0", "s1"):
            block = r.details["servers"][name]["execution"]
            assert block["ran"] and pid_of(lh, name) in block["pids"], (name, block)
            assert not set(block["pids"]) & {pid_of(lh, other) for other in ("s0", "s1") if other != name}
        assert (lh.state / "probe-s0").is_dir() and (lh.state / "probe-s1").is_dir()
        seen = steps.verify_logs(job(lh, "both-quiet", host=host)[0], host)
        assert seen.ok and {s["status"] for s in seen.details["servers"].values()} == {"verified"}, seen.message
    finally:
        stop_all(lh)


def test_on_failure_rollback_restores_the_install_and_restarts_each_server_that_ran_the_patch(lh):
    """v2-only-beacon proves the v2 path only: s0 runs it (verified), s1 runs the v1 path (not-executed).
    The install goes back to its originals, and s0 and s1 are restarted without the patch."""
    lh.spec_v2 = True
    host = two_servers(lh)
    doc_s1 = host.servers[1][1].restart
    v1_start = doc_s1.start.replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 4").replace(
        "--speculative-num-draft-tokens 4", "--speculative-num-draft-tokens 8")
    s1 = dataclasses.replace(host.servers[1][1], restart=dataclasses.replace(doc_s1, start=v1_start, env={
        k: v for k, v in doc_s1.env.items() if k != "SGLANG_ENABLE_SPEC_V2"}))
    host = dataclasses.replace(host, servers=(host.servers[0], ("s1", s1)))
    try:
        r = steps.deploy(job(lh, "v2-only-beacon", host=host, timeout=15, on_failure="rollback")[0], host)
        assert not r.ok and r.status == Status.ROLLED_BACK, r.message
        assert r.details["servers"]["s0"]["status"] == "verified"
        assert r.details["servers"]["s1"]["status"] == "not-executed"
        assert r.details["rollback"]["ok"], r.details["rollback"]
        assert lh.is_pristine(), "the install's originals are back"
        for name in ("s0", "s1"):
            log = (lh.root / "logs" / f"{name}.log").read_text()
            assert log.count("server_args=") == 2, f"{name} was restarted again, without the patch"
        before, after = (lh.root / "logs" / "s0.log").read_text().rsplit("server_args=", 1)
        assert "fleetpatch fixture v2-only-beacon" in before and "fleetpatch fixture v2-only-beacon" not in after
        assert not lh.ledger().get("restart_pending"), lh.ledger()
    finally:
        stop_all(lh)


def test_a_redeploy_after_a_copytruncate_rotation_is_already_applied_on_each_server_as_on_a_one_server_host(lh):
    """The log window of each server's last restart is gone (copytruncate), the processes fleetpatch
    verified still run: already-applied, as a one-server host says, not a wait for lines that are gone."""
    host = two_servers(lh)
    try:
        assert steps.deploy(job(lh, host=host)[0], host).ok
        pids = {name: pid_of(lh, name) for name in ("s0", "s1")}
        for name in ("s0", "s1"):
            os.truncate(lh.root / "logs" / f"{name}.log", 0)
        again = steps.deploy(job(lh, host=host, timeout=5)[0], host)
        assert again.ok and again.status == Status.ALREADY_APPLIED, again.message
        for name in ("s0", "s1"):
            s = again.details["servers"][name]
            assert s["status"] == "already-applied" and "no longer there to re-read" in s["message"], s
        assert {name: pid_of(lh, name) for name in ("s0", "s1")} == pids, "nothing was restarted"
    finally:
        stop_all(lh)


def test_on_failure_rollback_of_a_redeploy_that_restarted_nothing_restarts_every_server_that_runs_the_patch(lh):
    """s0's window, judged again on a redeploy (nothing to write), holds a forbidden line: the host
    fails and is rolled back. Both servers ran the patch since the first deploy: both are restarted
    without it, and nothing is left pending."""
    host = two_servers(lh)
    try:
        assert steps.deploy(job(lh, host=host)[0], host).ok
        with open(lh.root / "logs" / "s0.log", "a") as log:
            log.write("Traceback (most recent call last)\n")
        r = steps.deploy(job(lh, host=host, timeout=5, on_failure="rollback")[0], host)
        assert not r.ok and r.status == Status.ROLLED_BACK, r.message
        assert r.details["rollback"]["ok"], r.details["rollback"]
        assert set(r.details["rollback"]["message"].split("\n", 1)[0].split()) >= {"2", "servers"}, r.details
        assert lh.is_pristine(), "the install's originals are back"
        for name in ("s0", "s1"):
            after = (lh.root / "logs" / f"{name}.log").read_text().rsplit("server_args=", 1)[1]
            assert "fleetpatch spec-path-beacon" not in after, f"{name} was restarted without the patch"
        ledger = lh.ledger()
        assert not ledger["patches"] and not ledger["restart_pending"], ledger
        assert not any(s["restart_pending"] for s in ledger["servers"].values()), ledger["servers"]
    finally:
        stop_all(lh)



def up_pristine_behind(lh, router):
    """Both servers up on the pristine install, the router listing s0 only: taking s0 out would
    leave the router no healthy worker, so its take-out is refused; s1, not listed, is not."""
    from fleetpatch.router import Router
    port = free_port()
    host, plain = two_servers(lh, router=router.url, s1_port=port), two_servers(lh, s1_port=port)
    assert steps.deploy(job(lh, host=plain)[0], plain).ok and steps.rollback(job(lh, host=plain)[0], plain).ok
    assert lh.is_pristine()
    Router(router.url).add(host.servers[0][1].url, timeout=20)
    return host


@pytest.mark.parametrize("on_failure", ["keep", "rollback"])
def test_a_router_refusal_after_the_install_was_written_says_so_and_the_other_server_is_still_handled(
        lh, router, on_failure):
    host = up_pristine_behind(lh, router)
    try:
        before = pid_of(lh, "s0")
        r = steps.deploy(job(lh, host=host, on_failure=on_failure, drain=Drainer(drain_timeout=10))[0], host)
        s0 = r.details["servers"]["s0"]
        assert not r.ok and "refused, not touched" not in r.message and "not touched" not in s0["message"], r.message
        assert s0["status"] == "router-error" and not s0["ok"], s0
        assert "server s0 not restarted: its router step failed" in s0["message"], s0["message"]
        assert "no healthy worker" in s0["message"], s0["message"]
        assert pid_of(lh, "s0") == before, "s0 was never restarted"
        if on_failure == "keep":
            assert r.status == Status.ROUTER_ERROR, r.message
            assert "the install is written (spec-path-beacon@1), but s0 was not restarted onto it" in s0["message"]
            assert r.details["servers"]["s1"]["status"] == "verified", r.details["servers"]["s1"]["message"]
            assert not lh.is_pristine()
            assert lh.ledger()["servers"]["s0"]["restart_pending"] and not lh.ledger()["servers"]["s1"]["restart_pending"]
            router.stop()   # a rollback whose router is gone: restored, and neither server restarted, said so
            rb = steps.rollback(job(lh, host=host, drain=Drainer(drain_timeout=10))[0], host)
            assert not rb.ok and rb.status == Status.ROUTER_ERROR and "not touched" not in rb.message, rb.message
            assert lh.is_pristine()
            for name in ("s0", "s1"):
                assert f"the install is restored from spec-path-beacon@1, but {name} was not restarted" in \
                    rb.details["servers"][name]["message"], rb.details["servers"][name]
        else:   # s0 failed first: the install is restored; s1 had not run the patch, nothing to restart
            assert r.status == Status.ROLLED_BACK and r.details["rollback"]["ok"], r.message
            assert "s1" not in r.details["servers"], r.details["servers"]
            assert lh.is_pristine() and not lh.ledger()["patches"]
    finally:
        stop_all(lh)
