"""The first connection to a host, from the installed program: a port that stays
silent or stops after its banner is named as such, and Ctrl-C while a host is
still connecting ends the run at once with that host untouched."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from support.listeners import Listener
from support.paths import REPO


def inventory(tmp_path: Path, port: int, connect_timeout: float) -> Path:
    doc = yaml.safe_load((REPO / "hosts.yaml").read_text())
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "known_hosts").write_text("")
    doc["defaults"].update(identity_file=str(key), known_hosts=str(tmp_path / "known_hosts"),
                           connect_timeout=connect_timeout)
    doc["groups"] = {}
    doc["hosts"] = {"quiet": {"address": "127.0.0.1", "port": port}}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def fleetpatch(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("FLEETPATCH_INVENTORY", None)
    return subprocess.Popen([sys.executable, "-m", "fleetpatch", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("greeting,says", [
    (b"", ["timed out after 1 s waiting for the SSH banner", "accepts connections and stays silent"]),
    (b"SSH-2.0-OpenSSH_9.2p1 stuck\r\n", ["sent the SSH banner 'SSH-2.0-OpenSSH_9.2p1 stuck'",
                                           "key exchange did not finish within 1 s"]),
], ids=["silent", "stops-after-its-banner"])
def test_a_port_that_stops_answering_is_named_for_what_it_did(tmp_path, greeting, says):
    lst = Listener(lambda conn: greeting and conn.sendall(greeting))
    try:
        inv = inventory(tmp_path, lst.port, connect_timeout=1)
        out, _ = fleetpatch("status", "--inventory", str(inv), cwd=tmp_path).communicate(timeout=60)
        # a rollout dials its first hosts while it loads (dials.py): the same words, in the host's result,
        # from the one connection it made (the host's step took the dial's, it did not dial again)
        report = tmp_path / "report.json"
        before = lst.accepted
        rolled, _ = fleetpatch("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "0",
                               "--inventory", str(inv), "--report", str(report), cwd=tmp_path).communicate(timeout=60)
        assert lst.accepted - before == 1, rolled
    finally:
        lst.close()
    line = next(x for x in out.splitlines() if x.startswith("quiet ("))
    host = json.loads(report.read_text())["hosts"]["quiet"]
    for words in says:
        assert words in line, out
        assert words in host["message"], rolled
    assert (host["status"], host["ok"]) == ("unreachable", False), host
    assert "Traceback" not in out + rolled


@pytest.mark.parametrize("signame,said", [("SIGINT", "Ctrl-C"), ("SIGTERM", "SIGTERM")], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_while_a_host_is_still_connecting_ends_at_once_and_leaves_it_untouched(tmp_path, signame, said):
    lst = Listener(lambda conn: None)   # accepts, never sends a banner
    try:
        inv = inventory(tmp_path, lst.port, connect_timeout=30)
        report = tmp_path / "report.json"
        p = fleetpatch("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "0",
                       "--inventory", str(inv), "--report", str(report), cwd=tmp_path)
        deadline = time.monotonic() + 30
        while not lst.accepted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lst.accepted, "fleetpatch connected"
        # the host's step has started (its connection was dialled ahead, while the program loaded)
        seen = []
        for line in p.stdout:
            seen.append(line)
            if line.split()[1:3] == ["quiet", "connect"]:
                break
        time.sleep(0.3)   # into the SSH handshake, which would wait 30 s for a banner
        t = time.monotonic()
        p.send_signal(getattr(signal, signame))
        out, _ = p.communicate(timeout=60)
        took = time.monotonic() - t
        out = "".join(seen) + out
    finally:
        lst.close()
    assert p.returncode == 130, out
    assert took < 5, f"Ctrl-C took {took:.1f}s to end the run"
    host = json.loads(report.read_text())["hosts"]["quiet"]
    assert host["status"] == "skipped", host
    assert f"interrupted ({said}) while its SSH connection was being made; untouched" in host["message"]
    assert out.splitlines()[-1].startswith("INTERRUPTED: rollout on 1 host: 1 skipped"), out
    assert "Traceback" not in out
