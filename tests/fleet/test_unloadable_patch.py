"""A host whose ledger names a patch this laptop cannot load (it was deployed
with --patches DIR, and this run has no such DIR) by an older fleetpatch, which
kept no record of the patch on the host: verify-logs and rollback say so once
per host, naming the host and the flag that finds the patch, and rollback
changes nothing. (A deploy by this fleetpatch records the patch on the host:
tests/test_patch_record.py.) End to end on the real sshd fleet."""
from __future__ import annotations

import json

from support.marks import needs_fleet
from support.paths import FIXTURE_PATCHES, sha256

pytestmark = needs_fleet

EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
FIX = ("--patches", str(FIXTURE_PATCHES))


def deploy_fixture(operator, hosts):
    run = operator.run("deploy-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", hosts)
    assert run.code == 0, run
    for name in hosts.split(","):   # as an older fleetpatch left the ledger: no record of the patch
        path = operator.fleet.hosts[name].state_dir / "ledger.json"
        ledger = json.loads(path.read_text())
        del ledger["patches"]["v2-only-beacon"]["record"]
        path.write_text(json.dumps(ledger))


def test_verify_logs_names_each_host_once_and_suggests_patches_dir(operator, fleet):
    deploy_fixture(operator, "v2a,v2b")
    run = operator.run("verify-logs", "--hosts", "v2a,v2b", "--timeout", "10")
    assert run.code == 1, run
    lines = [l for l in run.output.splitlines() if "cannot be loaded here" in l]
    assert len(lines) == 2, run.output
    for name, line in zip(("v2a", "v2b"), sorted(lines)):
        assert line.startswith(f"{name}: "), line
        assert line.count(name) == 1, line
        assert "v2-only-beacon" in line and "--patches DIR" in line
    # with the folder, the same command proves it
    again = operator.run("verify-logs", "--hosts", "v2a", *FIX, "--timeout", "10")
    assert again.code == 0, again
    assert again.host("v2a")["status"] == "verified"


def test_rollback_of_an_unloadable_patch_refuses_before_restoring(operator, fleet):
    deploy_fixture(operator, "v2a")
    patched = sha256(fleet.hosts["v2a"].site_packages / EAGLE_V2)
    run = operator.run("rollback", "--hosts", "v2a", "--timeout", "10")
    assert run.code == 1, run
    msg = run.host("v2a")["message"]
    assert msg.startswith("v2a: ") and "--patches DIR" in msg and "nothing was changed" in msg
    assert sha256(fleet.hosts["v2a"].site_packages / EAGLE_V2) == patched, "nothing was restored"
    ledger = json.loads((fleet.hosts["v2a"].state_dir / "ledger.json").read_text())
    assert "v2-only-beacon" in ledger["patches"]
    assert not (fleet.hosts["v2a"].state_dir / "lock").exists()
    done = operator.run("rollback", "--hosts", "v2a", *FIX, "--timeout", "10")
    assert done.code == 0 and done.host("v2a")["status"] == "rolled-back", done
