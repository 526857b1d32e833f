"""The agent runs as root: nothing another user can write on the host gets code run,
or root's writes led elsewhere (issue 33, "Trust").

- the compile cache: an entry runs only when sealed with the laptop's key, and only
  from a cache directory and entry nobody but root can write;
- the state dir is tightened when it exists open to others;
- temp files are created, never opened through a link planted at their name;
- the server's log is opened without following a symlink at its name.

Hosts on the local transport (`lh`); a fault that needs another user's file is needs_root."""
from __future__ import annotations

import hashlib
import hmac
import marshal
import os
import stat
import zlib

import pytest

from support.agent_session import Agent
from support.localhost import job
from support.marks import needs_root
from fleetpatch import remote, steps
from fleetpatch.probe import install as probe_install
from fleetpatch.remote import Remote
from fleetpatch.transport_local import LocalTransport

NOBODY = 65534


def probe_agent(lh) -> dict:
    with Remote(lh.host(), transport=LocalTransport("h1")) as r:
        return r.call("probe", {"state_dir": str(lh.state), "package": "sglang", "files": [], "content": False})


def cache_dir(lh):
    return lh.state / "agent-cache"


def agent_entry(lh):
    """The cache entry of the agent's entry module (session: its serve() is the request loop)."""
    sha = hashlib.sha256(zlib.decompress(remote.AGENT_SOURCE)).hexdigest()
    found = [p for p in cache_dir(lh).iterdir() if f"\nsource {sha}\n".encode() in p.read_bytes()[:300]]
    assert len(found) == 1, found
    return found[0]


def doctored_agent():
    source = zlib.decompress(remote.AGENT_SOURCE).decode()
    marked = source.replace('result["agent"] = dict(state.boot)', 'result["agent"] = dict(state.boot, doctored=True)')
    assert marked != source
    return compile(marked, "fleetpatch-agent/session.py", "exec")


def plant(entry, code, key: bytes | None = None):
    """Rewrite a cache entry around `code`: its header declares this source, this interpreter
    and the sha256 of the new body (all it needs to run on 5bb0bff); sealed with `key` if given."""
    head = entry.read_bytes().split(b"\n\n", 1)[0].decode().splitlines()
    fields = dict(line.split(" ", 1) for line in head[1:])
    body = marshal.dumps(code)
    fields["code"] = hashlib.sha256(body).hexdigest()
    if key is not None:
        msg = f"{fields['source']}\0{fields['python']}\0".encode() + body
        fields["seal"] = hmac.new(key, msg, hashlib.sha256).hexdigest()
    else:
        fields.pop("seal", None)
    entry.write_bytes((head[0] + "\n" + "".join(f"{k} {v}\n" for k, v in fields.items()) + "\n").encode() + body)


def laptop_key() -> bytes:
    return bytes.fromhex(remote.cache_key())


# ------------------------------------------------------------ the compile cache

def test_a_cache_entry_planted_with_its_own_matching_hashes_is_not_run(lh):
    probe_agent(lh)
    entry = agent_entry(lh)
    plant(entry, doctored_agent())   # what the entry declares of itself all checks out
    reply = probe_agent(lh)
    assert "doctored" not in reply["agent"] and reply["agent"][remote.AGENT_MODULE] == "compiled"
    assert b"doctored" not in entry.read_bytes(), "rewritten from the sent source"
    assert probe_agent(lh)["agent"][remote.AGENT_MODULE] == "cached"


def test_only_an_entry_sealed_with_the_laptops_key_runs(lh):
    probe_agent(lh)
    entry = agent_entry(lh)
    plant(entry, doctored_agent(), key=b"another laptop's key")
    assert "doctored" not in probe_agent(lh)["agent"]
    # sealed with this laptop's key it runs: the cache really is what is loaded
    plant(agent_entry(lh), doctored_agent(), key=laptop_key())
    assert probe_agent(lh)["agent"].get("doctored") is True


@pytest.mark.parametrize("loose", ["group-writable", "world-writable",
                                   pytest.param("another user's", marks=needs_root)])
