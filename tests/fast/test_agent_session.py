"""One agent process per host per command, its compile cache, and what a channel
that ends mid-operation leaves behind.

The host is a real tree (the real SGLang files, the stand-in server) and the
agent runs under the host's own interpreter through the same bootstrap as over
SSH; the sshd-side count of remote commands is in test_pipeline/test_rollout."""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import marshal
import os
import sys
import time
import zlib

import pytest

from support.agent_session import Agent, requests
from support.localhost import EAGLE, EAGLE_V2, job, sha256
from fleetpatch import protocol, remote, steps
from fleetpatch.errors import HostFailure
from fleetpatch.remote import Remote
from fleetpatch.transport_local import LocalTransport


class CountingTransport(LocalTransport):
    """The real local transport, counting the agent processes it starts."""

    def __init__(self, name, starts):
        super().__init__(name)
        self.starts = starts

    def start(self, argv):
        self.starts.append(argv)
        return super().start(argv)


def counting_job(lh, starts, **kw):
    j, host = job(lh, **kw)
    j.transport = lambda h: CountingTransport(h.name, starts)
    return j, host


# ------------------------------------------------------ one process a host

def test_a_deploy_sends_its_three_requests_to_one_agent_process(lh):
    starts = []
    j, host = counting_job(lh, starts)
    r = steps.deploy(j, host)
    assert r.status == "verified", r.message
    assert r.round_trips == 3, "probe+lock, apply+restart, follow+record+unlock: still counted as requests"
    assert len(starts) == 1, starts
    assert starts[0][1:] == ["-S", "-c", remote.BOOTSTRAP]
    assert not lh.lock.exists()


def test_a_follow_sent_ahead_of_a_request_that_restarted_nothing_is_skipped_and_the_channel_stays_in_step(lh):
    j, host = job(lh)
    base = steps.base_request(host, j)
    with Remote(host, transport=LocalTransport(host.name)) as r:
        follow = steps.follow_ahead(j, host)
        assert r.call("unlock", base, ahead=follow) == {"unlocked": True}
        with pytest.raises(HostFailure) as e:   # taken up: it ran on no restart
            r.stream("follow", {k: v for k, v in follow.items() if k != "op"}, lambda ev: None, 5.0)
        assert e.value.status == "skipped" and "started no server" in e.value.message
        r.call("unlock", base, ahead=steps.follow_ahead(j, host))
        assert r.call("unlock", base) == {"unlocked": True}, "not taken up: settled before the next request"
        assert r.round_trips == 5 and r.agent_starts == 1


def test_a_failed_deploy_rolled_back_runs_in_the_same_agent_process(lh):
    starts = []
    j, host = counting_job(lh, starts, patch="crash-in-init", on_failure="rollback")
    r = steps.deploy(j, host)
    assert r.status == "rolled-back", r.message
    assert r.round_trips == 6 and len(starts) == 1
    assert lh.is_pristine() and not lh.lock.exists()


def test_a_rollback_is_one_agent_process(lh):
    assert steps.deploy(job(lh)[0], lh.host()).status == "verified"
    starts = []
    j, host = counting_job(lh, starts, patch=None)
    r = steps.rollback(j, host)
    assert r.status == "rolled-back", r.message
    assert len(starts) == 1 and lh.is_pristine()


# ------------------------------------------------------------ compile cache

def probe_agent(lh) -> dict:
    with Remote(lh.host(), transport=LocalTransport("h1")) as r:
        return r.call("probe", {"state_dir": str(lh.state), "package": "sglang", "files": [], "content": False})


def cache_entries(lh) -> list:
    d = lh.state / "agent-cache"
    return sorted(d.iterdir()) if d.exists() else []


def agent_entry(lh):
    """The cache entry of the agent's entry module (session: its serve() is the request loop)."""
    sha = hashlib.sha256(zlib.decompress(remote.AGENT_SOURCE)).hexdigest()
    found = [p for p in cache_entries(lh) if f"\nsource {sha}\n".encode() in p.read_bytes()[:300]]
    assert len(found) == 1, found
    return found[0]


def sent_names() -> list:
    return [module for _, module, _ in remote.sent_modules()]


