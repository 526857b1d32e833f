"""A local fleet of real OpenSSH ``sshd`` "hosts", for the tests and ``fleetpatch demo``.

Every host is a real ``/usr/sbin/sshd`` on ``127.0.0.1:<port>`` with its own
ed25519 host key and key-only authentication, running in its own mount
namespace in which the host's directory is bind-mounted at ``mount_point``.
So every host has its own SGLang tree at the same absolute path, as a real
fleet would, and everything started over SSH inherits that view.

Layout of a host, as the host sees it (``mount_point``, default
``/srv/fleetpatch-host``)::

    sglang env/bin/python                      # a venv: pyvenv.cfg, python linked to this Python
    sglang env/lib/pythonX.Y/site-packages/    # sglang/ + dist-info (copied from the real wheel)
                                   sglang_standin/ fleetpatch_standin_common/   # the stand-in (standinsite.py)
    (a vLLM host, HostSpec(engine="vllm"): "vllm env/", its site-packages holding vllm/ from the
     wheel's members and vllm_standin/; logs/vllm.log, run/vllm.pid; models/demo*/config.json;
     see vllm_hosts.py)
    logs/sglang.log   run/sglang.pid   state/   home/   models/demo/
    etc/supervisord.conf   run/supervisor.sock   run/supervisord.pid   # restart_kind="supervisor"

On this machine it lives under ``<root>/hosts/<name>/fs`` (``FleetHost.host_dir``);
sshd's own files (config, host key, ``commands.log``) under
``<root>/hosts/<name>/sshd``.  Each SSH command is appended to
``commands.log`` by a ``ForceCommand`` wrapper, so the benchmark can count
remote round trips on the sshd side.

A host with ``HostSpec(..., restart_kind="supervisor")`` has its stand-in managed by a
real ``supervisord`` (the ``supervisor`` package from PyPI, run by this Python inside the
host's namespace): program ``sglang`` with the same command, environment and workdir,
``stdout_logfile`` = logs/sglang.log; its inventory entry says
``restart: {kind: supervisor, program: sglang, config: <mount_point>/etc/supervisord.conf}``.
``supervisorctl`` is not on the SSH session's PATH here, so the host agent runs it as
``<engine python> -m supervisor.supervisorctl``.

A host with ``HostSpec(..., servers=N)`` (N > 1) runs N stand-in servers from its one
SGLang tree, s0 ... on their own HTTP ports, logs (logs/s0.log ...) and pidfiles
(run/s0.pid ...); its inventory entry is the ``servers:`` form (each server's url, health_url,
log and restart; the shared restart env under ``server:``).  ``start_server``,
``stop_server``, ``server_pid``, ``healthy`` and ``server_log_tail`` take ``server=``
(default: every server; server_pid and the log: the first).

Typical use::

    with Fleet(tmp_path, [HostSpec("a"), HostSpec("b", spec_v2=True)]) as fleet:
        fleet.write_inventory(tmp_path / "hosts.yaml")
        ...

Needs root (mount namespaces, bind mounts), ``unshare``, ``nsenter``,
``ssh-keygen`` and ``/usr/sbin/sshd``.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from fleetpatch.agent.procs import proc_stat

from . import containerhost, vllm_hosts
from .dockerd import Dockerd, DockerError, docker_unavailable, sock_from_env
from .standinsite import SGLANG_SOURCE, install_sglang_standin, sglang_standin_available, sglang_standin_installed
from .wheels import sglang_tree

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
DEFAULT_MOUNT_POINT = "/srv/fleetpatch-host"
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOKEN_FILE = ".fleetpatch-fleet-host"
STATE_FILE = "fleet.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RESTART_KINDS = ("command", "supervisor")
ENGINES = ("sglang", "vllm")
SUPERVISOR_PROGRAM = "sglang"   # an SGLang host's program; a vLLM host's is "vllm" (its engine's name)


class FleetError(RuntimeError):
    """The local fleet could not be started or driven."""


@dataclass
class HostSpec:
    """What one demo host is."""

    name: str
    version: str = "0.5.9"            # the engine's version of its tree (SGLang's, or vLLM's: see vllm_hosts.py)
    engine: str = "sglang"            # "sglang", or "vllm": the real files of a vLLM release and its stand-in
    spec_v2: bool = False             # True: SGLANG_ENABLE_SPEC_V2=True and --speculative-eagle-topk 1
    startup_delay: float = 0.2        # FLEETPATCH_STANDIN_STARTUP_DELAY for its stand-in server
    env: dict = field(default_factory=dict)   # extra server environment
    session_env: dict = field(default_factory=dict)   # sshd's SetEnv: every SSH session's (so a command restart's)
    start_server: bool = True         # start its stand-in server in start() / reset()
    restart_kind: str = "command"     # "command", or "supervisor": supervisord runs the stand-in
    container: bool = False           # True: the engine runs in a Docker container (containerhost.py)
    args: tuple = ()                  # extra launch flags, e.g. ("--disable-overlap-schedule",)
    servers: int = 1                  # > 1: servers s0, s1, ... on their own ports, logs and pidfiles, one tree
    node_group: str | None = None     # one multi-node server: its hosts, in spec order, are ranks 0, 1, ...
    method: str = vllm_hosts.DEFAULT_METHOD   # vLLM hosts: the --speculative-config method
    architecture: str = vllm_hosts.MODEL_ARCHITECTURE   # vLLM hosts: the model's config.json architectures
    entrypoint: str = "serve"         # vLLM hosts: "serve", or "api_server" (-m vllm.entrypoints.openai.api_server)

    @property
    def topk(self) -> int:
        return 1 if self.spec_v2 else 4

    @property
    def num_draft_tokens(self) -> int:
        return 4 if self.spec_v2 else 8   # topk 1 needs num_steps + 1


@dataclass
class FleetHost:
    """One running host.  Paths are real paths on this machine unless named remote_*."""

    name: str
    spec: HostSpec
    ssh_port: int
    http_port: int
    dir: Path                 # <root>/hosts/<name>
    host_dir: Path            # the real directory the host sees at mount_point
    sshd_dir: Path            # sshd_config, host key, sshd.log, commands.log, force-command
    mount_point: str
    python_dir: str           # "pythonX.Y"
    token: str = ""
    sshd_pid: int | None = None
    ns_ino: int | None = None  # inode of its mount namespace
    container_name: str = ""   # container hosts: the engine's container
    http_ports: list = field(default_factory=list)  # one per server; http_port is the first
    node_rank: int = 0         # a node group's host: its --node-rank
    nnodes: int = 1            # and its group's --nnodes
    dist_port: int = 0         # the rendezvous port on rank 0 (--dist-init-addr)

    # -- its servers: [None] (the one-server form: logs/sglang.log, run/sglang.pid), or
    #    s0, s1, ... (spec.servers > 1: logs/s0.log, run/s0.pid, each on its own port)
    @property
    def server_names(self) -> list:
        return [None] if self.spec.servers <= 1 else [f"s{i}" for i in range(self.spec.servers)]

    def _server(self, server):
        if server is None:
            return self.server_names[0]
        if server not in self.server_names:
            raise FleetError(f"{self.name} has no server {server!r} (it has {self.server_names})")
        return server

    def port_of(self, server=None) -> int:
        return (self.http_ports or [self.http_port])[self.server_names.index(self._server(server))]

    def log_of(self, server=None) -> Path:
        return self.host_dir / "logs" / f"{self._server(server) or self.spec.engine}.log"

    def pidfile_of(self, server=None) -> Path:
        return self.host_dir / "run" / f"{self._server(server) or self.spec.engine}.pid"

    def remote_of(self, path: Path) -> str:
        """A path under host_dir as the host sees it."""
        return f"{self.mount_point}/{path.relative_to(self.host_dir)}"

    def worker_url(self, server=None) -> str:
        """The server as a router lists it (the inventory's server.url)."""
        return f"http://127.0.0.1:{self.port_of(server)}"

    def health_url_of(self, server=None) -> str:
        return self.worker_url(server) + "/health"

    # -- real paths on this machine
    @property
    def vllm(self) -> bool:
        return self.spec.engine == "vllm"

    @property
    def env_name(self) -> str:
        """The venv's folder under the mount point: "sglang env" or "vllm env" (a space, as paths
        on real hosts have)."""
        return f"{self.spec.engine} env"

    @property
    def env_dir(self) -> Path:
        return self.host_dir / self.env_name

    @property
    def python(self) -> Path:
        return self.env_dir / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return self.env_dir / "lib" / self.python_dir / "site-packages"

    @property
    def package_dir(self) -> Path:
        """The engine package in its site-packages (a plain host's): ``sglang/`` or ``vllm/``."""
        return self.site_packages / self.spec.engine

    @property
    def standin_installed(self) -> bool:
        if self.vllm:
            return (self.site_packages / vllm_hosts.STANDIN_MODULE / "__init__.py").is_file()
        return sglang_standin_installed(self.site_packages)

    @property
    def supervisor_program(self) -> str:
        return SUPERVISOR_PROGRAM if not self.vllm else self.spec.engine

    @property
    def log_path(self) -> Path:
        return self.log_of()

    @property
    def pidfile(self) -> Path:
        return self.pidfile_of()

    @property
    def state_dir(self) -> Path:
        return self.host_dir / "state"

    @property
    def home(self) -> Path:
        return self.host_dir / "home"

    @property
    def commands_log(self) -> Path:
        return self.sshd_dir / "commands.log"

    @property
    def sshd_config(self) -> Path:
        return self.sshd_dir / "sshd_config"

    @property
    def sshd_log(self) -> Path:
        return self.sshd_dir / "sshd.log"

    @property
    def host_key(self) -> Path:
        return self.sshd_dir / "ssh_host_ed25519_key"

    @property
    def force_command(self) -> Path:
        return self.sshd_dir / "force-command.sh"

    # -- paths as the host sees them
    @property
    def remote_python(self) -> str:
        return f"{self.mount_point}/{self.env_name}/bin/python"

    @property
    def remote_site_packages(self) -> str:
        return f"{self.mount_point}/{self.env_name}/lib/{self.python_dir}/site-packages"

    @property
    def remote_log(self) -> str:
        return self.remote_of(self.log_of())

    @property
    def remote_pidfile(self) -> str:
        return self.remote_of(self.pidfile_of())

    @property
    def remote_state_dir(self) -> str:
        return f"{self.mount_point}/state"

    @property
    def remote_home(self) -> str:
        return f"{self.mount_point}/home"

    # -- container hosts (spec.container)
    @property
    def containerized(self) -> bool:
        return self.spec.container

    @property
    def container_argv(self) -> list[str]:
        """The engine container's command (what an operator's compose file says)."""
        if self.vllm:   # what follows the image's entrypoint, as with vllm/vllm-openai
            return vllm_hosts.serve_args("/", self.http_port, self.spec.method, self.spec.args)
        return (containerhost.server_argv(self.http_port, self.spec.topk, self.spec.num_draft_tokens)
                + [str(a) for a in self.spec.args])

    @property
    def docker_sock_holder(self) -> Path:
        return self.sshd_dir / "docker-sock-dir"

    # -- supervisor hosts (restart_kind="supervisor")
    @property
    def supervised(self) -> bool:
        return self.spec.restart_kind == "supervisor"

    @property
    def supervisord_conf(self) -> Path:
        return self.host_dir / "etc" / "supervisord.conf"

    @property
    def supervisord_pidfile(self) -> Path:
        return self.host_dir / "run" / "supervisord.pid"

    @property
    def supervisord_log(self) -> Path:
        return self.host_dir / "logs" / "supervisord.log"

    @property
    def remote_supervisord_conf(self) -> str:
        return f"{self.mount_point}/etc/supervisord.conf"

    @property
    def remote_supervisor_sock(self) -> str:
        return f"{self.mount_point}/run/supervisor.sock"

    def supervisord_conf_text(self) -> str:
        """supervisord.conf running this host's stand-in as program ``sglang`` (``vllm``): the inventory's
        start command (``{python}`` expanded), environment and workdir, output to the server log."""
        mp = self.mount_point
        argv = [tok.replace("{python}", self.remote_python) for tok in shlex.split(self.start_command)]
        env = ",".join(f"{k}={_supervisor_quote(v)}" for k, v in sorted(self.server_env.items()))
        lines = [
            f"; fleetpatch demo fleet host {self.name}: supervisord manages the stand-in server",
            "[unix_http_server]",
            f"file = {_supervisor_value(self.remote_supervisor_sock)}",
            "chmod = 0700",
            "",
            "[supervisord]",
            "nodaemon = true",
            f"logfile = {_supervisor_value(mp + '/logs/supervisord.log')}",
            f"pidfile = {_supervisor_value(mp + '/run/supervisord.pid')}",
            f"childlogdir = {_supervisor_value(mp + '/run')}",
            f"directory = {_supervisor_value(mp)}",
            "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "",
            "[supervisorctl]",
            f"serverurl = unix://{_supervisor_value(self.remote_supervisor_sock)}",
            "",
            f"[program:{self.supervisor_program}]",
            f"command = {_supervisor_value(shlex.join(argv))}",
            f"environment = {env}",
            f"directory = {_supervisor_value(mp)}",
            f"stdout_logfile = {_supervisor_value(self.remote_log)}",
            "redirect_stderr = true",
            "autostart = true",
            "autorestart = false",
            "startsecs = 1",
            "startretries = 0",   # a start that fails is reported once, not retried behind our back
            "stopsignal = TERM",
            "stopwaitsecs = 10",
            "",
        ]
        return "\n".join(lines)

    @property
    def health_url(self) -> str:
        return self.health_url_of()

    @property
    def start_command(self) -> str:
        """The inventory's ``server.restart.start`` for this host (``{python}`` unexpanded)."""
        return self.start_command_of()

    def start_command_of(self, server=None) -> str:
        """The start command of one of its servers: the same launch on that server's port."""
        if self.vllm:
            return vllm_hosts.start_command(self.port_of(server), self.mount_point, self.spec.method, self.spec.args,
                                            self.spec.entrypoint)
        return (
            "{python} -m sglang_standin"
            f" --model-path {shlex.quote(self.mount_point + '/models/demo')}"
            " --speculative-algorithm EAGLE3"
            # SGLang asserts that num-steps / eagle-topk / num-draft-tokens are given together
            f" --speculative-num-steps 3 --speculative-eagle-topk {self.spec.topk}"
            f" --speculative-num-draft-tokens {self.spec.num_draft_tokens}"
            f" --port {self.port_of(server)}"
            + (f" --tp-size {self.nnodes} --nnodes {self.nnodes} --node-rank {self.node_rank}"
               f" --dist-init-addr 127.0.0.1:{self.dist_port}" if self.nnodes > 1 else "")
            + "".join(" " + shlex.quote(str(a)) for a in self.spec.args)
        )

    @property
    def server_env(self) -> dict:
        """The inventory's ``server.restart.env`` for this host."""
        env = {"FLEETPATCH_STANDIN_STARTUP_DELAY": str(self.spec.startup_delay)}
        env.update({str(k): str(v) for k, v in self.spec.env.items()})
        if self.spec.spec_v2:
            env["SGLANG_ENABLE_SPEC_V2"] = "True"
        return env


# ---------------------------------------------------------------------------
# small helpers


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _listening_ports() -> dict[int, str]:
    """{port: socket inode} of TCP sockets listening on 127.0.0.1 or 0.0.0.0 (from
    /proc/net/tcp: no probe connection, which sshd would log)."""
    ports = {}
    try:
        with open("/proc/net/tcp") as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) > 3 and parts[3] == "0A":
                    addr, _, port = parts[1].partition(":")
                    if addr in ("0100007F", "00000000"):
                        ports[int(port, 16)] = parts[9]
    except OSError:
        pass
    return ports


