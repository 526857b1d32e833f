"""Smoke test of the local sshd fleet (fleetpatch_demo.fleet) itself."""
from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request

import paramiko
import pytest

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.standinsite import sglang_standin_available
from fleetpatch_demo.wheels import sglang_tree

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD),
    reason="needs root and /usr/sbin/sshd")

HAVE_STANDIN = sglang_standin_available()
needs_standin = pytest.mark.skipif(not HAVE_STANDIN, reason="fleetpatch_demo/standins/sglang is missing")

PY = "'/srv/fleetpatch-host/sglang env/bin/python'"


def strict_ssh(fleet: Fleet, name: str, command: str, known_hosts=None, **kw):
    """The plain OpenSSH client, strict host key checking, as an operator would run it."""
    h = fleet.hosts[name]
    argv = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes",
            "-o", f'UserKnownHostsFile="{known_hosts or fleet.known_hosts}"',
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-i", str(fleet.identity),
            "-p", str(h.ssh_port), "root@127.0.0.1", command]
    kw.setdefault("timeout", 60)
    if "input" not in kw:
        kw["stdin"] = subprocess.DEVNULL
    return subprocess.run(argv, capture_output=True, **kw)


def port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except OSError:
        return True


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    specs = [HostSpec("new", version="0.5.9", spec_v2=True, start_server=HAVE_STANDIN),
             HostSpec("old", version="0.5.8", start_server=HAVE_STANDIN)]
    with Fleet(root, specs) as f:
        yield f


