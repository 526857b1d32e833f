"""No secrets in output (issue 31, 8), over a real sshd host: a server started with
`--api-key` and tokens in its environment is deployed and verified, and neither the
reports, the terminal (with -v) nor .fleetpatch/ show a secret."""
from __future__ import annotations

from pathlib import Path


def test_a_server_started_with_secrets_verifies_and_no_output_shows_them(operator):
    inv = operator.inventory()
    restart = inv["hosts"]["v1a"]["server"]["restart"]
    restart["start"] += " --api-key sk-SECRETKEY"
    restart["env"] = {**restart["env"], "HF_TOKEN": "hf_SECRETHF", "SGLANG_HUB_TOKEN": "hub_SECRETHUB"}
    operator.write_inventory(inv, "secret-hosts.yaml")
    common = ("--inventory", "secret-hosts.yaml", "--hosts", "v1a", "-v")

    deploy = operator.run("deploy-patch", "--patch", "spec-path-beacon", *common)
    assert deploy.code == 0 and deploy.host("v1a")["status"] == "verified", deploy
    # the server really runs with the secrets: what the verdict read on the host holds them
    pid = int(operator.fleet.hosts["v1a"].host_dir.joinpath("run", "sglang.pid").read_text())
    assert b"sk-SECRETKEY" in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert "--api-key ***" in deploy.output and '"api_key": "***"' in deploy.output, deploy
    runs = [deploy,
            operator.run("verify-logs", "--patch", "spec-path-beacon", *common),
            operator.run("fetch", *common),
            operator.run("status", *common)]
    assert all(r.code == 0 for r in runs), runs
    for r in runs:
        assert "SECRET" not in r.output, r
    written = [p for p in operator.workdir.rglob("*") if p.is_file() and p.name != "secret-hosts.yaml"]
    assert any(p.name == "fetch.json" for p in written) and any(p.name.startswith("report-") for p in written)
    leaks = [str(p) for p in written if b"SECRET" in p.read_bytes()]
    assert not leaks, leaks
