"""Container hosts (engine.container): every command works on the files inside the engine's
container and its output, over one SSH command per host, on a real Docker daemon."""
from __future__ import annotations

import hashlib
import shlex

import pytest

from fleetpatch_demo.wheels import sglang_tree

WORKER = "sglang/srt/speculative/eagle_worker.py"
WORKER_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
CHECKOUT = "/sgl-workspace/sglang/python"
BEACON = "spec-path-beacon"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def inside(fleet, name: str, path: str) -> bytes:
    """The bytes of a file inside the host's container, read through the daemon (not fleetpatch)."""
    return fleet.docker_cli("exec", fleet.hosts[name].container_name, "cat", f"{CHECKOUT}/{path}").stdout.encode(
        "utf-8", "surrogateescape")


def wheel(path: str) -> bytes:
    return (sglang_tree("0.5.9") / path).read_bytes()


def assert_one_agent_command(fleet, name: str, python: str = "python3") -> None:
    commands = fleet.commands(name)
    assert len(commands) == 1, f"{name} ran {len(commands)} remote commands: {[c[:60] for c in commands]}"
    assert shlex.split(commands[0])[:3] == [python, "-S", "-c"], commands[0][:80]


def test_deploy_verify_status_rollback_in_a_container(container_operator):
    op, f = container_operator, container_operator.fleet
    before = _sha(inside(f, "c1", WORKER))
    assert before == _sha(wheel(WORKER))
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert run.code == 0, run
    assert run.host("c1")["status"] == "verified", run
    assert run.host("c1")["executed_path"] == "EAGLEWorker"
    assert_one_agent_command(f, "c1")
    assert _sha(inside(f, "c1", WORKER)) != before
    f.clear_commands("c1")
    status = op.run("status", "--hosts", "c1")
    assert status.code == 0, status
    assert status.host("c1")["applied"] == [f"{BEACON}@1"]
    assert_one_agent_command(f, "c1")
    f.clear_commands("c1")
    back = op.run("rollback", "--hosts", "c1")
    assert back.code == 0, back
    assert _sha(inside(f, "c1", WORKER)) == before
    assert_one_agent_command(f, "c1")


def test_a_docker_restart_keeps_the_patch_and_a_re_creation_is_patch_lost_then_re_applied(container_operator):
    op, f = container_operator, container_operator.fleet
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert run.code == 0 and run.host("c1")["status"] == "verified", run
    patched = inside(f, "c1", WORKER)
    old_id = f.container_id("c1")
    f.docker_cli("restart", "-t", "5", f.hosts["c1"].container_name)   # the same container: its files stay
    f.wait_healthy(["c1"])
    assert f.container_id("c1") == old_id and inside(f, "c1", WORKER) == patched
    kept = op.run("status", "--hosts", "c1")
    assert kept.code == 0 and kept.host("c1")["status"] == "ok", kept

    new_id = f.recreate_container("c1")   # compose up after a change: the image's files are back
    assert inside(f, "c1", WORKER) == wheel(WORKER)
    f.clear_commands("c1")
    lost = op.run("status", "--hosts", "c1")
    assert lost.code == 1 and lost.host("c1")["status"] == "patch-lost", lost
    assert old_id[:12] in lost.output and new_id[:12] in lost.output and "re-created at" in lost.output
    assert lost.host("c1")["drift"] == []
    verify = op.run("verify-logs", "--hosts", "c1")
    assert verify.code == 1 and verify.host("c1")["status"] == "patch-lost", verify
    assert old_id[:12] in verify.output and new_id[:12] in verify.output
    assert len(f.commands("c1")) == 2   # one per command

    again = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert again.code == 0 and again.host("c1")["status"] == "verified", again
    assert inside(f, "c1", WORKER) == patched
    ledger = __import__("json").loads((f.hosts["c1"].state_dir / "containers" / f.hosts["c1"].container_name
                                       / "ledger.json").read_text())
    assert ledger["container"]["id"] == new_id and ledger["lost"]["old_id"] == old_id
    assert op.run("status", "--hosts", "c1").host("c1")["status"] == "ok"
    back = op.run("rollback", "--hosts", "c1")
    assert back.code == 0, back
    assert inside(f, "c1", WORKER) == wheel(WORKER)


