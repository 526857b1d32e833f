"""-v on every host command prints each host's evidence (issue 23, 7h): the installed
program over real sshd hosts."""
from __future__ import annotations


# ----------------------------------------------------------------- 7h

def test_verbose_prints_each_hosts_evidence(operator):
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a", "-v")
    assert run.code == 0, run
    out = run.output
    assert "v1a: verified, path EAGLEWorker (spec-path-beacon@1)" in out, out
    assert "marker EAGLEWorker at log line " in out, out
    assert "launch: " in out and "(process launch config)" in out, out
    quiet = operator.run("verify-logs", "--patch", "spec-path-beacon", "--hosts", "v1a")
    assert quiet.code == 0 and "marker EAGLEWorker at log line" not in quiet.output
    loud = operator.run("verify-logs", "--patch", "spec-path-beacon", "--hosts", "v1a", "--verbose")
    assert "marker EAGLEWorker at log line" in loud.output, loud


def test_every_host_command_lists_the_verbose_flag(operator):
    for cmd in ("fetch", "check-patch", "deploy-patch", "verify-logs", "rollback", "status", "rollout"):
        run = operator.run(cmd, "--help")
        assert "-v, --verbose" in run.output, (cmd, run.output)
