"""Container hosts of the demo fleet (``HostSpec(..., container=True)``).

Such a host is an sshd host like any other, whose engine runs in a Docker container
instead of a venv on the host, as with the official ``lmsysorg/sglang`` image:

* the container ``sglang-<host>-<fleet id>`` runs the engine image (images.py) with
  ``--restart always --network host``; its main process is the stand-in server,
  started as ``python3 -m sglang_standin --model-path /models/demo ... --port P``,
  whose log is the container's output (``docker logs --timestamps``);
* the host's SSH sessions reach the private daemon at ``/var/run/docker.sock``, as on an
  operator's host: the host's mount namespace has its own ``/run`` (a tmpfs with
  ``sshd/`` and ``lock/``), where ``docker.sock`` links to the daemon's socket
  directory bind-mounted at ``/run/fleetpatch-docker`` (a directory, so a restarted
  daemon's new socket is seen too);
* the host keeps what fleetpatch keeps on a host: ``state/`` and ``home/`` under the
  mount point; it has no ``sglang env``.

The fleet manages the containers straight through the daemon's socket, never over
SSH, so the sshd's commands.log still counts only the operator's commands.
"""
from __future__ import annotations

import hashlib
import os
import time

from .dockerd import LABEL_PREFIX, Dockerd, DockerError

HOST_RUN_DOCKER_DIR = "/run/fleetpatch-docker"   # the daemon's socket directory, in the host
HOST_DOCKER_SOCK = "/run/docker.sock"            # = /var/run/docker.sock
CONTAINER_PYTHON = "python3"
CONTAINER_MODEL = "/models/demo"
STOP_GRACE = 10

# The namespace script of a container host's sshd: $1 host dir, $2 mount point, $3 sshd,
# $4 sshd_config, $5 the daemon's socket directory, $6 a directory in the host's sshd dir
# that holds it while /run is replaced, $7 the socket's name.
SSHD_SCRIPT = (
    'mount --bind "$1" "$2" && mount --bind "$5" "$6"'
    ' && mount -t tmpfs -o mode=0755,size=8m fleetpatch-run /run'
    f' && mkdir -p /run/sshd /run/lock {HOST_RUN_DOCKER_DIR}'
    f' && mount --bind "$6" {HOST_RUN_DOCKER_DIR}'
    f' && ln -s "{HOST_RUN_DOCKER_DIR}/$7" {HOST_DOCKER_SOCK}'
    ' && exec "$3" -D -e -f "$4"'
)


def container_name(fleet_root, host: str, engine: str = "sglang") -> str:
    """``<engine>-<host>-<6 hex of the fleet root>`` (sglang-…, vllm-…): fleets sharing one daemon never collide."""
    return f"{engine}-{host}-{hashlib.sha256(str(fleet_root).encode()).hexdigest()[:6]}"


def sshd_argv(host_dir, mount_point: str, sshd: str, sshd_config, sock: str, holder) -> list[str]:
    """argv (after ``unshare --mount --propagation private``) starting a container host's sshd."""
    sock_dir, sock_name = os.path.split(sock)
    return ["sh", "-c", SSHD_SCRIPT, "sh", str(host_dir), mount_point, sshd, str(sshd_config),
            sock_dir, str(holder), sock_name]


def server_argv(http_port: int, topk: int, num_draft_tokens: int) -> list[str]:
    """The container's command: the stand-in, started as SGLang's launch_server is."""
    return [CONTAINER_PYTHON, "-m", "sglang_standin", "--model-path", CONTAINER_MODEL,
            "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(num_draft_tokens),
            "--port", str(http_port)]


def labels(fleet_root, host: str, owner: str) -> dict:
    return {f"{LABEL_PREFIX}.fleet": str(fleet_root), f"{LABEL_PREFIX}.host": host,
            f"{LABEL_PREFIX}.owner": owner}


def run(docker: Dockerd, name: str, image: str, argv: list[str], env: dict, labels: dict) -> str:
    """``docker run -d`` the engine container (restart always, host network); its id."""
    args = ["run", "-d", "--name", name, "--restart", "always", "--network", "host",
            "--stop-timeout", str(STOP_GRACE)]
    for k, v in sorted(env.items()):
        args += ["-e", f"{k}={v}"]
    for k, v in sorted(labels.items()):
        args += ["--label", f"{k}={v}"]
    out = docker.cli(*args, image, *argv).stdout.strip()
    return out.splitlines()[-1] if out else ""


def state(docker: Dockerd, name: str) -> dict | None:
    """The container's inspect document, or None if there is no such container."""
    return docker.inspect_container(name)


def pid(docker: Dockerd, name: str) -> int | None:
    """Host pid of the container's main process while it runs."""
    try:
        doc = state(docker, name)
    except DockerError:
        return None
    if not doc or not doc["State"].get("Running") or doc["State"].get("Restarting"):
        return None
    return doc["State"].get("Pid") or None


def remove(docker: Dockerd, name: str) -> bool:
    """``docker rm -f``; True if there was one."""
    proc = docker.cli("rm", "-f", name, check=False)
    if proc.returncode == 0:
        return True
    if "No such container" in proc.stderr:
        return False
    raise DockerError(f"docker rm -f {name}: {proc.stderr.strip()}")


def start_existing(docker: Dockerd, name: str) -> bool:
    """``docker start`` a stopped container; False if there is none."""
    doc = state(docker, name)
    if doc is None:
        return False
    if not doc["State"].get("Running"):
        docker.cli("start", name)
    return True


def stop(docker: Dockerd, name: str, grace: float = STOP_GRACE) -> bool:
    """``docker stop -t grace``; True if it was running."""
    was = pid(docker, name) is not None
    if state(docker, name) is not None:
        docker.cli("stop", "-t", str(int(grace)), name, timeout=grace + 60)
    return was


def log_tail(docker: Dockerd, name: str, n: int = 20) -> str:
    proc = docker.cli("logs", "--tail", str(n), name, check=False)
    return (proc.stdout + proc.stderr).rstrip() or "(empty log)"


def prune(docker: Dockerd, fleet_root) -> None:
    """Remove demo containers left by this fleet root or by a test process that died."""
    for c in docker.containers(label=f"{LABEL_PREFIX}.fleet"):
        lab = c.get("Labels") or {}
        owner = lab.get(f"{LABEL_PREFIX}.owner", "")
        dead_owner = owner.isdigit() and not os.path.exists(f"/proc/{owner}")
        if lab.get(f"{LABEL_PREFIX}.fleet") == str(fleet_root) or dead_owner:
            remove(docker, c["Id"])


def wait_running(docker: Dockerd, name: str, timeout: float = 30.0) -> int:
    """Wait until the container's main process runs; its pid."""
    deadline = time.monotonic() + timeout
    while True:
        p = pid(docker, name)
        if p:
            return p
        if time.monotonic() > deadline:
            raise DockerError(f"container {name} is not running after {timeout:.0f}s:\n"
                              f"{log_tail(docker, name)}")
        time.sleep(0.05)
