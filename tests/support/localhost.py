"""A host that is a directory on this machine, reached by the local transport.

The host's engine python is a venv (no pip) whose site-packages hold the real
SGLang files from the PyPI wheel and the stand-in server; its restart is a
`command` start of that stand-in on a free loopback port. The agent runs as a
local subprocess through the same bootstrap as over SSH, so `steps` runs
exactly as in production, minus sshd. A deploy verifies in well under a second.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from fleetpatch import steps
from fleetpatch.agent.procs import began_after, proc_stat
from fleetpatch_demo.standinsite import install_sglang_standin
from fleetpatch_demo.wheels import sglang_tree
from fleetpatch.engines import sglang
from fleetpatch.inventory import parse_inventory
from fleetpatch.patchset import load_patch, search_dirs
from fleetpatch.transport_local import LocalTransport
from support.paths import FIXTURE_PATCHES, REPO, sha256
from support.ports import free_port
from support.standin_env import QUICK_STOP

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"

EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"


def speculative_tree(folder: Path) -> dict:
    """Every file of a package's speculative folder: sha256, mode, owner (bytecode aside)."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            st = p.lstat()
            out[str(p.relative_to(folder))] = (sha256(p), st.st_mode & 0o7777, st.st_uid, st.st_gid)
    return out


def template_env(root: Path, python: str = sys.executable) -> Path:
    """A venv of `python` without pip, made once per session and copied per host (symlinks kept)."""
    env = root / "template-env"
    if not env.exists():
        subprocess.run([python, "-m", "venv", "--without-pip", str(env)], check=True)
    return env


class LocalHost:
    """One host tree under `root`: env/, logs/, run/, state/, models/demo/."""

    def __init__(self, root: Path, template: Path, name: str = "h1", version: str = "0.5.9",
                 spec_v2: bool = False):
        self.root, self.name, self.version, self.spec_v2 = root, name, version, spec_v2
        self.env = root / "env"
        shutil.copytree(template, self.env, symlinks=True)
        self.site = next((self.env / "lib").glob("python3.*")) / "site-packages"   # the venv's Python
        shutil.copytree(sglang_tree(version), self.site, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".complete", "__pycache__"))
        for p in self.site.rglob("*"):
            p.chmod(p.stat().st_mode | 0o200)
        install_sglang_standin(self.site)
        for sub in ("logs", "run", "state", "models/demo"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.engine_python: Path | None = None   # another interpreter (a wrapper) as engine.python
        self.pristine = {rel: sha256(self.site / rel) for rel in (EAGLE, EAGLE_V2)}

    # -- paths -------------------------------------------------------------
    @property
    def python(self) -> Path:
        return self.env / "bin" / "python"

    @property
    def log(self) -> Path:
        return self.root / "logs" / "sglang.log"

    @property
    def pidfile(self) -> Path:
        return self.root / "run" / "sglang.pid"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def lock(self) -> Path:
        return self.state / "lock"

    def file(self, rel: str) -> Path:
        return self.site / rel

    def ledger(self) -> dict:
        path = self.state / "ledger.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def is_pristine(self) -> bool:
        return all(sha256(self.file(rel)) == sha for rel, sha in self.pristine.items())

    # -- inventory ---------------------------------------------------------
    def inventory(self, **restart) -> dict:
        topk = 1 if self.spec_v2 else 4
        env = {"FLEETPATCH_STANDIN_STARTUP_DELAY": "0", **QUICK_STOP}   # a test's own env= replaces it
        if self.spec_v2:
            env["SGLANG_ENABLE_SPEC_V2"] = "True"
        start = ("{python} -m sglang_standin --model-path " + str(self.root / "models/demo")
                 + " --speculative-algorithm EAGLE3 --speculative-num-steps 3"
                 + f" --speculative-eagle-topk {topk} --speculative-num-draft-tokens {2 * topk if topk > 1 else 4}"
                 + f" --port {self.port}")
        rs = {"kind": "command", "start": start, "env": env, "workdir": str(self.root),
              "pidfile": str(self.pidfile), "stop_grace": 5}
        rs.update(restart)
        return {"hosts": {self.name: {
            "address": "127.0.0.1",
            "engine": {"kind": "sglang", "python": str(self.engine_python or self.python), "state_dir": str(self.state)},
            "server": {"log": str(self.log), "health_url": f"http://127.0.0.1:{self.port}/health",
                       "ready_timeout": 20, "restart": rs},
        }}}

    def host(self, **restart):
        inv = parse_inventory(yaml.safe_dump(self.inventory(**restart)), file=str(self.root / "hosts.yaml"))
        return inv.hosts[self.name]

    # -- server ------------------------------------------------------------
    def server_pid(self) -> int | None:
        """The pidfile's live process; not one that began after the pidfile was written (the
        server ended and the pid went to another process: stop() must not kill -9 it)."""
        try:
            pid = int(self.pidfile.read_text().split()[0])
            written = self.pidfile.stat().st_mtime
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        stat = proc_stat(pid)
        return None if stat is None or began_after(stat, written) else pid

    def stop(self) -> None:
        pid = self.server_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                            break
                except OSError:
                    break
                time.sleep(0.01)


def job(lh: LocalHost, patch: str | None = "spec-path-beacon", host=None, **kw) -> tuple[steps.Job, object]:
    """A Job like the CLI builds, on the local transport, with a short settle time."""
    host = host or lh.host()
    dirs = search_dirs(str(FIXTURE_PATCHES), REPO)
    patch_obj, rev = load_patch(patch, dirs, sglang.PROFILE) if patch else (None, None)
    kw.setdefault("timeout", 20)
    kw.setdefault("settle_s", 0.3)
    j = steps.Job(hosts_by_name={host.name: host}, patch=patch_obj, rev=rev, patch_dirs=dirs,
                  transport=lambda h: LocalTransport(h.name), **kw)
    return j, host
