"""The container-host test bed on a real Docker daemon: the private dockerd, the registry-free
images (Debian trixie + SGLang laid out as lmsysorg/sglang), container hosts of the demo fleet
that answer over SSH, and the plain message where no daemon can be reached."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from fleetpatch_demo import containerhost, images
from fleetpatch_demo.dockerd import Dockerd, docker_unavailable
from fleetpatch_demo.fleet import _free_ports
from fleetpatch_demo.wheels import sglang_tree

WORKER = "sglang/srt/speculative/eagle_worker.py"
CHECKOUT = "/sgl-workspace/sglang/python"
TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z ")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except OSError as e:
        return getattr(e, "code", 0) or 0


def _wait_health(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _health(port) != 200:
        assert time.monotonic() < deadline, f"no 200 from :{port}/health"
        time.sleep(0.1)


# -- the daemon ---------------------------------------------------------------------------

def test_the_daemon_answers_with_overlay2_and_is_reused_at_its_socket(docker_daemon):
    assert docker_daemon.ping()
    info = docker_daemon.get_json("/info")
    assert info["Driver"] == "overlay2"
    again = Dockerd(docker_daemon.sock).start()
    assert again.ping() and not again.owned       # reused, so never stopped by this handle
    assert again.stop() is False and docker_daemon.ping()


def test_a_private_daemon_starts_on_its_own_socket_and_stops_cleanly(docker_daemon):
    short = Path(tempfile.mkdtemp(prefix="fpd-"))   # containerd's socket paths must stay short
    d = Dockerd(short / "s" / "docker.sock", short / "r")
    try:
        d.start()
        assert d.owned and d.ping()
        assert d.cli("version", "--format", "{{.Server.Version}}").stdout.startswith("20.")
        assert d.stop()
        assert not d.ping() and not (short / "s" / "docker.sock").exists()
        with open("/proc/self/mounts") as f:
            assert str(d.exec_root) not in f.read()   # its netns mount is gone too
    finally:
        d.stop()
        shutil.rmtree(short, ignore_errors=True)


# -- images -------------------------------------------------------------------------------

def test_images_build_once_then_come_from_the_cache(docker_daemon):
    base = images.base_image(docker_daemon)
    engine = images.engine_image(docker_daemon, "0.5.9")
    ids = {t: docker_daemon.inspect_image(t)["Id"] for t in (base, engine)}
    assert images.base_image(docker_daemon) == base           # a cache hit: same tag, same image
    assert images.engine_image(docker_daemon, "0.5.9") == engine
    assert {t: docker_daemon.inspect_image(t)["Id"] for t in (base, engine)} == ids
    assert engine.startswith("fleetpatch-demo/sglang:0.5.9-")


def test_the_engine_image_is_laid_out_as_the_official_one(docker_daemon):
    engine = images.engine_image(docker_daemon, "0.5.9")
    code = ("import sys, json, importlib.metadata as m, importlib.util as u, hashlib, os\n"
            "spec = u.find_spec('sglang')\n"
            "d = m.distribution('sglang')\n"
            f"w = open('{CHECKOUT}/{WORKER}', 'rb').read()\n"
            "site = '/usr/local/lib/python%d.%d/dist-packages' % sys.version_info[:2]\n"
            "print(json.dumps({'origin': spec.origin, 'version': d.version, 'py': sys.version_info[:2],\n"
            "  'direct_url': json.loads(d.read_text('direct_url.json')), 'venv': sys.prefix != sys.base_prefix,\n"
            "  'site': sorted(os.listdir(site)), 'worker': hashlib.sha256(w).hexdigest()}))\n")
    out = docker_daemon.cli("run", "--rm", "--network", "host", engine, "python3", "-c", code).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["origin"] == f"{CHECKOUT}/sglang/__init__.py"
    assert doc["version"] == "0.5.9" and doc["py"] == [3, 13] and doc["venv"] is False
    assert doc["direct_url"] == {"dir_info": {"editable": True}, "url": f"file://{CHECKOUT}"}
    assert {"__editable__.sglang-0.5.9.pth", "__editable___sglang_0_5_9_finder.py",
            "sglang-0.5.9.dist-info", "sglang_standin", "fleetpatch_standin_common"} <= set(doc["site"])
    assert doc["worker"] == _sha((sglang_tree("0.5.9") / WORKER).read_bytes())   # the wheel's bytes


def test_the_standin_as_main_process_imports_the_worker_from_sgl_workspace(docker_daemon):
    engine = images.engine_image(docker_daemon, "0.5.9")
    port = _free_ports(1)[0]
    name = f"fleetpatch-test-verbose-{os.getpid()}"
    docker_daemon.cli("run", "-d", "--name", name, "--network", "host", "-e", "PYTHONVERBOSE=1",
                      engine, *containerhost.server_argv(port, 4, 8))
    try:
        _wait_health(port)
        logs = docker_daemon.cli("logs", "--timestamps", name)
        lines = (logs.stdout + logs.stderr).splitlines()
        assert all(TIMESTAMPED.match(ln) for ln in lines), lines[:3]
        text = "\n".join(lines)
        assert re.search(rf"code object from '?{CHECKOUT}/sglang/srt/speculative/eagle_worker\.py", text)
        assert "The server is fired up and ready to roll!" in text
        assert "site-packages/sglang" not in text
    finally:
        containerhost.remove(docker_daemon, name)


# -- container hosts ----------------------------------------------------------------------

def test_a_container_host_reaches_the_daemon_over_ssh(container_fleet):
    f = container_fleet
    f.clear_commands("c1")
    name = f.hosts["c1"].container_name
    ps = f.ssh("c1", "docker ps --format '{{.Names}} {{.ID}}'")
    assert ps.returncode == 0, ps.stderr
    assert name in ps.stdout.split()
    conf = f.ssh("c1", "docker inspect -f '{{.HostConfig.RestartPolicy.Name}} {{.HostConfig.NetworkMode}}' "
                       + name + "; test -S /var/run/docker.sock && echo socket")
    assert conf.stdout.split() == ["always", "host", "socket"], conf.stderr
    assert len(f.commands("c1")) == 2          # one logged SSH command per call; the fleet's own docker calls are not
    assert _health(f.hosts["c1"].http_port) == 200
    logs = f.docker_cli("logs", "--timestamps", name)
    assert "The server is fired up and ready to roll!" in logs.stdout + logs.stderr
    inv = f.inventory()["hosts"]["c1"]
    assert inv["engine"] == {"container": name, "runtime": "docker", "python": "python3"}
    assert inv["server"]["log"] == "container" and inv["server"]["restart"]["kind"] == "container"


def test_docker_restart_keeps_the_files_written_into_the_container(container_fleet):
    f = container_fleet   # c1 launches the v1 path, which imports eagle_worker.py
    f.reset("c1")
    name, before = f.hosts["c1"].container_name, f.container_id("c1")
    marker = f"print('FLEETPATCH-TEST-MARKER {os.getpid()}', flush=True)"
    edit = f.ssh("c1", f"docker exec -i {name} sh -c 'cat >> {CHECKOUT}/{WORKER}'", input=marker + "\n")
    assert edit.returncode == 0, edit.stderr
    since = f.ssh("c1", "date -u +%Y-%m-%dT%H:%M:%S.%NZ").stdout.strip()
    restart = f.ssh("c1", f"docker restart -t 5 {name}")
    assert restart.returncode == 0, restart.stderr
    f.wait_healthy(["c1"])
    assert f.container_id("c1") == before
    kept = f.ssh("c1", f"docker exec {name} tail -n 1 {CHECKOUT}/{WORKER}")
    assert kept.stdout.strip() == marker
    logs = f.ssh("c1", f"docker logs --timestamps --since {since} {name} 2>&1")
    assert f"FLEETPATCH-TEST-MARKER {os.getpid()}" in logs.stdout   # the stand-in imported the edited worker


def test_recreating_the_container_brings_the_image_files_back_with_a_new_id(container_fleet):
    f = container_fleet
    f.reset("c2")
    name, old = f.hosts["c2"].container_name, f.container_id("c2")
    f.docker_cli("exec", name, "sh", "-c", f"echo '# local edit' >> {CHECKOUT}/{WORKER}")
    (f.hosts["c2"].state_dir / "ledger.json").write_text("{}\n")
    new = f.recreate_container("c2")
    assert new and new != old
    cat = f.ssh("c2", f"docker exec {name} cat {CHECKOUT}/{WORKER}")
    assert _sha(cat.stdout.encode()) == _sha((sglang_tree("0.5.9") / WORKER).read_bytes())
    assert (f.hosts["c2"].state_dir / "ledger.json").read_text() == "{}\n"   # the host keeps its state
    assert _health(f.hosts["c2"].http_port) == 200


def test_a_plain_host_beside_container_hosts_keeps_its_venv(container_fleet):
    f = container_fleet
    assert f.hosts["p1"].python.exists() and not f.hosts["c1"].env_dir.exists()
    assert f.ssh("p1", "test -e /var/run/docker.sock && echo yes || echo no").stdout.strip() == "no"


# -- what is missing where no daemon can be reached ---------------------------------------

def test_no_daemon_says_plainly_what_is_missing(docker_daemon, tmp_path):
    assert docker_unavailable(docker_daemon.sock) is None
    missing = docker_unavailable(str(tmp_path / "none.sock"))
    assert missing.startswith("the Docker daemon is not running: no socket at ")
    dead = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))        # bound, never listening: a daemon that died
    try:
        assert "refuses connections" in docker_unavailable(str(dead))
    finally:
        s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to user nobody and hides /usr/bin/docker: needs root")
def test_no_permission_and_no_docker_command_are_said_plainly(docker_daemon):
    code = f"from fleetpatch_demo.dockerd import docker_unavailable; print(docker_unavailable({docker_daemon.sock!r}))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)}
    as_nobody = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert as_nobody.stdout.strip() == (f"permission denied on the Docker socket {docker_daemon.sock}: "
                                        f"run as root or as a member of the docker group"), as_nobody.stderr
    hidden = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             'mount --bind /dev/null /usr/bin/docker && PATH=/nonexistent exec "$@"', "sh",
                             sys.executable, "-c", code],
                            capture_output=True, text=True, env=env)
    assert hidden.stdout.strip() == "no docker command on this machine: install Docker (apt-get install docker.io)", \
        hidden.stderr


def test_under_ci_a_missing_daemon_fails_instead_of_skipping(tmp_path):
    test = f"{Path(__file__)}::test_the_daemon_answers_with_overlay2_and_is_reused_at_its_socket"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", test]
    env = {**os.environ, "FLEETPATCH_TEST_DOCKER_SOCK": str(tmp_path / "no.sock")}
    env.pop("CI", None)
    local = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout
    assert "needs a Docker daemon" in local.stdout
    ci = subprocess.run(argv, capture_output=True, text=True, env={**env, "CI": "true"}, cwd=tmp_path)
    assert ci.returncode == 1 and "needs a Docker daemon" in ci.stdout, ci.stdout


def test_the_demo_precondition_names_the_daemon_or_says_nothing(docker_daemon, tmp_path):
    assert images.containers_unavailable(docker_daemon.sock) is None
    assert images.containers_unavailable(str(tmp_path / "none.sock")).startswith(
        "the Docker daemon is not running: no socket at ")


def test_the_container_operator_starts_from_fresh_containers(container_operator):
    f = container_operator.fleet
    ids = {n: f.container_id(n) for n in ("c1", "c2")}
    assert all(ids.values()) and f.commands("c1") == [] and f.commands("p1") == []
    hosts = container_operator.inventory()["hosts"]
    assert hosts["c1"]["engine"]["container"] == f.hosts["c1"].container_name and "engine" not in hosts["p1"]
    assert all(f.healthy(n) for n in f.names)
