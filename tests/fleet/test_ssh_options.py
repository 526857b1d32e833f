"""SSH the way operators have it: ~/.ssh/config aliases, the ssh-agent, and a
ProxyJump bastion (a real sshd of its own), with host keys still enforced."""
from __future__ import annotations

import os
import subprocess

import pytest

from support.marks import needs_fleet
from fleetpatch_demo.fleet import Fleet, HostSpec

pytestmark = needs_fleet


@pytest.fixture(scope="module")
def bastion(tmp_path_factory):
    """A jump host: its own sshd, its own key, no engine on it."""
    root = tmp_path_factory.mktemp("bastion")
    with Fleet(root, [HostSpec("bastion", start_server=False)]) as f:
        yield f


def with_bastion_keys(operator, bastion) -> dict:
    """One known_hosts holding the fleet's and the bastion's keys."""
    doc = operator.inventory()
    combined = operator.workdir / "known_hosts"
    combined.write_text(operator.fleet.known_hosts.read_text() + bastion.known_hosts.read_text())
    doc["defaults"]["known_hosts"] = str(combined)
    return doc


def test_unknown_bastion_key_is_refused(operator, fleet, bastion):
    doc = operator.inventory()  # the fleet's known_hosts only: the bastion's key is unknown
    doc["hosts"]["v1a"]["gateway"] = f"root@127.0.0.1:{bastion.hosts['bastion'].ssh_port}"
    operator.write_inventory(doc)
    run = operator.run("status", "--hosts", "v1a")
    assert run.code == 1, run
    assert run.host("v1a")["status"] == "host-key-rejected"


def test_deploy_through_a_proxyjump_bastion(operator, fleet, bastion):
    doc = with_bastion_keys(operator, bastion)
    # the bastion accepts the fleet's client key too
    bastion.authorized_keys.write_text(bastion.authorized_keys.read_text()
                                       + fleet.identity.with_suffix(".pub").read_text())
    b = bastion.hosts["bastion"]
    for name in ("v1a", "v2a"):
        doc["hosts"][name]["gateway"] = f"root@127.0.0.1:{b.ssh_port}"
    doc["hosts"] = {n: doc["hosts"][n] for n in ("v1a", "v2a")}
    operator.write_inventory(doc)
    run = operator.run("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "1")
    assert run.code == 0, run
    assert run.host("v1a")["executed_path"] == "EAGLEWorker"
    assert run.host("v2a")["executed_path"] == "EAGLEWorkerV2"
    # Only the targets ran commands: the bastion only forwarded the connections.
    assert bastion.commands("bastion") == []
    assert fleet.commands("v1a")
    # And the connections really go through it: with the bastion down the hosts are unreachable.
    bastion.stop()
    down = operator.run("status")
    assert down.code == 1, down
    assert down.host("v1a")["status"] == down.host("v2a")["status"] == "unreachable"


def test_ssh_config_alias_user_port_identity_and_the_agent(operator, fleet, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    h = fleet.hosts["v2a"]
    (home / ".ssh" / "config").write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {h.ssh_port}\n  User root\n"
        f"  IdentityFile {fleet.identity}\n  UserKnownHostsFile {fleet.known_hosts}\n")
    doc = operator.inventory()
    entry = doc["hosts"]["v2a"]
    entry.pop("port")
    entry["address"] = "gpu-alias"
    for key in ("user", "identity_file"):
        doc["defaults"].pop(key, None)
    doc["hosts"] = {"v2a": entry}
    operator.write_inventory(doc)
    env = {"HOME": str(home), "SSH_AUTH_SOCK": ""}
    run = operator.run("status", env=env)
    assert run.code == 0, run
    assert run.host("v2a")["engine_version"] == "0.5.9"

    # The same without IdentityFile anywhere: the key comes from a real ssh-agent.
    (home / ".ssh" / "config").write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {h.ssh_port}\n  User root\n")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.05"])
        subprocess.run(["ssh-add", str(fleet.identity)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True)
        no_agent = operator.run("status", env={"HOME": str(home), "SSH_AUTH_SOCK": ""})
        assert no_agent.code == 1 and no_agent.host("v2a")["status"] == "auth-failed", no_agent
        with_agent = operator.run("status", env={"HOME": str(home), "SSH_AUTH_SOCK": str(sock)})
        assert with_agent.code == 0, with_agent
    finally:
        agent.terminate()
        agent.wait()