def test_a_cache_entry_others_could_write_is_not_run_and_is_rebuilt(lh, loose):
    probe_agent(lh)
    entry = agent_entry(lh)
    plant(entry, doctored_agent(), key=laptop_key())   # even sealed right: someone else could have put it there
    if loose == "another user's":
        os.chown(entry, NOBODY, NOBODY)
    else:
        entry.chmod(0o620 if loose == "group-writable" else 0o602)
    reply = probe_agent(lh)
    assert "doctored" not in reply["agent"] and reply["agent"][remote.AGENT_MODULE] == "compiled"
    st = agent_entry(lh).stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600)
    assert probe_agent(lh)["agent"][remote.AGENT_MODULE] == "cached"


def test_a_cache_dir_others_could_write_is_tightened(lh):
    probe_agent(lh)
    cache_dir(lh).chmod(0o777)
    assert probe_agent(lh)["agent"][remote.AGENT_MODULE] == "cached"
    assert cache_dir(lh).stat().st_mode & 0o777 == 0o700


@needs_root
def test_another_users_cache_dir_is_neither_read_nor_written(lh):
    probe_agent(lh)
    plant(agent_entry(lh), doctored_agent(), key=laptop_key())
    os.chown(cache_dir(lh), NOBODY, NOBODY)
    agent_entry(lh).unlink()   # nothing may be written back into it
    before = sorted(p.name for p in cache_dir(lh).iterdir())
    for _ in range(2):
        reply = probe_agent(lh)
        assert "doctored" not in reply["agent"] and reply["agent"][remote.AGENT_MODULE] == "compiled"
    assert sorted(p.name for p in cache_dir(lh).iterdir()) == before


def test_a_symlink_planted_at_a_cache_entrys_temp_name_is_not_followed(lh, tmp_path):
    probe_agent(lh)
    entry = agent_entry(lh)
    entry.unlink()   # the agent rewrites it, through `<entry>.<pid>.tmp`
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    agent = Agent(lh, boot=False)   # its pid names the temp file: the link goes in before the sources
    link = entry.parent / f"{entry.name}.{agent.proc.pid}.tmp"
    link.symlink_to(victim)
    agent.send(remote.boot_stream(str(lh.state)))
    agent.request({"op": "probe", "state_dir": str(lh.state), "package": "sglang", "files": [], "content": False})
    assert agent.result()["agent"][remote.AGENT_MODULE] == "compiled"
    assert agent.vanish() == 0
    assert victim.read_bytes() == b"root's file\n"
    assert link.is_symlink(), "left alone: not the agent's to remove"


# ------------------------------------------------------------ the state dir, temp files, the log

def test_an_existing_state_dir_open_to_others_is_tightened(lh):
    lh.state.chmod(0o777)
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "verified", r.message
    assert lh.state.stat().st_mode & 0o022 == 0
    assert lh.state.stat().st_mode & 0o755 == 0o755, "still readable: only write was taken from others"


def test_a_symlink_planted_at_the_probes_temp_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / ".fleetpatch-probe.pth.tmp").symlink_to(victim)
    probe_install.write_atomic(str(site / "fleetpatch-probe.pth"), b"import sys\n", 0o644)
    assert victim.read_bytes() == b"root's file\n"
    assert (site / "fleetpatch-probe.pth").read_bytes() == b"import sys\n"
    assert not stat.S_ISLNK((site / "fleetpatch-probe.pth").lstat().st_mode)


def test_a_server_log_that_is_a_symlink_is_refused_naming_the_host_and_the_path(lh, tmp_path):
    other = tmp_path / "other-file"
    other.write_bytes(b"not the server's log\n")
    lh.log.parent.mkdir(parents=True, exist_ok=True)
    lh.log.symlink_to(other)
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "error" and r.host == "h1"
    assert str(lh.log) in r.message and "symlink" in r.message and str(other) in r.message, r.message
    assert other.read_bytes() == b"not the server's log\n"
    assert lh.log.is_symlink()
