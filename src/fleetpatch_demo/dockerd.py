"""A private Docker daemon for the tests and ``fleetpatch demo --containers``.

``Dockerd(sock).start()`` runs Debian's ``dockerd`` (docker.io 20.10) on its own
socket, data root and exec root, with ``--iptables=false --bridge=none
--storage-driver=overlay2``: these machines have cgroups v1 and no bridge netfilter,
so every container runs with ``--network host``.  A daemon that already answers at
the socket is reused (and left running by ``stop()``); one this process started is
stopped at exit, on SIGTERM, or by ``stop()``.

The CLI is always ``/usr/bin/docker -H unix://SOCK``: another ``docker`` may come
first on PATH.  Small reads (ping, inspect, list) go straight to the daemon's HTTP
API over the socket, without a subprocess.

``docker_unavailable()`` says in one line what is missing when no daemon can be
reached (no docker command, daemon not running, permission denied), or None.

Command line (``.ci/run`` uses it)::

    python3 -m fleetpatch_demo.dockerd start [--sock S] [--root R]   # detached; prints the socket
    python3 -m fleetpatch_demo.dockerd stop  [--sock S] [--root R]
    python3 -m fleetpatch_demo.dockerd check [--sock S]               # exit 1 with the reason
"""
from __future__ import annotations

import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from fleetpatch.agent.procs import proc_stat

DOCKER_CLI = "/usr/bin/docker"
DOCKERD_CANDIDATES = ("/usr/sbin/dockerd", "/usr/bin/dockerd")
SOCK_ENV = "FLEETPATCH_TEST_DOCKER_SOCK"
DEFAULT_SOCK = "/run/fleetpatch-test/docker/docker.sock"
DEFAULT_ROOT = "/var/cache/fleetpatch-test/dockerd"
SYSTEM_SOCK = "/var/run/docker.sock"
DAEMON_FLAGS = ("--iptables=false", "--bridge=none", "--storage-driver=overlay2")
LABEL_PREFIX = "fleetpatch.demo"


class DockerError(RuntimeError):
    """The Docker daemon could not be started, reached or driven."""


def dockerd_binary() -> str | None:
    for path in DOCKERD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("dockerd")


def docker_binary() -> str | None:
    """The Docker CLI to run: Debian's /usr/bin/docker, else the first on PATH."""
    return DOCKER_CLI if os.access(DOCKER_CLI, os.X_OK) else shutil.which("docker")