def _owns_socket(pid: int, inode: str) -> bool:
    target = f"socket:[{inode}]"
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
            except OSError:
                pass
    except OSError:
        pass
    return False


def _ns_ino(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _sshd_config_quote(value: str) -> str:
    if any(c in value for c in '"\n\r'):
        raise FleetError(f"path not usable in sshd_config: {value!r}")
    return f'"{value}"'


def _supervisor_value(value: str) -> str:
    """A value for supervisord.conf: % is its expansion character; no newline, no inline comment."""
    if "\n" in value or "\r" in value or " ;" in value or " #" in value or "\t;" in value:
        raise FleetError(f"value not usable in supervisord.conf: {value!r}")
    return value.replace("%", "%%")


def _supervisor_quote(value: str) -> str:
    """One value of supervisord's environment= list (a posix shlex word)."""
    return _supervisor_value('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')


def _tree(engine: str, version: str) -> Path:
    """The release's real files: SGLang's wheel tree, or vLLM's wheel members (vllm_hosts.py)."""
    return vllm_hosts.vllm_tree(version) if engine == "vllm" else sglang_tree(version)


def _image_key(engine: str, version: str) -> str:
    return f"{engine}=={version}"


def _key(name: str, server: str | None) -> str:
    """A server's key in Fleet._servers: the host's name, and the server's after a colon."""
    return name if server is None else f"{name}:{server}"


def _answers(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _children(pid: int) -> list[int]:
    """Live child pids of `pid`."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        kids = []
        for p in _pids():
            stat = proc_stat(p)
            if stat is not None and stat.ppid == pid:
                kids.append(p)
    return [k for k in kids if _alive(k)]


def _make_writable(path: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and not st.st_mode & stat.S_IWUSR:
                os.chmod(p, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)


def _empty_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), s)


# The ForceCommand wrapper.  sshd runs it as `<root's shell> -c <path>`; it logs the
# command (timestamp, then the command with \ -> \\, newline -> \n, CR -> \r) under an
# flock so concurrent sessions never interleave, then execs it unchanged: stdin,
# stdout, stderr and the exit status are the command's own.
FORCE_COMMAND = r"""#!/bin/sh
# fleetpatch demo fleet: record each SSH command, then run it unchanged.
if [ "${SSH_ORIGINAL_COMMAND+set}" = set ]; then
    { /usr/bin/flock -x 9 && /usr/bin/awk -v ts="$(date +%s.%N)" 'BEGIN {
        s = ENVIRON["SSH_ORIGINAL_COMMAND"]
        gsub(/\\/, "\\\\\\\\", s); gsub(/\n/, "\\n", s); gsub(/\r/, "\\r", s)
        printf "%s %s\n", ts, s
      }' >&9; } 9>>@LOG@ </dev/null 2>/dev/null
    exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
fi
exec /bin/sh
"""

PYTHON_WRAPPER = """#!/bin/sh
PYTHONPATH=@SITE@${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
exec @PYTHON@ "$@"
"""


_live_fleets: "set[Fleet]" = set()  # strong refs: a dropped Fleet is still stopped at exit


@atexit.register
def _stop_live_fleets() -> None:
    for fleet in list(_live_fleets):
        if fleet._owner_pid != os.getpid():
            continue  # a forked child exiting: the fleet is its parent's
        try:
            fleet.stop()
        except Exception:  # pragma: no cover - best effort at exit
            pass


# ---------------------------------------------------------------------------


class Fleet:
    """A local fleet of sshd hosts.  See the module docstring.

    ``detach=True`` (for ``fleetpatch demo``): the fleet outlives this process (no
    atexit cleanup); ``Fleet.attach(root).stop()`` stops it later.
    """

    def __init__(self, root, specs: list[HostSpec], mount_point: str = DEFAULT_MOUNT_POINT,
                 *, detach: bool = False, docker_sock: str | None = None):
        self.root = Path(root).absolute()
        self.specs = list(specs)
        self.mount_point = str(mount_point).rstrip("/") or "/"
        self.detach = detach
        if not self.mount_point.startswith("/"):
            raise FleetError(f"mount_point must be absolute: {mount_point!r}")
        names = [s.name for s in self.specs]
        for n in names:
            if not _NAME_RE.match(n):
                raise FleetError(f"bad host name {n!r} (letters, digits, . _ - only)")
        if len(set(names)) != len(names):
            raise FleetError(f"duplicate host names in {names}")
        for spec in self.specs:
            if spec.engine not in ENGINES:
                raise FleetError(f"{spec.name}: engine must be one of {', '.join(ENGINES)}, not {spec.engine!r}")
            if spec.engine == "vllm" and (spec.servers != 1 or spec.node_group):
                raise FleetError(f"{spec.name}: a vLLM host runs one server (no servers=N, no node group)")
            if spec.engine == "vllm" and (spec.entrypoint not in vllm_hosts.ENTRYPOINTS
                                          or (spec.container and spec.entrypoint != "serve")):
                raise FleetError(f"{spec.name}: entrypoint must be one of {', '.join(vllm_hosts.ENTRYPOINTS)} "
                                 "(a container host's is its image's: serve)")
            if spec.restart_kind not in RESTART_KINDS:
                raise FleetError(f"{spec.name}: restart_kind must be one of {', '.join(RESTART_KINDS)}, "
                                 f"not {spec.restart_kind!r}")
            if spec.container and spec.restart_kind != "command":
                raise FleetError(f"{spec.name}: a container host's server is the container: "
                                 f"restart_kind {spec.restart_kind!r} does not apply")
            if spec.servers < 1 or (spec.servers > 1 and (spec.container or spec.restart_kind != "command")):
                raise FleetError(f"{spec.name}: servers={spec.servers}: several servers are command-restarted "
                                 "servers of a plain host")
        self.docker_sock = docker_sock or sock_from_env()
        self.docker = Dockerd(self.docker_sock)
        self._images: dict[str, str] = {}
        self.keys_dir = self.root / "keys"
        self.identity = self.keys_dir / "id_ed25519"
        self.known_hosts = self.keys_dir / "known_hosts"
        self.authorized_keys = self.keys_dir / "authorized_keys"
        self.hosts: dict[str, FleetHost] = {}
        self._sshd: dict[str, subprocess.Popen] = {}
        self._servers: dict[str, subprocess.Popen] = {}
        self._ns_fds: dict[str, int] = {}
        self._lock = threading.RLock()
        self._started = False
        self._stopped = False
        self._owner_pid = os.getpid()
        pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for spec in self.specs:
            d = self.root / "hosts" / spec.name
            self.hosts[spec.name] = FleetHost(
                name=spec.name, spec=spec, ssh_port=0, http_port=0, dir=d,
                host_dir=d / "fs", sshd_dir=d / "sshd", mount_point=self.mount_point,
                python_dir=pyver, token=uuid.uuid4().hex,
                container_name=containerhost.container_name(self.root, spec.name, spec.engine) if spec.container else "")
        for group, members in self.node_groups.items():
            if len(members) < 2 or any(self.hosts[m].spec.container or self.hosts[m].spec.servers > 1
                                       or self.hosts[m].spec.restart_kind != "command" for m in members):
                raise FleetError(f"node group {group}: 2 hosts or more, each a plain host with one "
                                 "command-restarted server")
            for rank, m in enumerate(members):
                self.hosts[m].node_rank, self.hosts[m].nnodes = rank, len(members)

    @property
    def node_groups(self) -> dict[str, list[str]]:
        """Each node group's hosts in rank order (the order of their specs)."""
        out: dict[str, list[str]] = {}
        for spec in self.specs:
            if spec.node_group:
                out.setdefault(spec.node_group, []).append(spec.name)
        return out

    # -- context manager ----------------------------------------------------

    def __enter__(self) -> "Fleet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    @property
    def standin_available(self) -> bool:
        """The stand-in of every engine the fleet's hosts run is there to install."""
        engines = {s.engine for s in self.specs}
        return (("sglang" not in engines or sglang_standin_available())
                and ("vllm" not in engines or vllm_hosts.standin_available()))

    # -- start --------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 30.0) -> "Fleet":
        """Build every host, start its sshd, then (start_server=True) its stand-in server;
        with ``wait`` wait until each server's /health answers 200."""
        if self._started and not self._stopped:
            return self
        if os.geteuid() != 0:
            raise FleetError("the demo fleet needs root (mount namespaces)")
        for tool in ("unshare", "nsenter", "ssh-keygen"):
            if not shutil.which(tool):
                raise FleetError(f"{tool} not found")
        if not os.path.exists(SSHD):
            raise FleetError(f"{SSHD} not found (install openssh-server)")
        if any(s.start_server for s in self.specs) and not self.standin_available:
            raise FleetError(f"a stand-in server is missing ({SGLANG_SOURCE} or {vllm_hosts.STANDIN_PACKAGE}); "
                             "use start_server=False")
        if self.container_hosts:
            reason = docker_unavailable(self.docker_sock)
            if reason:
                raise FleetError(f"container hosts need a Docker daemon: {reason}")
            if str(self.root).startswith("/run/"):
                raise FleetError(f"a fleet with container hosts cannot live under /run: {self.root}")
        if (self.root / STATE_FILE).exists():
            # a fleet started earlier under this root (e.g. a detached demo) goes first
            try:
                Fleet.attach(self.root).stop()
            except (OSError, ValueError, KeyError, TypeError):
                pass
        self._started = True
        self._stopped = False
        if not self.detach:
            _live_fleets.add(self)
        try:
            self._build()
            self._start_sshds()
            self._save_state()
            to_start = [n for n, h in self.hosts.items() if h.spec.start_server]
            self._start_servers(to_start, wait=wait, timeout=timeout)
            self._save_state()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def container_hosts(self) -> list[str]:
        return [n for n, h in self.hosts.items() if h.containerized]

    def _build_images(self) -> None:
        """The engine image of each engine version a container host runs; stale containers
        of this root (or of a dead test process) go."""
        from .images import ImageError, engine_image, vllm_image
        try:
            for engine, v in sorted({(self.hosts[n].spec.engine, self.hosts[n].spec.version)
                                     for n in self.container_hosts}):
                self._images[_image_key(engine, v)] = (vllm_image if engine == "vllm" else engine_image)(self.docker, v)
            containerhost.prune(self.docker, self.root)
        except (ImageError, DockerError) as e:
            raise FleetError(str(e)) from e

    def _build(self) -> None:
        self.keys_dir.mkdir(parents=True, exist_ok=True)
        trees = {(e, v): _tree(e, v) for e, v in sorted({(s.engine, s.version) for s in self.specs})}
        if self.container_hosts:
            self._build_images()
        # keys: one client key + one host key per host, generated concurrently
        jobs = []
        for path, comment in [(self.identity, "fleetpatch-demo-client")] + [
                (h.host_key, f"fleetpatch-demo-host-{h.name}") for h in self.hosts.values()]:
            path.parent.mkdir(parents=True, exist_ok=True)
            for p in (path, path.with_name(path.name + ".pub")):
                if p.exists():
                    p.unlink()
            jobs.append((path, subprocess.Popen(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        for path, proc in jobs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise FleetError(f"ssh-keygen for {path} failed: {err.decode(errors='replace')}")
        self.authorized_keys.write_text(
            Path(str(self.identity) + ".pub").read_text())
        # trees
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda h: self._build_tree(h, trees[(h.spec.engine, h.spec.version)]),
                          self.hosts.values()))
        # ports (ssh + http per server of each host)
        groups = self.node_groups
        ports = _free_ports(sum(1 + len(h.server_names) for h in self.hosts.values()) + len(groups))
        for h in self.hosts.values():
            n = len(h.server_names)
            h.ssh_port, h.http_ports, ports = ports[0], ports[1:1 + n], ports[1 + n:]
            h.http_port = h.http_ports[0]
            self._write_sshd_files(h)
        for members in groups.values():
            port, ports = ports[0], ports[1:]
            for m in members:
                self.hosts[m].dist_port = port
        os.makedirs(self.mount_point, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep directory

    def _build_tree(self, h: FleetHost, tree: Path) -> None:
        if h.host_dir.exists():
            shutil.rmtree(h.host_dir)
        for sub in ("logs", "run", "state", "home", "etc", "models/demo"):
            (h.host_dir / sub).mkdir(parents=True, exist_ok=True)
        (h.host_dir / TOKEN_FILE).write_text(h.token + "\n")
        if h.vllm:
            vllm_hosts.model_files(h.host_dir, h.spec.architecture, h.spec.method)
        if not h.containerized:   # a container host's engine is in its container
            self._build_env(h, tree)

    def _build_env(self, h: FleetHost, tree: Path) -> None:
        real = os.path.realpath(sys.executable)
        cfg = (f"home = {os.path.dirname(real)}\ninclude-system-site-packages = true\n"
               f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
        if self._env_kept(h, real, cfg):
            # The same venv (pyvenv.cfg, bin/python) stays, as it does on a real host between two
            # deploys; only what it holds is made pristine. A venv made anew at every reset gave its
            # files new inodes, which the agent's probe-site-cache (keyed by them) read as another
            # interpreter: every bench run paid the site-dir query a real host pays once.
            for child in h.env_dir.iterdir():
                if child.name not in ("pyvenv.cfg", "bin"):
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            for child in (h.env_dir / "bin").iterdir():
                if child != h.python:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:
            if h.env_dir.exists():
                shutil.rmtree(h.env_dir)
            (h.env_dir / "bin").mkdir(parents=True)
        shutil.copytree(tree, h.site_packages, symlinks=True,
                        ignore=shutil.ignore_patterns(".complete", "__pycache__"))
        _make_writable(h.site_packages)
        if h.vllm:
            if vllm_hosts.standin_available():
                vllm_hosts.install_standin(h.site_packages)
                _make_writable(h.site_packages / vllm_hosts.STANDIN_MODULE)
        elif sglang_standin_available():
            for path in install_sglang_standin(h.site_packages):
                _make_writable(path)
        # A real venv (pyvenv.cfg, bin/python a link to this Python): its site-packages is a
        # site directory of its own, read at start, as on a real host, so the probe's .pth goes
        # there and never into this machine's shared one. The system site-packages stay visible
        # (supervisor, for supervisorctl).
        if not h.python.is_symlink():
            (h.env_dir / "pyvenv.cfg").write_text(cfg)
            h.python.symlink_to(real)

    @staticmethod
    def _env_kept(h: FleetHost, real: str, cfg: str) -> bool:
        """Is the host's venv the one _build_env makes (its pyvenv.cfg and bin/python as written)?"""
        try:
            return (h.python.is_symlink() and os.readlink(h.python) == real
                    and (h.env_dir / "pyvenv.cfg").read_text() == cfg and (h.env_dir / "bin").is_dir()
                    and not (h.env_dir / "bin").is_symlink())
        except OSError:
            return False

    def _write_sshd_files(self, h: FleetHost) -> None:
        h.sshd_dir.mkdir(parents=True, exist_ok=True)
        h.force_command.write_text(FORCE_COMMAND.replace("@LOG@", shlex.quote(str(h.commands_log))))
        h.force_command.chmod(0o755)
        h.commands_log.touch()
        q = _sshd_config_quote
        lines = [
            f"# fleetpatch demo fleet host {h.name}",
            f"ListenAddress 127.0.0.1:{h.ssh_port}",
            "AddressFamily inet",
            f"HostKey {q(str(h.host_key))}",
            f"PidFile {q(str(h.sshd_dir / 'sshd.pid'))}",
            f"AuthorizedKeysFile {q(str(self.authorized_keys).replace('%', '%%'))}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "LogLevel ERROR",
            "MaxSessions 64",
            "MaxStartups 200",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "PermitUserEnvironment no",
            "AcceptEnv LANG LC_*",
            # one SetEnv line: sshd takes the first of several
            "SetEnv " + " ".join(q(f"{k}={v}") for k, v in {"HOME": h.remote_home, **h.spec.session_env}.items()),
            f"Subsystem sftp {SFTP_SERVER}",
            f"ForceCommand {shlex.quote(str(h.force_command))}",
        ]
        if _openssh_version() >= (9, 8):
            lines.append("PerSourcePenalties no")  # many refused logins from 127.0.0.1 in tests
        h.sshd_config.write_text("\n".join(lines) + "\n")

    def _spawn_sshd(self, h: FleetHost) -> subprocess.Popen:
        script = ('mount --bind "$1" "$2" && exec "$3" -D -e -f "$4"')
        argv = ["sh", "-c", script, "sh", str(h.host_dir), self.mount_point, SSHD, str(h.sshd_config)]
        if h.containerized:   # its own /run, where docker.sock reaches the daemon
            h.docker_sock_holder.mkdir(parents=True, exist_ok=True)
            argv = containerhost.sshd_argv(h.host_dir, self.mount_point, SSHD, h.sshd_config,
                                           self.docker_sock, h.docker_sock_holder)
        with open(h.sshd_log, "ab") as log:
            return subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                close_fds=True)

    def _start_sshds(self) -> None:
        own_ns = _ns_ino(os.getpid())
        pending = {}
        for h in self.hosts.values():
            self._sshd[h.name] = self._spawn_sshd(h)
            pending[h.name] = 0
        deadline = time.monotonic() + 15
        while pending:
            listening = _listening_ports()
            for name in list(pending):
                h, proc = self.hosts[name], self._sshd[name]
                if proc.poll() is not None:
                    log = _tail(h.sshd_log)
                    if "Address already in use" in log and pending[name] < 3:
                        pending[name] += 1
                        h.ssh_port = _free_ports(1)[0]
                        self._write_sshd_files(h)
                        self._sshd[name] = self._spawn_sshd(h)
                        continue
                    raise FleetError(f"sshd of {name} exited ({proc.returncode}):\n{log}")
                ns = _ns_ino(proc.pid)
                if (ns is not None and ns != own_ns and h.ssh_port in listening
                        and _owns_socket(proc.pid, listening[h.ssh_port])):
                    h.sshd_pid = proc.pid
                    try:
                        self._ns_fds[name] = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY)
                    except OSError as e:
                        raise FleetError(f"cannot hold the namespace of {name}: {e}")
                    h.ns_ino = os.fstat(self._ns_fds[name]).st_ino
                    del pending[name]
            if pending:
                if time.monotonic() > deadline:
                    raise FleetError(f"sshd did not come up for {sorted(pending)}")
                time.sleep(0.01)
        self._write_known_hosts()

    def _write_known_hosts(self) -> None:
        lines = []
        for h in self.hosts.values():
            kind, b64 = Path(str(h.host_key) + ".pub").read_text().split()[:2]
            lines.append(f"[127.0.0.1]:{h.ssh_port} {kind} {b64}\n")
        tmp = self.known_hosts.with_name(self.known_hosts.name + ".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(self.known_hosts)

    # -- inventory ----------------------------------------------------------

    def inventory(self, canary: bool = False) -> dict:
        """The fleet as a hosts.yaml document."""
        mp = self.mount_point
        inv = {
            "defaults": {
                "user": "root",
                "identity_file": str(self.identity),
                "known_hosts": str(self.known_hosts),
                "connect_timeout": 5,
                "engine": {
                    "kind": "sglang",
                    "python": f"{mp}/sglang env/bin/python",
                    "state_dir": f"{mp}/state",
                },
                "server": {
                    "log": f"{mp}/logs/sglang.log",
                    "ready_timeout": 60,
                    "restart": {
                        "kind": "command",
                        "workdir": mp,
                        "pidfile": f"{mp}/run/sglang.pid",
                    },
                },
            },
            "groups": {},
            "hosts": {},
        }
        for h in self.hosts.values():
            if h.supervised:
                # what supervisord runs is in its config; null drops the command defaults
                restart = {"kind": "supervisor", "program": h.supervisor_program,
                           "config": h.remote_supervisord_conf, "workdir": None, "pidfile": None}
            elif h.containerized:
                # the contract's container host: the container's main process is the server
                restart = {"kind": "container", "stop_grace": containerhost.STOP_GRACE,
                           "workdir": None, "pidfile": None}
            else:
                restart = {"start": h.start_command, "env": h.server_env}
            inv["hosts"][h.name] = {
                "address": "127.0.0.1",
                "port": h.ssh_port,
                "server": {
                    "health_url": h.health_url,
                    "restart": restart,
                },
            }
            if h.server_names != [None]:
                # `servers:` - what they share under server:, what is each one's own under its name
                inv["hosts"][h.name]["server"] = {"restart": {"env": h.server_env}}
                inv["hosts"][h.name]["servers"] = {s: {
                    "url": h.worker_url(s), "health_url": h.health_url_of(s), "log": h.remote_of(h.log_of(s)),
                    "restart": {"start": h.start_command_of(s), "pidfile": h.remote_of(h.pidfile_of(s))},
                } for s in h.server_names}
            if h.vllm:
                # its own engine, interpreter, log and pidfile (the defaults above are the SGLang hosts')
                inv["hosts"][h.name]["engine"] = {"kind": "vllm", "python": h.remote_python}
                inv["hosts"][h.name]["server"]["log"] = h.remote_log
                if not (h.supervised or h.containerized):
                    restart["pidfile"] = h.remote_pidfile
            if h.containerized:
                inv["hosts"][h.name].setdefault("engine", {}).update(
                    {"container": h.container_name, "runtime": "docker", "python": containerhost.CONTAINER_PYTHON})
                inv["hosts"][h.name]["server"]["log"] = "container"
        if canary and self.hosts:
            inv["groups"]["canary"] = [next(iter(self.hosts))]
        if self.node_groups:
            inv["nodes"] = {g: {"hosts": list(members)} for g, members in self.node_groups.items()}
        return inv

    def write_inventory(self, path, **kw) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.inventory(**kw), sort_keys=False))
        return path

    # -- ssh helpers --------------------------------------------------------

    def ssh_argv(self, name: str, *command: str) -> list[str]:
        """argv for the OpenSSH client, strict host key checking, this fleet's key."""
        h = self.hosts[name]
        return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", f'UserKnownHostsFile="{self.known_hosts}"',  # quoted: the option is a list
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                "-i", str(self.identity), "-p", str(h.ssh_port), "root@127.0.0.1", *command]

    def ssh(self, name: str, command: str, input: str | bytes | None = None,
            timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """Run one shell command on a host over real ssh; text output."""
        if isinstance(input, bytes):
            input = input.decode()
        return subprocess.run(self.ssh_argv(name, command), input=input, capture_output=True,
                              text=True, timeout=timeout, check=check,
                              stdin=subprocess.DEVNULL if input is None else None)

    # -- servers ------------------------------------------------------------

    def _nsenter_prefix(self, h: FleetHost) -> tuple[list[str], tuple[int, ...]]:
        fd = self._ns_fds.get(h.name)
        if fd is not None:
            return [f"--mount=/proc/self/fd/{fd}"], (fd,)
        if h.sshd_pid and _ns_ino(h.sshd_pid) == h.ns_ino:
            return [f"--mount=/proc/{h.sshd_pid}/ns/mnt"], ()
        raise FleetError(f"host {h.name} is not running")

    def nsenter_argv(self, name: str, *argv: str) -> tuple[list[str], tuple[int, ...]]:
        """(argv, pass_fds) running `argv` inside the host's mount namespace, cwd
        mount_point, without SSH: ``subprocess.run(a, pass_fds=fds, ...)``."""
        h = self.hosts[name]
        ns_opts, fds = self._nsenter_prefix(h)
        return ["nsenter", *ns_opts, f"--wd={self.mount_point}", "--", *argv], fds

    def run_in_host(self, name: str, *argv: str, **kw) -> subprocess.CompletedProcess:
        """subprocess.run of `argv` inside the host's namespace (no SSH, not logged in
        commands.log), with the host's session environment unless env= is given."""
        full, fds = self.nsenter_argv(name, *argv)
        kw.setdefault("env", self.session_env(name))
        return subprocess.run(full, pass_fds=fds, **kw)

    def session_env(self, name: str) -> dict:
        """The environment an SSH session on the host gets (before restart.env)."""
        return {"PATH": SESSION_PATH, "HOME": self.hosts[name].remote_home, "USER": "root",
                "LOGNAME": "root", "SHELL": "/bin/bash"}

    def start_server(self, name: str, server: str | None = None) -> int:
        """Start the host's stand-in server as the inventory's command restart would:
        in the host's namespace, own session, restart env, workdir mount_point, stdout and
        stderr appended to logs/sglang.log, pid written to run/sglang.pid.  Returns the pid
        (the running one if it is already up).  A host with several servers: each of them
        (logs/s0.log, run/s0.pid, ...), or the one named; the pid of the first, or of that one."""
        h = self.hosts[name]
        if server is None and len(h.server_names) > 1:
            return [self.start_server(name, s) for s in h.server_names][0]
        with self._lock:
            server = h._server(server)
            pid = self.server_pid(name, server)
            if pid:
                return pid
            if h.containerized:
                return self._start_container(name)
            if not h.standin_installed:
                raise FleetError(f"{name}: the {h.spec.engine} stand-in is missing from its site-packages")
            if h.supervised:
                return self._start_supervised(name)
            argv = [tok.replace("{python}", h.remote_python) for tok in shlex.split(h.start_command_of(server))]
            full, fds = self.nsenter_argv(name, *argv)
            env = self.session_env(name)
            env.update(h.server_env)
            log_path, pidfile = h.log_of(server), h.pidfile_of(server)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            pidfile.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    full,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                    start_new_session=True, close_fds=True, pass_fds=fds)
            self._servers[_key(name, server)] = proc
            tmp = pidfile.with_name(pidfile.name + ".tmp")
            tmp.write_text(f"{proc.pid}\n")
            tmp.replace(pidfile)
            return proc.pid

    def _start_container(self, name: str) -> int:
        """``docker start`` the host's container, or ``docker run`` it from the engine image;
        the host pid of its main process."""
        h = self.hosts[name]
        try:
            if not containerhost.start_existing(self.docker, h.container_name):
                image = _image_key(h.spec.engine, h.spec.version)
                if image not in self._images:
                    self._build_images()
                owner = "detached" if self.detach else str(self._owner_pid)
                containerhost.run(self.docker, h.container_name, self._images[image],
                                  h.container_argv, h.server_env,
                                  containerhost.labels(self.root, name, owner))
            return containerhost.wait_running(self.docker, h.container_name)
        except DockerError as e:
            raise FleetError(f"{name}: {e}") from e

    def container_id(self, name: str) -> str | None:
        """Full id of the host's container, None if there is none."""
        doc = containerhost.state(self.docker, self.hosts[name].container_name)
        return doc["Id"] if doc else None

    def recreate_container(self, name: str, wait: bool = True, timeout: float = 30.0) -> str:
        """``docker rm -f`` + ``docker run`` the host's container, as compose does after a
        change: a new id, the image's files back; the host's state/ is kept.  The new id."""
        h = self.hosts[name]
        containerhost.remove(self.docker, h.container_name)
        self._start_container(name)
        if wait:
            self.wait_healthy([name], timeout=timeout)
        return self.container_id(name)

    def docker_cli(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """The docker CLI against the fleet's daemon (not over SSH, not in commands.log)."""
        return self.docker.cli(*args, **kw)

    def server_log_tail(self, name: str, n: int = 20, server: str | None = None) -> str:
        h = self.hosts[name]
        if h.containerized:
            return containerhost.log_tail(self.docker, h.container_name, n)
        return _tail(h.log_of(server), n)

    def _start_supervised(self, name: str, timeout: float = 15.0) -> int:
        """supervisord with the host's conf (autostart runs the stand-in), or, when supervisord
        is up with the program stopped, ``supervisorctl start``; waits for the program's pid."""
        h = self.hosts[name]
        if self.supervisord_pid(name) is None:
            h.supervisord_conf.parent.mkdir(parents=True, exist_ok=True)
            h.supervisord_conf.write_text(h.supervisord_conf_text())
            for stale in (h.host_dir / "run" / "supervisor.sock", h.supervisord_pidfile):
                try:
                    stale.unlink()
                except FileNotFoundError:
                    pass
            h.log_path.parent.mkdir(parents=True, exist_ok=True)
            full, fds = self.nsenter_argv(name, sys.executable, "-m", "supervisor.supervisord",
                                          "-c", h.remote_supervisord_conf)
            with open(h.host_dir / "logs" / "supervisord.out", "ab") as out:
                self._servers[name] = subprocess.Popen(
                    full, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.session_env(name),
                    start_new_session=True, close_fds=True, pass_fds=fds)
        else:
            self.supervisorctl(name, "start", h.supervisor_program)
        deadline = time.monotonic() + timeout
        while True:
            pid = self.server_pid(name)
            if pid:
                return pid
            if self.supervisord_pid(name) is None:
                raise FleetError(f"{name}: supervisord exited:\n{_tail(h.host_dir / 'logs' / 'supervisord.out')}"
                                 f"\n{_tail(h.supervisord_log)}")
            if time.monotonic() > deadline:
                raise FleetError(f"{name}: supervisord did not start {h.supervisor_program} within {timeout:.0f}s:"
                                 f"\n{_tail(h.supervisord_log)}\n{_tail(h.log_path)}")
            time.sleep(0.02)

    def supervisorctl(self, name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``supervisorctl -c <conf> ARGS`` inside a supervisor host (no SSH); text output."""
        h = self.hosts[name]
        return self.run_in_host(name, sys.executable, "-m", "supervisor.supervisorctl",
                                "-c", h.remote_supervisord_conf, *args,
                                capture_output=True, text=True, timeout=timeout)

    def supervisord_pid(self, name: str) -> int | None:
        """pid of the host's supervisord, if it runs (supervisor hosts)."""
        h = self.hosts[name]
        if not h.supervised:
            return None
        self._reap(name)
        ours = self._servers.get(name)
        if ours is not None:
            return ours.pid if _alive(ours.pid) else None
        try:  # started by an earlier process (a detached demo)
            pid = int(h.supervisord_pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 0 or not _alive(pid) or (h.ns_ino is not None and _ns_ino(pid) != h.ns_ino):
            return None
        return pid

    def _reap(self, name: str | None = None) -> None:
        with self._lock:
            for n, proc in list(self._servers.items()):
                if (name is None or n.split(":")[0] == name) and proc.poll() is not None:
                    if self._servers.get(n) is proc:
                        del self._servers[n]

    def server_pid(self, name: str, server: str | None = None) -> int | None:
        """pid of the host's server (the first, or the one named) per its pidfile, if that process is alive."""
        h = self.hosts[name]
        server = h._server(server)
        if h.containerized:
            return containerhost.pid(self.docker, h.container_name)
        if h.supervised:  # the program is supervisord's child
            sd = self.supervisord_pid(name)
            kids = _children(sd) if sd else []
            return kids[0] if kids else None
        self._reap(name)
        try:
            pid = int(h.pidfile_of(server).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 0 or not _alive(pid):
            return None
        ours = self._servers.get(_key(name, server))
        if ours is not None and ours.pid == pid:
            return pid  # ours, maybe still entering the namespace
        if h.ns_ino is not None and _ns_ino(pid) != h.ns_ino:
            return None
        return pid

    def healthy(self, name: str, timeout: float = 1.0, server: str | None = None) -> bool:
        """/health answers 200: of every server of the host, or of the one named."""
        h = self.hosts[name]
        return all(_answers(h.health_url_of(s), timeout) for s in ([server] if server else h.server_names))

    def server_names(self, name: str) -> list:
        """The host's servers: [None] (one), or ["s0", "s1", ...] (HostSpec.servers > 1)."""
        return self.hosts[name].server_names

    def worker_urls(self, names=None) -> dict:
        """Every server of the hosts (all: None) as a router lists it: {host, or host/server: URL}."""
        return {n if s is None else f"{n}/{s}": h.worker_url(s) for n, h in self.hosts.items()
                if names is None or n in names for s in h.server_names}

    def wait_healthy(self, names=None, timeout: float = 30.0) -> None:
        """Wait until each host's /health answers 200; FleetError (with log tails) if a
        server exits or the timeout passes."""
        names = list(self.hosts) if names is None else list(names)
        deadline = time.monotonic() + timeout

        def one(name):
            for s in self.hosts[name].server_names:
                who = name if s is None else f"{name} {s}"
                while not self.healthy(name, 1.0, s):
                    if self.server_pid(name, s) is None:
                        return f"{who}: server exited:\n{self.server_log_tail(name, server=s)}"
                    if time.monotonic() > deadline:
                        return (f"{who}: no 200 from {self.hosts[name].health_url_of(s)} within "
                                f"{timeout:.0f}s:\n{self.server_log_tail(name, server=s)}")
                    time.sleep(0.05)
            return None

        if not names:
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(names))) as pool:
            errors = [e for e in pool.map(one, names) if e]
        if errors:
            raise FleetError("\n".join(errors))

    def _start_servers(self, names, wait: bool = True, timeout: float = 30.0) -> None:
        for n in names:
            self.start_server(n)
        if wait:
            self.wait_healthy(names, timeout=timeout)

    def stop_server(self, name: str, grace: float = 10.0, server: str | None = None) -> bool:
        """TERM the pid in the pidfile, wait, KILL after `grace`; remove the pidfile.
        True if a server was running.  A host with several servers: each (server=None), or the one named."""
        h = self.hosts[name]
        if server is None and len(h.server_names) > 1:
            return any([self.stop_server(name, grace, s) for s in h.server_names])
        server = h._server(server)
        if h.containerized:
            return containerhost.stop(self.docker, h.container_name, grace)
        pid = self.server_pid(name, server)
        if h.supervised:
            # supervisord stops its program (TERM, stopwaitsecs) before it exits itself
            sd = self.supervisord_pid(name)
            if sd:
                self._terminate([sd], grace + 10)
            if pid:
                self._terminate([pid], grace)
            self._reap(name)
            for path in (h.supervisord_pidfile, h.host_dir / "run" / "supervisor.sock"):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            return bool(pid)
        if pid:
            self._terminate([pid], grace)
        self._reap(name)
        try:
            h.pidfile_of(server).unlink()
        except FileNotFoundError:
            pass
        return bool(pid)

    def _terminate(self, pids, grace: float) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            live = [p for p in pids if _alive(p)]
            for p in live:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while live and time.monotonic() < deadline:
                self._reap()
                for n, proc in list(self._sshd.items()):
                    proc.poll()
                live = [p for p in live if _alive(p)]
                if live:
                    time.sleep(0.02)
            if not live:
                return

    # -- namespace scan -----------------------------------------------------

    def _ns_members(self, names=None) -> dict[str, list[int]]:
        """{host: [pids in its mount namespace]} (one /proc scan)."""
        want = {}
        for n in (self.hosts if names is None else names):
            h = self.hosts[n]
            if h.ns_ino is not None:
                want[h.ns_ino] = n
        own = _ns_ino(os.getpid())
        want.pop(own, None)
        found: dict[str, list[int]] = {n: [] for n in want.values()}
        verified: dict[str, bool] = {}
        me = os.getpid()
        for pid in _pids():
            if pid == me:
                continue
            ino = _ns_ino(pid)
            name = want.get(ino)
            if name is None:
                continue
            if name not in verified:
                verified[name] = self._verify_ns(self.hosts[name], pid)
            if verified[name]:
                found[name].append(pid)
        return found

    def _verify_ns(self, h: FleetHost, pid: int) -> bool:
        """The namespace really is this host's (the token file at mount_point matches),
        guarding against a reused namespace inode when we hold no fd on it."""
        if h.name in self._ns_fds:
            return True
        try:
            return (Path(f"/proc/{pid}/root") / self.mount_point.lstrip("/") / TOKEN_FILE
                    ).read_text().strip() == h.token
        except OSError:
            return False

    def processes(self, name: str) -> list[int]:
        """pids of every process in the host's mount namespace (sshd included)."""
        return self._ns_members([name]).get(name, [])

    def kill_processes(self, name: str, keep_sshd: bool = True, grace: float = 5.0) -> None:
        """TERM then KILL every process in the host's namespace; with keep_sshd, not sshd
        itself nor its per-connection processes (open SSH connections survive, the
        commands they run do not)."""
        def is_sshd(pid):
            try:
                return os.readlink(f"/proc/{pid}/exe") == SSHD
            except OSError:
                return False

        for _ in range(5):
            pids = [p for p in self.processes(name) if not (keep_sshd and is_sshd(p))]
            if not pids:
                return
            self._terminate(pids, grace)

    # -- reset --------------------------------------------------------------

    def reset(self, name: str, start_server: bool | None = None, wait: bool = True) -> None:
        """Stop the host's server (and every other process in its namespace but sshd),
        restore the pristine tree (byte for byte from the engine's tree, no __pycache__, a fresh
        python wrapper and stand-in), empty state/, logs/, run/ and home/, and restart the
        server if the host's spec says start_server.  commands.log is kept."""
        self._reset_tree(name)
        want = self.hosts[name].spec.start_server if start_server is None else start_server
        if want:
            self._start_servers([name], wait=wait)

    def _reset_tree(self, name: str) -> None:
        h = self.hosts[name]
        if h.containerized:   # the next start runs a fresh container: the image's files
            containerhost.remove(self.docker, h.container_name)
        else:
            self.stop_server(name)
        self.kill_processes(name)
        if not h.containerized:
            self._build_env(h, _tree(h.spec.engine, h.spec.version))
        for sub in ("state", "logs", "run", "home"):
            _empty_dir(h.host_dir / sub)
        (h.host_dir / "models" / "demo").mkdir(parents=True, exist_ok=True)
        if h.vllm:
            vllm_hosts.model_files(h.host_dir, h.spec.architecture, h.spec.method)
        (h.host_dir / TOKEN_FILE).write_text(h.token + "\n")

    def reset_all(self, wait: bool = True, names=None) -> None:
        """reset() of every host, or of those named, their trees rebuilt side by side."""
        names = list(self.hosts) if names is None else list(names)
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(self._reset_tree, names))
        self._start_servers([n for n in names if self.hosts[n].spec.start_server], wait=wait)

    # -- commands log -------------------------------------------------------

    def command_records(self, name: str) -> list[tuple[float, str]]:
        """[(unix time, command)] for every SSH command the host ran, in order."""
        out = []
        try:
            text = self.hosts[name].commands_log.read_text(errors="replace")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            ts, _, cmd = line.partition(" ")
            try:
                t = float(ts)
            except ValueError:
                continue
            out.append((t, _unescape(cmd)))
        return out

    def commands(self, name: str) -> list[str]:
        return [c for _, c in self.command_records(name)]

    def clear_commands(self, name: str | None = None) -> None:
        for n in ([name] if name else list(self.hosts)):
            with open(self.hosts[n].commands_log, "w"):
                pass

    # -- state file (for detached fleets) -----------------------------------

    def _save_state(self) -> None:
        state = {
            "mount_point": self.mount_point,
            "docker_sock": self.docker_sock,
            "running": self._started and not self._stopped,
            "hosts": {
                n: {"spec": asdict(h.spec), "ssh_port": h.ssh_port, "http_port": h.http_port,
                    "http_ports": h.http_ports, "dist_port": h.dist_port,
                    "sshd_pid": h.sshd_pid, "ns_ino": h.ns_ino, "token": h.token}
                for n, h in self.hosts.items()
            },
        }
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.root / STATE_FILE)

    @classmethod
    def attach(cls, root) -> "Fleet":
        """The fleet started (detached) under `root`, e.g. to stop it:
        ``Fleet.attach(root).stop()``.  FileNotFoundError if there is none."""
        root = Path(root).absolute()
        state = json.loads((root / STATE_FILE).read_text())
        specs = [HostSpec(**h["spec"]) for h in state["hosts"].values()]
        fleet = cls(root, specs, state["mount_point"], detach=True, docker_sock=state.get("docker_sock"))
        for n, hs in state["hosts"].items():
            h = fleet.hosts[n]
            h.ssh_port, h.http_port = hs["ssh_port"], hs["http_port"]
            h.http_ports = hs.get("http_ports") or [h.http_port]
            h.dist_port = hs.get("dist_port", 0)
            h.sshd_pid, h.ns_ino, h.token = hs["sshd_pid"], hs["ns_ino"], hs["token"]
        fleet._started = True  # let stop() scan even if a previous stop was cut short
        return fleet

    def is_running(self) -> bool:
        return any(h.sshd_pid and _alive(h.sshd_pid) and _ns_ino(h.sshd_pid) == h.ns_ino
                   for h in self.hosts.values())

    # -- stop ---------------------------------------------------------------

    def stop(self) -> None:
        """Kill every process in every host's namespace (TERM, then KILL), sshd included;
        the bind mounts die with the namespaces.  Idempotent."""
        with self._lock:
            if self._stopped or not self._started:
                self._stopped = True
                return
            try:
                self._remove_containers()
                for _ in range(5):
                    members = self._ns_members()
                    pids = [p for ps in members.values() for p in ps]
                    # sshd pids too, in case the namespace check could not see them
                    pids += [h.sshd_pid for h in self.hosts.values()
                             if h.sshd_pid and h.name in self._sshd]
                    pids = sorted(set(p for p in pids if _alive(p)))
                    if not pids:
                        break
                    self._terminate(pids, grace=3.0)
                for proc in list(self._sshd.values()) + list(self._servers.values()):
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:  # pragma: no cover
                        proc.kill()
            finally:
                for fd in self._ns_fds.values():
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._ns_fds.clear()
                self._sshd.clear()
                self._servers.clear()
                self._stopped = True
                _live_fleets.discard(self)
                try:
                    self._save_state()
                except OSError:
                    pass

    def _remove_containers(self) -> None:
        if not self.container_hosts or not self.docker.ping():
            return
        for n in self.container_hosts:
            try:
                containerhost.remove(self.docker, self.hosts[n].container_name)
            except DockerError:
                pass

    def __repr__(self) -> str:
        return f"Fleet({str(self.root)!r}, {len(self.hosts)} hosts, mount_point={self.mount_point!r})"


_OPENSSH_VERSION: tuple[int, int] | None = None


def _openssh_version() -> tuple[int, int]:
    global _OPENSSH_VERSION
    if _OPENSSH_VERSION is None:
        try:
            out = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr
            m = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
            _OPENSSH_VERSION = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        except OSError:
            _OPENSSH_VERSION = (0, 0)
    return _OPENSSH_VERSION


def main(argv=None) -> int:  # python -m fleetpatch_demo.fleet ROOT N  (manual poking)
    import argparse
    ap = argparse.ArgumentParser(description="start a local sshd fleet and wait")
    ap.add_argument("root")
    ap.add_argument("n", type=int, nargs="?", default=4)
    ap.add_argument("--no-server", action="store_true")
    a = ap.parse_args(argv)
    t = time.monotonic()
    specs = [HostSpec(f"host{i:02d}", spec_v2=bool(i % 2), start_server=not a.no_server)
             for i in range(a.n)]
    with Fleet(a.root, specs) as fleet:
        print(f"started {a.n} hosts in {time.monotonic() - t:.2f}s; inventory:",
              fleet.write_inventory(Path(a.root) / "hosts.yaml"))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