def test_the_agent_is_compiled_once_then_loaded_from_the_cache(lh):
    first = probe_agent(lh)
    assert first["agent"] == dict.fromkeys(sent_names(), "compiled")
    assert protocol.AGENT_MODULE_NAME in first["agent"] and remote.AGENT_MODULE in first["agent"]
    assert len(cache_entries(lh)) == len(sent_names())
    assert not [p for p in (lh.state / "agent-cache").iterdir() if p.name.endswith(".tmp")], "written by rename"
    again = probe_agent(lh)
    assert again["agent"] == dict.fromkeys(sent_names(), "cached")
    assert again["version"] == first["version"] == "0.5.9"


def plant(entry, code, source_sha=None):
    """Rewrite a cache entry around `code`, sealed with the laptop's key for `source_sha`
    (default: its own). test_agent_trust: what is not sealed so never runs."""
    data = entry.read_bytes()
    head = data.split(b"\n\n", 1)[0].decode().splitlines()
    fields = dict(line.split(" ", 1) for line in head[1:])
    body = marshal.dumps(code)
    if source_sha:
        fields["source"] = source_sha
    msg = f"{fields['source']}\0{fields['python']}\0".encode() + body
    fields["seal"] = hmac.new(bytes.fromhex(remote.cache_key()), msg, hashlib.sha256).hexdigest()
    entry.write_bytes((head[0] + "\n" + "".join(f"{k} {v}\n" for k, v in fields.items()) + "\n").encode() + body)


def doctored_agent():
    source = zlib.decompress(remote.AGENT_SOURCE).decode()
    marked = source.replace('result["agent"] = dict(state.boot)', 'result["agent"] = dict(state.boot, doctored=True)')
    assert marked != source
    return compile(marked, "fleetpatch-agent/session.py", "exec")


