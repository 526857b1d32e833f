"""The known_hosts files are read once per run, not once per host, and a connection
trusts exactly the keys that reading them whole would have given it: against
paramiko's own HostKeys, and a real SSH handshake with paramiko's server."""
from __future__ import annotations

import subprocess

import paramiko
import pytest
import yaml
from paramiko.hostkeys import HostKeys

from fleetpatch import knownhosts, ssh_errors
from fleetpatch.errors import HostFailure, Status
from fleetpatch.inventory import parse_inventory
from fleetpatch.knownhosts import KnownHosts, lookup_name
from fleetpatch.remote import SSHTransport
from support.listeners import refusing_ssh_server


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    made = {}
    for name in ("host", "other", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
        made[name] = paramiko.Ed25519Key.from_private_key_file(str(folder / name))
    made["client_file"] = str(folder / "client")
    made["ecdsa"] = paramiko.ECDSAKey.generate()
    return made


def line(names: str, key) -> str:
    return f"{names} {key.get_name()} {key.get_base64()}\n"


def test_a_host_gets_the_keys_that_reading_every_file_whole_gives_it(tmp_path, keys):
    system, user = tmp_path / "ssh_known_hosts", tmp_path / "known_hosts"
    system.write_text(line("gpu-a01,10.0.0.1", keys["host"]) + line("[gpu-a02]:2222", keys["other"])
                      + "# a comment\n\n" + line(HostKeys.hash_host("gpu-a03"), keys["host"]))
    # gpu-a01 is in both files with another key of the same type (the first file's wins) and an
    # ECDSA key the first lacks; gpu-a04 only in the second
    user.write_text(line("gpu-a01", keys["other"]) + line("gpu-a01", keys["ecdsa"]) + line("gpu-a04", keys["other"])
                    + line(HostKeys.hash_host("gpu-a03"), keys["ecdsa"]) + line(HostKeys.hash_host("gpu-a03"), keys["other"])
                    + line(",".join(HostKeys.hash_host(n) for n in ("gpu-a05", "10.0.0.5")), keys["host"]))
    missing = tmp_path / "absent"
    files = [system, missing, user]
    whole = HostKeys()
    for f in (system, user):
        whole.load(str(f))
    known = KnownHosts()
    for name in ("gpu-a01", "10.0.0.1", lookup_name("gpu-a02", 2222), "gpu-a02", "gpu-a03", "gpu-a04",
                 "gpu-a05", "10.0.0.5", lookup_name("gpu-a01", 2222), "gpu-a99"):
        seeded = HostKeys()
        known.seed(seeded, files, name)
        want, got = whole.lookup(name), seeded.lookup(name)
        assert (got is None) == (want is None), name
        if want is not None:
            # in the order paramiko prefers them (its first is the host key type it asks for)
            assert got.keys() == list(dict.fromkeys(want.keys())), name
            assert all(got[k].asbytes() == want[k].asbytes() for k in want.keys()), name
    assert HostKeys().lookup("x") is None


def test_the_files_are_read_once_for_every_host_of_a_run(tmp_path, keys, monkeypatch):
    user = tmp_path / "known_hosts"
    user.write_text("".join(line(f"gpu-{i:03d}", keys["host"]) for i in range(300)))
    reads = []
    real_read = knownhosts.read_lines
    monkeypatch.setattr(knownhosts, "read_lines", lambda path: (reads.append(path), real_read(path))[1])
    known = KnownHosts()
    for i in range(300):
        seeded = HostKeys()
        known.seed(seeded, [user], f"gpu-{i:03d}")
        assert seeded.lookup(f"gpu-{i:03d}") is not None
        assert seeded.lookup(f"gpu-{(i + 1) % 300:03d}") is None   # only its own
    assert reads == [user]


def _inventory(keys, known_file, port):
    return parse_inventory(yaml.safe_dump({
        "defaults": {"user": "root", "identity_file": keys["client_file"], "known_hosts": str(known_file),
                     "connect_timeout": 3, "engine": {"python": "/usr/bin/python3"},
                     "server": {"log": "/tmp/x.log",
                                "restart": {"kind": "command", "start": "{python} -m x", "pidfile": "/tmp/x.pid"}}},
        "hosts": {"h1": {"address": "127.0.0.1", "port": port}}}))


def test_a_known_hosts_line_that_cannot_be_read_is_named_and_no_host_is_contacted(tmp_path, keys):
    server = refusing_ssh_server(keys["host"])
    known_file = tmp_path / "known_hosts"
    known_file.write_text(line(lookup_name("127.0.0.1", server.port), keys["host"])
                          + "gpu-b07 ssh-ed25519 AAAA!!notbase64\n")
    inv = _inventory(keys, known_file, server.port)
    try:
        with pytest.raises(HostFailure) as failed:
            SSHTransport(inv.hosts["h1"], inv.hosts).open()
    finally:
        server.close()
    message = str(failed.value)
    assert failed.value.status == Status.HOST_KEY_REJECTED
    assert message.startswith("h1 (") and f"{known_file}, line 2: " in message, message
    assert "correct or delete that line" in message, message
    assert server.accepted == 0


def test_a_known_hosts_file_edited_mid_run_is_read_again(tmp_path, keys):
    """The host's key checks out (the login is what fails: this server refuses every key); then
    the operator's known_hosts says another key for it, and the run's next connection refuses it."""
    ssh_errors.silence_paramiko()
    server = refusing_ssh_server(keys["host"])
    known_file = tmp_path / "known_hosts"
    name = lookup_name("127.0.0.1", server.port)
    known_file.write_text(line(name, keys["host"]))
    inv = _inventory(keys, known_file, server.port)
    host = inv.hosts["h1"]
    run_known = KnownHosts()
    try:
        with pytest.raises(HostFailure) as first:
            SSHTransport(host, inv.hosts, known_hosts=run_known).open()
        assert first.value.status == Status.AUTH_FAILED, first.value
        known_file.write_text(line(name, keys["other"]))
        with pytest.raises(HostFailure) as second:
            SSHTransport(host, inv.hosts, known_hosts=run_known).open()
    finally:
        server.close()
    assert second.value.status == Status.HOST_KEY_REJECTED
    assert "the host key CHANGED" in str(second.value)
