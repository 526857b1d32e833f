"""Start the real sglang-router on loopback, and stand-in workers as local processes.

The router is PyPI ``sglang-router`` (the ``test`` extra). It starts with no
workers; they are added over its API (fleetpatch.router). Facts about the
binary are in fleetpatch.router's docstring. `LocalWorker` runs the stand-in
(fleetpatch_demo/standins/sglang) from a copied SGLang tree without an sshd host:
for router tests and benchmarks that need many workers quickly.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional, Sequence


def router_command() -> Optional[List[str]]:
    """argv prefix that launches the router, or None when sglang-router is not installed."""
    if importlib.util.find_spec("sglang_router") is not None:
        return [sys.executable, "-m", "sglang_router.launch_router"]
    exe = shutil.which("sglang-router")
    return [exe, "launch"] if exe else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_FLAGS: dict = {}


def _router_flags(cmd: List[str], env: dict) -> str:
    """The --help text of this router (older versions lack some flags)."""
    key = (tuple(cmd), env.get("PYTHONPATH", ""))
    if key not in _FLAGS:
        out = subprocess.run(cmd + ["--help"], env=env, capture_output=True, text=True, timeout=60)
        _FLAGS[key] = out.stdout
    return _FLAGS[key]


class RouterProcess:
    """One sglang-router on 127.0.0.1, started in its own session, stopped on exit.

    `install_dir`: run the sglang_router package found there (pip install --target)
    instead of the installed one - how the tests run older router versions."""

    def __init__(self, log: Path, port: Optional[int] = None, policy: str = "round_robin",
                 worker_urls: Sequence[str] = (), extra: Sequence[str] = (),
                 health_check_interval: Optional[float] = None, install_dir: Optional[Path] = None):
        env = dict(os.environ, NO_COLOR="1", RUST_LOG_STYLE="never")
        if install_dir is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(install_dir)] + [p for p in [env.get("PYTHONPATH")] if p])
            cmd = [sys.executable, "-m", "sglang_router.launch_router"]
        else:
            cmd = router_command()
        if cmd is None:
            raise RuntimeError("sglang-router is not installed (pip install sglang-router; it is in the "
                               "test extra: pip install '.[test]')")
        self.port = port or free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = Path(log)
        argv = cmd + ["--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                      # the metrics port defaults to 29000 on 0.0.0.0: one per router here
                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                      "--log-level", "info"]
        if "--shutdown-grace-period-secs" in _router_flags(cmd, env):
            argv += ["--shutdown-grace-period-secs", "1"]
        if worker_urls:
            argv += ["--worker-urls", *worker_urls]
        if health_check_interval is not None:
            argv += ["--health-check-interval-secs", str(int(health_check_interval))]
        argv += list(extra)
        self.argv = argv
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=self._out, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    def wait_ready(self, timeout: float = 30.0) -> "RouterProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sglang-router exited %s before it answered:\n%s"
                                   % (self.proc.returncode, self.tail()))
            try:
                with urllib.request.urlopen(self.url + "/workers", timeout=1):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers (0.1.x has no GET /workers)
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("sglang-router did not answer HTTP within %g s:\n%s" % (timeout, self.tail()))

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.proc.wait(5)
        self._out.close()

    def __enter__(self) -> "RouterProcess":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def standin_site(dest: Path, version: str = "0.5.9") -> Path:
    """A site dir holding the real SGLang `version` tree and the stand-in (sglang_standin)."""
    from .standinsite import install_sglang_standin, sglang_standin_installed
    from .wheels import sglang_tree
    dest = Path(dest)
    if not sglang_standin_installed(dest):
        shutil.copytree(sglang_tree(version), dest, dirs_exist_ok=True)
        install_sglang_standin(dest)
    return dest


class LocalWorker:
    """One stand-in server on 127.0.0.1:port, started like fleetpatch's launcher starts SGLang."""

    READY = "The server is fired up and ready to roll!"

    def __init__(self, site: Path, log: Path, port: Optional[int] = None, args: Sequence[str] = (),
                 env: Optional[dict] = None):
        self.site, self.log = Path(site), Path(log)
        self.port = port or free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.args = ["--model-path", "/models/standin", "--port", str(self.port), *args]
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SGLANG_", "FLEETPATCH_STANDIN_", "PYTHON"))}
        self.env.update({"FLEETPATCH_STANDIN_STARTUP_DELAY": "0", "PYTHONPATH": str(self.site)})
        self.env.update(env or {})
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self, wait: bool = True, timeout: float = 20.0) -> "LocalWorker":
        self._mark = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "sglang_standin", *self.args], cwd=self.site.parent,
                                         env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.starts += 1
        if wait:
            self.wait_ready(timeout)
        return self

    def text_since_start(self) -> str:
        with open(self.log, "rb") as f:
            f.seek(self._mark)
            return f.read().decode("utf-8", "replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.READY in self.text_since_start():
                return
            if self.proc.poll() is not None:
                raise RuntimeError("stand-in on port %d exited %s:\n%s"
                                   % (self.port, self.proc.returncode, self.text_since_start()[-2000:]))
            time.sleep(0.02)
        raise RuntimeError("stand-in on port %d not ready within %g s" % (self.port, timeout))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 10.0) -> Optional[int]:
        """What fleetpatch's command restart does: SIGTERM, SIGKILL after `grace` s."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.wait_exit(grace)
        if rc is None:
            self.proc.kill()
            rc = self.proc.wait(5)
        return rc


def router_install(version: str) -> Path:
    """sglang-router `version` from its PyPI wheel, unpacked once into the cache (pip install --target).

    For running older routers (0.1.x and 0.2.x APIs) next to the installed one."""
    from fleetpatch.engines import sglang_wheel

    from fleetpatch.cacheroot import cache_root
    dest = cache_root() / "router" / version
    if (dest / ".complete").exists():
        return dest
    wheels = cache_root() / "router-wheels"
    found = sorted(wheels.glob("sglang_router-%s-*.whl" % version)) or [
        sglang_wheel.pip_download("sglang-router==%s" % version, "sglang_router-%s-*.whl" % version, wheels)]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    tmp = dest.with_name(dest.name + ".tmp%d" % os.getpid())
    done = subprocess.run(pip + ["install", "--no-deps", "--target", str(tmp), str(found[0])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError("could not unpack %s: %s" % (found[0].name, (done.stderr or done.stdout).strip()))
    (tmp / ".complete").write_text(found[0].name + "\n")
    try:
        tmp.rename(dest)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