def test_a_marker_printed_before_the_restart_never_counts(container_operator):
    """After a deploy the container's output holds the marker; the rollback's restart opens a
    new window, where the marker must be gone: it is, though `docker logs` still holds the old one."""
    op, f = container_operator, container_operator.fleet
    assert op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1").code == 0
    back = op.run("rollback", "--hosts", "c1")
    assert back.code == 0 and back.host("c1")["status"] == "rolled-back", back
    logs = f.docker_cli("logs", f.hosts["c1"].container_name)
    assert "fleetpatch spec-path-beacon: EAGLEWorker" in logs.stdout + logs.stderr   # printed before the restart
    verify = op.run("verify-logs", "--hosts", "c1", "--patch", BEACON, "--timeout", "5")
    assert verify.code == 1 and verify.host("c1")["status"] != "verified", verify


def test_a_mixed_rollout_of_container_and_plain_hosts(container_operator):
    op, f = container_operator, container_operator.fleet
    run = op.run("rollout", "--patch", BEACON, "--group", "all", "--batch", "1")
    assert run.code == 0, run
    for name in ("c1", "c2", "p1"):
        assert run.host(name)["status"] == "verified", run
    assert run.host("c2")["executed_path"] == "EAGLEWorkerV2"
    assert inside(f, "c2", WORKER_V2) != wheel(WORKER_V2)
    assert_one_agent_command(f, "c1")
    assert_one_agent_command(f, "c2")
    assert_one_agent_command(f, "p1", f.hosts["p1"].remote_python)


# -- errors before anything changes ----------------------------------------------------------

def _state_files(f, name: str) -> list:
    root = f.hosts[name].state_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "agent-cache" not in str(p))


def test_a_missing_container_is_one_line_naming_host_container_and_cause(container_operator):
    op, f = container_operator, container_operator.fleet
    inv = op.inventory()
    inv["hosts"]["c1"]["engine"]["container"] = "sglang-nonesuch"
    op.write_inventory(inv)
    before = _state_files(f, "c1")
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert run.code == 1 and run.host("c1")["status"] == "error", run
    msg = run.host("c1")["message"]
    assert msg.startswith("c1: container sglang-nonesuch (docker): no such container on this host; nothing was "
                          "changed"), msg
    assert "\n" not in msg
    assert _state_files(f, "c1") == before and inside(f, "c1", WORKER) == wheel(WORKER)


def test_a_stopped_container_is_refused_before_anything_changes(container_operator):
    op, f = container_operator, container_operator.fleet
    f.stop_server("c1", grace=5)
    before = _state_files(f, "c1")
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    msg = run.host("c1")["message"]
    assert run.code == 1 and "\n" not in msg, run
    assert msg.startswith(f"c1: container {f.hosts['c1'].container_name} (docker): the container is exited"), msg
    assert "nothing was changed" in msg and "docker start" in msg
    assert _state_files(f, "c1") == before


def test_an_unreachable_runtime_is_refused_before_anything_changes(container_operator):
    op, f = container_operator, container_operator.fleet
    moved = f.ssh("c1", "mv /run/docker.sock /run/docker.sock.away")   # the host's own /run: its daemon is gone
    assert moved.returncode == 0, moved.stderr
    f.clear_commands("c1")
    try:
        run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    finally:
        f.ssh("c1", "mv /run/docker.sock.away /run/docker.sock")
    msg = run.host("c1")["message"]
    assert run.code == 1 and "\n" not in msg, run
    assert msg.startswith(f"c1: container {f.hosts['c1'].container_name} (docker): the runtime cannot be reached"), msg
    assert inside(f, "c1", WORKER) == wheel(WORKER)