def sock_from_env() -> str:
    """The socket a caller means: FLEETPATCH_TEST_DOCKER_SOCK, else DOCKER_HOST (unix://), else
    the system's /var/run/docker.sock."""
    sock = os.environ.get(SOCK_ENV)
    if sock:
        return sock
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return host[len("unix://"):]
    return SYSTEM_SOCK


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, sock_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.sock_path = sock_path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.sock_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def api_get(sock: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET `path` from the daemon's HTTP API at unix socket `sock`: (status, body).
    OSError (FileNotFoundError, PermissionError, ConnectionRefusedError, ...) as raised."""
    conn = _UnixHTTPConnection(sock, timeout)
    try:
        conn.request("GET", path, headers={"Host": "docker"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def docker_unavailable(sock: str | None = None) -> str | None:
    """None when a Docker daemon answers at `sock` (default: sock_from_env()) and a docker
    command exists; else one plain line saying what is missing and what to do."""
    sock = sock or sock_from_env()
    if docker_binary() is None:
        return "no docker command on this machine: install Docker (apt-get install docker.io)"
    if not os.path.exists(sock):
        return (f"the Docker daemon is not running: no socket at {sock} "
                f"(start it: systemctl start docker, or dockerd)")
    try:
        status, body = api_get(sock, "/_ping", timeout=5.0)
    except PermissionError:
        return (f"permission denied on the Docker socket {sock}: run as root or as a member "
                f"of the docker group")
    except ConnectionRefusedError:
        return (f"the Docker daemon is not running: {sock} refuses connections "
                f"(start it: systemctl start docker, or dockerd)")
    except (OSError, http.client.HTTPException) as e:
        return f"the Docker daemon at {sock} does not answer: {e}"
    if status != 200 or body.strip() != b"OK":
        return f"the Docker daemon at {sock} answers /_ping with {status}: {body[:80]!r}"
    return None


class Dockerd:
    """A Docker daemon at unix socket `sock`, with its files under `root` (data/, exec/,
    dockerd.pid, dockerd.log) when this process starts it."""

    def __init__(self, sock: str = DEFAULT_SOCK, root: str | os.PathLike = DEFAULT_ROOT):
        self.sock = str(sock)
        self.root = Path(root)
        self.owned = False          # True: this process started it and stops it
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Dockerd(sock={self.sock!r}, owned={self.owned})"

    # -- paths
    @property
    def data_root(self) -> Path:
        return self.root / "data"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def pidfile(self) -> Path:
        return self.root / "dockerd.pid"

    @property
    def log_path(self) -> Path:
        return self.root / "dockerd.log"

    # -- talking to it
    def ping(self) -> bool:
        try:
            status, body = api_get(self.sock, "/_ping", timeout=3.0)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and body.strip() == b"OK"

    def get_json(self, path: str, timeout: float = 30.0):
        """GET an API path; the decoded JSON, or None for 404."""
        try:
            status, body = api_get(self.sock, path, timeout=timeout)
        except (OSError, http.client.HTTPException) as e:
            raise DockerError(f"Docker daemon at {self.sock}: GET {path}: {e}") from e
        if status == 404:
            return None
        if status != 200:
            raise DockerError(f"Docker daemon at {self.sock}: GET {path}: {status} {body[:200]!r}")
        return json.loads(body)

    def inspect_container(self, name_or_id: str) -> dict | None:
        return self.get_json(f"/containers/{urllib.parse.quote(name_or_id, safe='')}/json")

    def inspect_image(self, ref: str) -> dict | None:
        return self.get_json(f"/images/{urllib.parse.quote(ref, safe='')}/json")

    def containers(self, label: str | None = None) -> list[dict]:
        """Every container (running or not), optionally only those carrying `label` (k or k=v)."""
        query = "all=1"
        if label:
            query += "&filters=" + urllib.parse.quote(json.dumps({"label": [label]}))
        return self.get_json(f"/containers/json?{query}") or []

    def cli_argv(self, *args: str) -> list[str]:
        return [DOCKER_CLI, "-H", f"unix://{self.sock}", *args]

    def cli(self, *args: str, input: str | bytes | None = None, timeout: float = 300,
            check: bool = True, text: bool = True) -> subprocess.CompletedProcess:
        """Run the docker CLI against this daemon; DockerError with its stderr if check and it fails."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        env["DOCKER_BUILDKIT"] = "0"   # the classic builder: offline, no buildx plugin needed
        proc = subprocess.run(self.cli_argv(*args), input=input, capture_output=True, text=text,
                              timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL if input is None else None)
        if check and proc.returncode != 0:
            err = proc.stderr if text else proc.stderr.decode(errors="replace")
            raise DockerError(f"docker {' '.join(args[:3])}: exit {proc.returncode}: {err.strip()[-600:]}")
        return proc

    # -- start / stop
    def start(self, timeout: float = 60.0, detach: bool = False) -> "Dockerd":
        """Reuse a daemon that answers at the socket, else start one; wait until it answers.
        detach=True: it outlives this process (``stop()`` from another one stops it)."""
        with self._lock:
            if self.ping():
                return self
            binary = dockerd_binary()
            if binary is None:
                raise DockerError("dockerd not found: install Docker (apt-get install docker.io)")
            if os.geteuid() != 0:
                raise DockerError("a private dockerd needs root")
            self._clear_stale()
            for d in (self.data_root, self.exec_root, Path(self.sock).parent):
                d.mkdir(parents=True, exist_ok=True)
            argv = [binary, "-H", f"unix://{self.sock}", "--data-root", str(self.data_root),
                    "--exec-root", str(self.exec_root), "--pidfile", str(self.pidfile), *DAEMON_FLAGS]
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True, close_fds=True)
            self.owned = True
            if not detach:
                atexit.register(self.stop)
                _stop_on_sigterm()
            self._wait_up(timeout)
            return self

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self._proc.poll() is not None:
                self.owned = False
                raise DockerError(f"dockerd exited ({self._proc.returncode}) before it answered: "
                                  f"{self._last_error()}")
            if time.monotonic() > deadline:
                self.stop()
                raise DockerError(f"dockerd did not answer at {self.sock} within {timeout:.0f}s: "
                                  f"{self._last_error()}")
            time.sleep(0.1)

    def _last_error(self) -> str:
        """The last error line of dockerd's log (one line), for a start that failed."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        errors = [ln for ln in lines[-200:] if "level=error" in ln or "level=fatal" in ln or "failed" in ln]
        line = (errors or lines[-1:] or ["(empty log)"])[-1]
        return f"{line.strip()[-300:]} (log: {self.log_path})"

    def _daemon_pid(self) -> int | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return None
        return pid if os.path.basename(exe).startswith("dockerd") else None

    def _clear_stale(self) -> None:
        """A dead daemon's socket and leftover mounts (netns/default) under its exec root."""
        if self._daemon_pid() is None:
            _unmount_under(self.exec_root)
            for stale in (Path(self.sock), self.pidfile):
                try:
                    stale.unlink()
                except FileNotFoundError:
                    pass

    def stop(self, timeout: float = 40.0, force: bool = False) -> bool:
        """Stop the daemon if this process started it (or force, e.g. from ``.ci/run``'s trap):
        SIGTERM (it stops its containers), wait, SIGKILL; unmount what it left.  True if stopped."""
        with self._lock:
            if not (self.owned or force):
                return False
            pid = self._daemon_pid()
            self.owned = False
            if pid is None:
                return False
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                if _wait_gone(pid, self._proc, wait):
                    break
            _unmount_under(self.exec_root)
            return True