def test_a_cache_entry_is_run_only_when_it_proves_it_is_the_sent_source(lh):
    probe_agent(lh)
    entry = agent_entry(lh)
    # An entry sealed for this source is what runs (the cache is really used) ...
    plant(entry, doctored_agent())
    assert probe_agent(lh)["agent"].get("doctored") is True
    # ... one sealed for another source never runs: the sent source is compiled and the entry rewritten.
    plant(entry, doctored_agent(), source_sha="0" * 64)
    reply = probe_agent(lh)
    assert "doctored" not in reply["agent"] and reply["agent"][remote.AGENT_MODULE] == "compiled"
    assert probe_agent(lh)["agent"][remote.AGENT_MODULE] == "cached"


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "garbage", "empty"])
def test_a_corrupt_cache_falls_back_to_the_sent_source_and_is_rewritten(lh, damage):
    probe_agent(lh)
    entry = agent_entry(lh)
    data = entry.read_bytes()
    entry.write_bytes({"flip a byte": data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:],
                       "truncate": data[: len(data) // 2], "garbage": os.urandom(len(data)), "empty": b""}[damage])
    reply = probe_agent(lh)
    assert reply["agent"][remote.AGENT_MODULE] == "compiled" and reply["version"] == "0.5.9"
    assert entry.read_bytes() == data, "the entry is rewritten whole"
    assert probe_agent(lh)["agent"][remote.AGENT_MODULE] == "cached"


def test_an_unwritable_cache_costs_only_the_compile(lh):
    lh.state.mkdir(parents=True, exist_ok=True)
    (lh.state / "agent-cache").write_text("a file where the cache directory would be")
    for _ in range(2):
        assert probe_agent(lh)["agent"][remote.AGENT_MODULE] == "compiled"
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "verified", r.message


def test_the_boot_stage_is_python_3_8_stdlib_only():
    source = zlib.decompress(remote.BOOT_SOURCE).decode()
    tree = ast.parse(source, feature_version=(3, 8))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    assert names <= set(sys.stdlib_module_names), names
    ast.parse(remote.BOOTSTRAP, feature_version=(3, 8))
    assert "'" not in remote.BOOTSTRAP, "shlex.quote keeps it one single-quoted word"


# -------------------------------------------- a channel that ends mid-way

def lost_note(lh):
    path = lh.state / "lock-lost"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_channel_that_ends_before_anything_changed_releases_the_lock(lh):
    base, probe, apply, follow = requests(lh)
    a = Agent(lh)
    a.request(probe)
    assert a.result()["locked"] and lh.lock.exists()
    assert a.vanish() == 0
    assert not lh.lock.exists() and lost_note(lh) is None, "nothing changed: the next run starts clean"
    assert lh.is_pristine()


def test_a_channel_that_ends_during_the_apply_finishes_it_and_keeps_the_lock_with_the_story(lh):
    base, probe, apply, follow = requests(lh)
    pid = lh.server_pid()
    a = Agent(lh)
    a.request(probe)
    reply = a.result()
    a.request(apply(reply))
    assert a.vanish() == 0  # the laptop is gone the moment the apply left it
    # the step in progress was finished, whole: every file patched, the ledger says so, the server restarted
    assert all(sha256(lh.file(rel)) != lh.pristine[rel] for rel in (EAGLE, EAGLE_V2))
    ledger = lh.ledger()
    assert ledger["patches"]["spec-path-beacon"]["files"][EAGLE]["after"] == sha256(lh.file(EAGLE))
    assert ledger["restart_pending"] is False and lh.server_pid() not in (None, pid)
    assert lh.lock.exists()
    note = lost_note(lh)
    assert note["token"] == base["lock_token"] and note["after"] == ["apply"]
    # the next run is told what happened, and what to do
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "locked"
    assert "channel ended" in r.message and "ran apply" in r.message and "--break-lock" in r.message
    assert "test laptop pid 1" in r.message
    assert lh.lock.exists()
    again = steps.deploy(job(lh, break_lock=True)[0], lh.host())
    assert again.status == "already-applied", again.message
    assert not lh.lock.exists() and lost_note(lh) is None


def test_a_channel_that_ends_during_the_follow_stops_it_and_keeps_the_lock(lh):
    base, probe, apply, follow = requests(lh)
    a = Agent(lh)
    a.request(probe)
    a.request(apply(a.result()))
    a.request(follow(a.result()))
    assert a.reply()["t"] in protocol.FOLLOW_EVENTS
    t0 = time.monotonic()
    assert a.vanish() == 0
    assert time.monotonic() - t0 < 5, "a follow nobody reads ends at once, not at its deadline"
    assert lost_note(lh)["after"] == ["apply"] and lh.lock.exists()
    assert lh.ledger()["patches"]["spec-path-beacon"]["verification"] is None, "no verdict was recorded"


def test_bye_ends_the_session_and_a_lock_still_held_is_judged_the_same_way(lh):
    base, probe, apply, follow = requests(lh)
    a = Agent(lh)
    a.request(probe)
    a.result()
    a.request({"op": "bye"})
    assert a.proc.wait(timeout=30) == 0
    assert not lh.lock.exists()


def test_requests_after_an_error_still_get_answers_in_order(lh):
    base, probe, apply, follow = requests(lh)
    a = Agent(lh)
    a.send(b"not json\n")
    bad = a.reply()
    assert bad["t"] == "result" and not bad["ok"] and "not a JSON request line" in bad["message"]
    a.request(dict(base, op="no-such-op"))
    bad = a.reply()
    assert not bad["ok"] and "unknown agent operation 'no-such-op'" in bad["message"]
    a.send(b"[]\n")  # a follow's decision that came too late: no reply, so the next answer is the probe's
    a.request(probe)
    assert a.result()["locked"]
    a.request(dict(base, op="unlock"))
    assert a.result() == {"unlocked": True}
    assert a.vanish() == 0 and not lh.lock.exists()


def test_the_sources_travel_once_per_host(lh, monkeypatch):
    chunks = []
    orig = Remote._send
    monkeypatch.setattr(Remote, "_send", lambda self, data, *op: (chunks.append(data), orig(self, data, *op))[1])
    j, host = job(lh)
    r = steps.deploy(j, host)
    assert r.status == "verified" and r.round_trips == 3
    assert sum(remote.SOURCES_BLOB in c for c in chunks) == 1
    assert len(chunks) == 2 + 1, "the boot stream with the probe, the apply with its follow, the follow's decision"
    ops = [[json.loads(line)["op"] for line in c.split(b"\n") if line.startswith(b"{")] for c in chunks[1:2]]
    assert ops == [["apply", "follow"]], "the agent follows the restart without waiting for the laptop to ask"
    assert chunks[0].startswith(remote.boot_stream(host.engine.state_dir))