def test_a_user_who_may_not_use_the_runtime_is_told_so(docker_daemon, tmp_path):
    """The agent's check, as an SSH user outside the docker group runs it: the real CLI, the real daemon."""
    import os
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from fleetpatch.agent.container import resolve\n"
            "from fleetpatch.agent.base import AgentError\n"
            "try:\n    resolve({'container': {'name': 'sglang-x', 'runtime': 'docker'}})\n"
            "except AgentError as e:\n    print(e.message)\n")
    src = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code,
                          src], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{docker_daemon.sock}",
                              "HOME": str(tmp_path)})
    line = out.stdout.strip()
    assert line.startswith("container sglang-x (docker): the SSH user (uid 65534) may not use docker: permission "
                           "denied"), (line, out.stderr)
    assert "nothing was changed" in line and "\n" not in line


def test_a_server_started_in_a_long_running_container_by_exec(container_operator):
    """restart.kind command on a container host: the server runs beside the container's main
    process, started by `docker exec -d`, its pidfile and log inside the container."""
    from fleetpatch_demo import containerhost
    from fleetpatch_demo.fleet import _free_ports
    op, f = container_operator, container_operator.fleet
    port = _free_ports(1)[0]
    argv = containerhost.server_argv(port, 4, 8)
    inv = op.inventory()
    inv["hosts"]["c1"]["server"] = {
        "health_url": f"http://127.0.0.1:{port}/health", "log": "/tmp/fp-exec.log",
        "restart": {"kind": "command", "start": " ".join(["{python}", *argv[1:]]), "pidfile": "/tmp/fp-exec.pid",
                    "stop_grace": 5, "workdir": None, "env": None}}
    op.write_inventory(inv)
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert run.code == 0 and run.host("c1")["status"] == "verified", run
    name = f.hosts["c1"].container_name
    log = f.docker_cli("exec", name, "cat", "/tmp/fp-exec.log").stdout
    assert "fleetpatch spec-path-beacon: EAGLEWorker" in log
    first = f.docker_cli("exec", name, "cat", "/tmp/fp-exec.pid").stdout.strip()
    back = op.run("rollback", "--hosts", "c1")
    assert back.code == 0 and back.host("c1")["status"] == "rolled-back", back
    assert inside(f, "c1", WORKER) == wheel(WORKER)
    second = f.docker_cli("exec", name, "cat", "/tmp/fp-exec.pid").stdout.strip()
    assert second and second != first
    gone = f.docker_cli("exec", name, "sh", "-c", f"test -d /proc/{first} && echo alive || echo gone").stdout
    assert gone.strip() == "gone"   # the first server was stopped, inside the container


def test_fetch_and_check_patch_read_the_files_inside_the_container(container_operator):
    import json
    op, f = container_operator, container_operator.fleet
    run = op.run("fetch", "--dest", "src", "--hosts", "c1,p1")
    assert run.code == 0, run
    meta = json.loads((op.workdir / "src" / "c1" / "fetch.json").read_text())
    assert meta["version"] == "0.5.9" and meta["package_dir"] == CHECKOUT
    fetched = next((op.workdir / "src" / "c1").rglob("eagle_worker.py"))
    assert fetched.read_bytes() == inside(f, "c1", WORKER)
    check = op.run("check-patch", "--patch", BEACON, "--hosts", "c1,p1")
    assert check.code == 0, check
    assert check.host("c1")["status"] == "applies" and inside(f, "c1", WORKER) == wheel(WORKER)


def test_a_router_aware_rollout_drains_container_hosts_like_any_worker(container_operator, tmp_path):
    """Containers on the host network are workers of the real sglang-router: each is taken
    out, drained, restarted (docker stop/start), verified and put back."""
    from fleetpatch.router import Router
    from fleetpatch_demo.routerproc import RouterProcess, router_command
    if router_command() is None:
        pytest.skip("sglang-router is not installed (test extra)")
    op, f = container_operator, container_operator.fleet
    urls = {n: f"http://127.0.0.1:{f.hosts[n].http_port}" for n in ("c1", "c2", "p1")}
    with RouterProcess(tmp_path / "router.log") as rp:
        r = Router(rp.url)
        for url in urls.values():
            r.add(url, timeout=20)
        doc = op.inventory()
        for n, url in urls.items():
            doc["hosts"][n]["server"]["url"] = url
        doc["groups"] = {"behind": {"hosts": list(urls), "router": {"urls": [rp.url]}}}
        op.write_inventory(doc)
        run = op.run("rollout", "--patch", BEACON, "--group", "all", "--batch", "1", "--canary", "0")
        assert run.code == 0, run
        for n in urls:
            h = run.host(n)
            assert h["status"] == "verified", h
            assert h["router"]["removed"] is True and h["router"]["readded"] is True, h["router"]
        assert {w.url: w.healthy for w in r.list_workers()} == {u: True for u in urls.values()}
    assert_one_agent_command(f, "c1")