def _wait_gone(pid: int, proc: subprocess.Popen | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.pid == pid:
            if proc.poll() is not None:
                return True
        elif not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def _unmount_under(path: Path) -> None:
    """Lazily unmount every mount point under `path` (deepest first)."""
    prefix = str(path).rstrip("/") + "/"
    try:
        with open("/proc/self/mounts") as f:
            points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _stop_on_sigterm() -> None:
    """SIGTERM runs the atexit handlers (which stop the daemon) instead of killing at once,
    where nobody else has claimed the signal."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python3 -m fleetpatch_demo.dockerd",
                                 description="a private Docker daemon for fleetpatch's tests")
    ap.add_argument("action", choices=("start", "stop", "check"))
    ap.add_argument("--sock", default=os.environ.get(SOCK_ENV) or DEFAULT_SOCK)
    ap.add_argument("--root", default=DEFAULT_ROOT)
    a = ap.parse_args(argv)
    d = Dockerd(a.sock, a.root)
    if a.action == "check":
        reason = docker_unavailable(a.sock)
        print(reason or f"Docker daemon answers at {a.sock}")
        return 1 if reason else 0
    if a.action == "stop":
        print(f"dockerd at {a.sock}: {'stopped' if d.stop(force=True) else 'was not running'}")
        return 0
    try:
        t = time.monotonic()
        reused = d.ping()
        d.start(detach=True)
    except DockerError as e:
        print(f"dockerd: {e}", file=sys.stderr)
        return 1
    how = "reused" if reused else f"started in {time.monotonic() - t:.1f}s"
    print(f"dockerd at {a.sock}: {how}", file=sys.stderr)
    print(a.sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