def test_each_host_sees_its_own_version_at_the_same_path(fleet):
    cmd = f"{PY} -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'"
    got = {}
    for name in ("new", "old"):
        r = strict_ssh(fleet, name, cmd, text=True)
        assert r.returncode == 0, r.stderr
        got[name] = r.stdout.strip()
    assert got == {"new": "0.5.9", "old": "0.5.8"}
    # and the file really comes from the host's own copy at the shared path
    r = strict_ssh(fleet, "old", f"{PY} -c 'import importlib.util as u; "
                   f"print(u.find_spec(\"sglang\").origin)'", text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (fleet.hosts["old"].remote_site_packages + "/sglang/__init__.py")
    assert (fleet.hosts["old"].site_packages / "sglang" / "version.py").is_file()


def test_commands_log_records_each_command(fleet):
    fleet.clear_commands("new")
    weird = "printf '%s\\n' 'a\\b'\necho \"two  spaces\"; true"
    r = strict_ssh(fleet, "new", weird, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a\\b\ntwo  spaces\n"
    r = strict_ssh(fleet, "new", "true", text=True)
    assert fleet.commands("new") == [weird, "true"]
    recs = fleet.command_records("new")
    assert abs(recs[-1][0] - time.time()) < 60
    assert weird not in fleet.commands("old")


def test_home_is_the_hosts_empty_home(fleet):
    r = strict_ssh(fleet, "old", 'echo "$HOME"; ls -A "$HOME" | wc -l', text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/srv/fleetpatch-host/home", "0"]


def test_stdin_stdout_and_status_pass_through(fleet):
    data = bytes(range(256)) * 64 + b"\n\x00tail"
    r = strict_ssh(fleet, "new", "cat; exit 7", input=data)
    assert r.returncode == 7
    assert r.stdout == data


def test_unknown_and_wrong_host_keys_are_refused(fleet, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    r = strict_ssh(fleet, "new", "true", known_hosts=empty, text=True)
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr
    # another host's key under this host's name: a changed key, refused
    other = (fleet.hosts["old"].host_key.with_name("ssh_host_ed25519_key.pub")).read_text().split()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{fleet.hosts['new'].ssh_port} {other[0]} {other[1]}\n")
    r = strict_ssh(fleet, "new", "true", known_hosts=wrong, text=True)
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


def test_paramiko_reject_policy(fleet):
    h = fleet.hosts["old"]
    c = paramiko.SSHClient()
    c.load_host_keys(str(fleet.known_hosts))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect("127.0.0.1", port=h.ssh_port, username="root", key_filename=str(fleet.identity),
              look_for_keys=False, allow_agent=False, timeout=5)
    try:
        _, out, _ = c.exec_command("cat /srv/fleetpatch-host/" + fleetmod.TOKEN_FILE)
        assert out.read().decode().strip() == h.token
        assert out.channel.recv_exit_status() == 0
    finally:
        c.close()
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        c.connect("127.0.0.1", port=h.ssh_port, username="root",
                  key_filename=str(fleet.identity), look_for_keys=False, allow_agent=False,
                  timeout=5)
    c.close()


def test_inventory_shape(fleet, tmp_path):
    inv = fleet.inventory()
    assert set(inv) == {"defaults", "hosts", "groups"}
    assert inv["groups"] == {}
    assert fleet.inventory(canary=True)["groups"] == {"canary": ["new"]}
    d = inv["defaults"]
    assert d["engine"]["python"] == "/srv/fleetpatch-host/sglang env/bin/python"
    assert d["known_hosts"] == str(fleet.known_hosts) and "port" not in d
    assert d["server"]["restart"]["pidfile"] == "/srv/fleetpatch-host/run/sglang.pid"
    new, old = inv["hosts"]["new"], inv["hosts"]["old"]
    assert new["port"] == fleet.hosts["new"].ssh_port
    assert "--speculative-eagle-topk 1" in new["server"]["restart"]["start"]
    assert "--speculative-eagle-topk 4" in old["server"]["restart"]["start"]
    assert new["server"]["restart"]["env"]["SGLANG_ENABLE_SPEC_V2"] == "True"
    assert "SGLANG_ENABLE_SPEC_V2" not in old["server"]["restart"]["env"]
    assert old["server"]["health_url"] == f"http://127.0.0.1:{fleet.hosts['old'].http_port}/health"
    import yaml
    p = fleet.write_inventory(tmp_path / "hosts.yaml", canary=True)
    assert yaml.safe_load(p.read_text()) == fleet.inventory(canary=True)


@needs_standin
def test_servers_answer_health_with_their_launch_config(fleet):
    for name in ("new", "old"):
        h = fleet.hosts[name]
        with urllib.request.urlopen(h.health_url, timeout=5) as r:
            assert r.status == 200
        pid = fleet.server_pid(name)
        assert pid and pid in fleet.processes(name)
        env = dict(kv.split("=", 1) for kv in
                   open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
        assert (env.get("SGLANG_ENABLE_SPEC_V2") == "True") == (name == "new")
        argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        assert argv[argv.index("--speculative-eagle-topk") + 1] == ("1" if name == "new" else "4")
        assert os.readlink(f"/proc/{pid}/cwd") == "/srv/fleetpatch-host"


def test_reset_restores_the_pristine_tree(fleet):
    h = fleet.hosts["old"]
    rel = "sglang/srt/speculative/eagle_worker.py"
    target = h.site_packages / rel
    target.write_text("# patched\n")
    (target.parent / "__pycache__").mkdir(exist_ok=True)
    (target.parent / "__pycache__" / "x.pyc").write_bytes(b"x")
    (h.state_dir / "ledger.json").write_text("{}")
    fleet.reset("old", start_server=False)
    assert fleet.server_pid("old") is None
    assert target.read_bytes() == (sglang_tree("0.5.8") / rel).read_bytes()
    assert not list(h.site_packages.rglob("__pycache__"))
    assert list(h.state_dir.iterdir()) == [] and list(h.log_path.parent.iterdir()) == []
    fleet.reset("old")  # and back up, as the spec says
    if HAVE_STANDIN:
        assert fleet.healthy("old")
        assert fleet.server_pid("old")


def test_stop_leaves_nothing_behind(tmp_path):
    f = Fleet(tmp_path / "f", [HostSpec("solo", start_server=HAVE_STANDIN)])
    f.start()
    h = f.hosts["solo"]
    # a daemon of its own, started over ssh, must die with the fleet too
    r = strict_ssh(f, "solo", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!", text=True)
    assert r.returncode == 0, r.stderr
    stray = int(r.stdout.strip())
    ns = h.ns_ino
    members = f.processes("solo")
    assert h.sshd_pid in members and stray in members
    server = f.server_pid("solo")
    f.stop()
    f.stop()  # idempotent
    left = [p for p in (members + [server]) if p and fleetmod._alive(p)]
    assert left == []
    assert [p for p in fleetmod._pids() if fleetmod._ns_ino(p) == ns] == []
    assert port_closed(h.ssh_port)
    if server:
        assert port_closed(h.http_port)