# -- the demo ---------------------------------------------------------------------------------

@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the demo needs root")
def test_demo_containers_says_plainly_what_is_missing_where_no_daemon_answers(tmp_path):
    import os
    import subprocess
    import sys
    env = {**os.environ, "FLEETPATCH_TEST_DOCKER_SOCK": str(tmp_path / "none.sock"), "COLUMNS": "300"}
    proc = subprocess.run([sys.executable, "-m", "fleetpatch", "demo", "--containers", "--root", str(tmp_path / "d")],
                          capture_output=True, text=True, env=env, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert ("fleetpatch demo: --containers runs each engine in a Docker container, and the Docker daemon is not "
            f"running: no socket at {tmp_path / 'none.sock'}") in out, out
    assert "nothing was started" in out and not (tmp_path / "d").exists()


def test_a_rollback_after_a_re_creation_finds_the_originals_there_and_clears_the_record(container_operator):
    op, f = container_operator, container_operator.fleet
    assert op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1").code == 0
    f.recreate_container("c1")
    back = op.run("rollback", "--hosts", "c1")
    assert back.code == 0, back
    assert inside(f, "c1", WORKER) == wheel(WORKER)
    status = op.run("status", "--hosts", "c1")
    assert status.code == 0 and status.host("c1")["applied"] == [], status


def test_an_absolute_symlink_in_the_container_never_reaches_the_hosts_file(container_operator, tmp_path):
    """A hostile image: the engine file is an absolute symlink to a path that, resolved from
    the host (as /proc/PID/root + path would be), is a host file. The agent runs as root: it
    must read and write only what the container itself reaches, where the link leads nowhere."""
    op, f = container_operator, container_operator.fleet
    victim = tmp_path / "host-file.py"
    secret = wheel(WORKER) + b"# the host's own bytes\n"   # the patch would apply to them
    victim.write_bytes(secret)
    name = f.hosts["c1"].container_name
    f.docker_cli("exec", name, "ln", "-sf", str(victim), f"{CHECKOUT}/{WORKER}")
    fetched = op.run("fetch", "--dest", "src", "--hosts", "c1")
    copies = [p.read_bytes() for p in (op.workdir / "src").rglob("eagle_worker.py")]
    assert secret not in copies, "the host's file was read as the container's"
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert run.code != 0 and run.host("c1")["status"] != "verified", run
    assert WORKER in run.host("c1")["message"], run.host("c1")["message"]
    assert victim.read_bytes() == secret
    assert not copies and "not present on the host" in fetched.output and WORKER in fetched.output, fetched


def test_a_checkout_that_links_to_a_host_path_is_never_written_through(container_operator, tmp_path):
    """The image's editable checkout is an absolute symlink whose target exists only on the
    host: seen from the host it is a whole sglang tree there. The patch must not land in it."""
    import shutil
    op, f = container_operator, container_operator.fleet
    host_tree = tmp_path / "sgl-workspace"
    shutil.copytree(sglang_tree("0.5.9"), host_tree / "sglang" / "python")
    before = (host_tree / "sglang" / "python" / WORKER).read_bytes()
    name = f.hosts["c1"].container_name
    f.docker_cli("exec", name, "sh", "-c", f"rm -rf /sgl-workspace && ln -s {host_tree} /sgl-workspace")
    run = op.run("deploy-patch", "--patch", BEACON, "--hosts", "c1")
    assert (host_tree / "sglang" / "python" / WORKER).read_bytes() == before, "the host's file was written"
    assert run.code != 0 and run.host("c1")["status"] == "error", run
    msg = run.host("c1")["message"]
    assert "sglang is not installed" in msg and "\n" not in msg, msg
    assert f"names {CHECKOUT}, which the container resolves to {host_tree}/sglang/python, where it is not" in msg
