#!/usr/bin/env python3
"""fleetpatch benchmark: a full rollout on the local sshd test fleet, against
plain OpenSSH (one `ssh` per host), pyinfra 3.x and an Ansible playbook, on
loopback and through a TCP delay proxy (bench/delayproxy.py, 50 ms RTT).

    python bench/run.py [--sizes 1,8,32] [--repeats 3] [--tools …] [--nets loopback,delay]
                        [--fleets plain,container] [--delay-ms 25] [--quiet-wait 60] [--out bench]
    invoke bench                       # the same, from the repo root

One fleet of 32 real sshd hosts (``fleetpatch_demo.fleet``; h00, h02, … run
spec v1 / EAGLEWorker, h01, h03, … spec v2 / EAGLEWorkerV2; stand-in startup
delay 0).  A run of size N uses h00..h(N-1).  For every size, repeat, net and
tool (tool order rotated per repeat), the fleet is reset to pristine, the
sshd-side command logs are cleared, the tool rolls the shipped
``spec-path-beacon`` patch out (fetch/apply with backup/restart/verify), and
the bench then checks the result itself: on every host the patched files have
the expected sha256, the server runs under a new pid and answers /health, and
the log written since the run started holds the marker of the path that host
runs (and not the other).

The "delay" net: one proxy listener per host on 127.0.0.1, every chunk delayed
--delay-ms each way, one extra round trip per new connection (the TCP
handshake); each tool is pointed at the proxy ports with a known_hosts file
holding each host's key under its proxy port, so host keys are still checked
strictly.

Measured per run: wall time (launch of the tool to its exit), remote commands
per host (counted by the fleet's sshd ForceCommand wrapper, not by the tool),
hosts succeeded (the tool's own verdict and the bench's check), and from the
sshd-side timestamps when each host's commands started.  For fleetpatch also
the per-host ``duration_s`` / ``round_trips`` / ``verdict_after_s`` of its
report, and (after the timed runs) one instrumented in-process rollout per
size and net timing the SSH connect and each agent round trip, with bytes moved.

--fleets plain,container: beside the plain fleet, a second one of as many container hosts
(c00, c01, …: the same sshd hosts, the engine in a Docker container of the engine image,
``engine.container`` in the inventory; fleetpatch_demo.containerhost) on the tests' Docker
daemon, or a private one the bench starts. fleetpatch and the baseline run there (baseline.sh's
CONTAINER mode: the limit on a container host). Per size and repeat
both fleets run, their order alternating per repeat; before each container run the
containers are re-created from the image; the check reads the files inside the container
(`docker exec … sha256sum`), the container's output since the run started (`docker logs
--since`), its main process's pid (new) and id (the same container). The bench's own docker
calls go to the daemon directly, so the sshd-side count stays the tool's commands.

Writes OUT/results.json and OUT/RESULTS.md (with container hosts: OUT/results-containers.json
and OUT/RESULTS-containers.md) and prints the tables.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

import fleetpatch
from fleetpatch.agent import MODULES as AGENT_MODULES
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.wheels import sglang_tree
from speedgauge import SpeedGauge, at_reference   # bench/, beside this script

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PATCH = "spec-path-beacon"
VERSION = "0.5.9"
DIFF = Path(fleetpatch.__file__).parent / "patches" / PATCH / "sglang-0.5.9.r1.diff"
MARKERS = {
    "EAGLEWorker": "fleetpatch spec-path-beacon: EAGLEWorker (",
    "EAGLEWorkerV2": "fleetpatch spec-path-beacon: EAGLEWorkerV2 (",
}
TOOLS = ("fleetpatch", "fleetpatch-noprobe", "fleetpatch-before", "baseline", "baseline-c25519", "baseline-checks",
         "pyinfra", "pyinfra-checks", "ansible")
# The issue's job stops at the marker; fleetpatch's contract makes it also wait, before its verdict,
# for the server's ready line, a 200 from the host's health URL and one smoke request answering
# HTTP 200 with a non-empty "text". These two peers do those checks too (bench/baseline.sh CHECKS=1,
# pyinfra_deploy.py fp_checks): a second comparison beside the issue's. Run only when named.
CHECKS_TOOLS = ("baseline-checks", "pyinfra-checks")
DEFAULT_TOOLS = tuple(t for t in TOOLS if t not in CHECKS_TOOLS)
READY_LINE = "The server is fired up and ready to roll!"
SMOKE_BODY = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
# The same one-ssh baseline with the key exchange paramiko (fleetpatch, pyinfra) uses:
# OpenSSH 9's default sntrup761x25519 costs ~85 ms more client CPU per connection.
C25519 = ["-o", "KexAlgorithms=curve25519-sha256"]
NETS = ("loopback", "delay")
# --fleets: "plain" (the engine in a venv on the host), "container" (the engine in a Docker
# container on the host, engine.container in the inventory). fleetpatch and the baseline run on
# container hosts (the baseline.sh's CONTAINER mode: the limit there, so that the container/plain
# ratio of the job itself stands beside fleetpatch's); pyinfra's and Ansible's scripts stop a
# server by its pidfile and read a log file.
FLEETS = ("plain", "container")
CONTAINER_TOOLS = ("fleetpatch", "fleetpatch-noprobe", "fleetpatch-before", "baseline")
# where the bench starts a Docker daemon of its own when none answers (short: containerd's
# socket paths are limited); the tests' daemon (FLEETPATCH_TEST_DOCKER_SOCK, else
# /run/fleetpatch-test/docker/docker.sock) is reused when it answers
BENCH_DOCKER_SOCK = "/run/fleetpatch-bench/docker/docker.sock"
BENCH_DOCKER_ROOT = "/var/cache/fleetpatch-bench/dockerd"
PYINFRA_VENV = Path.home() / ".cache" / "fleetpatch" / "bench-pyinfra"
# fleetpatch runs from a venv of its own too, installed from the checkout being measured: the
# machine's interpreter may load .pth files at every start (this one imports certifi: ~34 ms a
# start against ~10 ms in a venv) that pyinfra's venv does not pay
FLEETPATCH_VENV = Path.home() / ".cache" / "fleetpatch" / "bench-fleetpatch"
PYINFRA_REQ = "pyinfra>=3,<4"
MAX_HOSTS = 32
TOOL_TIMEOUT = 300


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ------------------------------------------------------------------ setup

def checkout_src(checkout: str | Path | None) -> Path | None:
    """--fleetpatch-before's CHECKOUT -> its src/ (resolved), or None where it holds no fleetpatch."""
    src = Path(checkout or "-") / "src"
    return src.resolve() if (src / "fleetpatch").is_dir() else None


def compile_fleetpatch(pkg: Path | None = None) -> str:
    """Byte-compile a fleetpatch source tree that runs from PYTHONPATH (fleetpatch-before), as
    `pip install` does for a wheel (fleetpatch itself runs from its venv, install_fleetpatch).
    A source tree has no bytecode until a first import writes it, and with
    PYTHONDONTWRITEBYTECODE set (this machine sets it) every start would compile
    every module again: a cost no installed fleetpatch pays. pyinfra and Ansible
    are pip-installed, so theirs is compiled."""
    import compileall

    pkg = pkg or Path(fleetpatch.__file__).parent
    ok = compileall.compile_dir(str(pkg), quiet=1)
    env = "PYTHONDONTWRITEBYTECODE=1" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "unset"
    return f"compiled {pkg} ({'ok' if ok else 'with errors'}; PYTHONDONTWRITEBYTECODE {env})"


def ensure_tools(install: bool, need_pyinfra: bool = True, need_ansible: bool = True) -> dict:
    """GNU patch and ansible-playbook (and pyinfra); installed if missing (apt-get / pip)."""
    notes = {}
    out = subprocess.run(["patch", "--version"], capture_output=True, text=True) if shutil.which("patch") else None
    if out is None or "GNU patch" not in out.stdout:
        if not install:
            sys.exit("bench: GNU patch is missing (apt-get install -y patch)")
        log("GNU patch missing: apt-get install -y patch")
        subprocess.run(["apt-get", "install", "-y", "patch"], check=True)
        notes["installed"] = "patch (apt-get)"
        out = subprocess.run(["patch", "--version"], capture_output=True, text=True)
    notes["patch"] = out.stdout.splitlines()[0]
    ap = ansible_playbook()
    if ap is None and not need_ansible:
        notes["ansible"] = "ansible-playbook: not installed (not run)"
    elif ap is None:
        if not install:
            sys.exit("bench: ansible-playbook is missing (pip install -e '.[bench]')")
        log("ansible-core missing: pip install 'ansible-core>=2.15'")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "ansible-core>=2.15"], check=True)
        notes["installed"] = (notes.get("installed", "") + " ansible-core (pip)").strip()
        ap = ansible_playbook()
    if ap is not None:
        notes["ansible"] = subprocess.run([ap, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    notes["openssh"] = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    if need_pyinfra:
        if not pyinfra_bin().exists():
            if not install:
                sys.exit(f"bench: pyinfra is missing ({PYINFRA_VENV}/bin/python -m pip install '{PYINFRA_REQ}')")
            # its own venv: pyinfra 3.x pins paramiko<5, and fleetpatch must be measured
            # with the paramiko the user has, not one downgraded for a contender
            log(f"pyinfra missing: python -m venv {PYINFRA_VENV}; pip install '{PYINFRA_REQ}'")
            subprocess.run([sys.executable, "-m", "venv", str(PYINFRA_VENV)], check=True)
            subprocess.run([str(PYINFRA_VENV / "bin" / "python"), "-m", "pip", "install", "-q",
                            "--disable-pip-version-check", PYINFRA_REQ], check=True)
            notes["installed"] = (notes.get("installed", "") + f" pyinfra (pip, venv {PYINFRA_VENV})").strip()
        notes["pyinfra"] = subprocess.run([str(pyinfra_bin()), "--version"], capture_output=True,
                                          text=True).stdout.strip()
    return notes


def fleetpatch_python() -> Path:
    return FLEETPATCH_VENV / "bin" / "python"


def fleetpatch_env(src: Path | None = None) -> dict:
    """The environment fleetpatch runs in: the bench's less PYTHONPATH (a source tree there would
    come before the venv's installed, compiled copy); for fleetpatch-before its other src first."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def install_fleetpatch(install: bool) -> tuple[str, Path]:
    """fleetpatch from a venv of its own (FLEETPATCH_VENV), as pyinfra runs from its own: made once
    (`python -m venv`, the build backend, then `pip install` of the checkout with its dependencies),
    and at every bench start the checkout being measured (this bench's, its working tree as it is)
    installed into it again: non-editable, `--no-deps --force-reinstall`, bytecode compiled by pip
    as for any wheel. The dependencies are installed again only where `pip check` finds one
    missing. The build runs on a copy of src/ and the project files: nothing is left in the tree.
    Returns (a note for the report, the installed package's directory)."""
    py = fleetpatch_python()
    pip = [str(py), "-m", "pip", "-q", "--disable-pip-version-check"]
    t0 = time.monotonic()
    made = not py.exists()
    if made:
        if not install:
            sys.exit(f"bench: fleetpatch's venv is missing ({sys.executable} -m venv {FLEETPATCH_VENV}; "
                     f"{py} -m pip install {REPO})")
        log(f"fleetpatch's venv missing: python -m venv {FLEETPATCH_VENV}; pip install {REPO} (with dependencies)")
        subprocess.run([sys.executable, "-m", "venv", str(FLEETPATCH_VENV)], check=True)
        subprocess.run(pip + ["install", "setuptools>=61", "wheel"], check=True)
    env = fleetpatch_env()
    with tempfile.TemporaryDirectory(prefix="fleetpatch-bench-src-") as d:
        shutil.copytree(REPO / "src", Path(d) / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        for f in ("pyproject.toml", "README.md", "LICENSE"):
            if (REPO / f).exists():
                shutil.copy2(REPO / f, Path(d) / f)
        how = [] if made else ["--no-deps", "--force-reinstall"]
        p = subprocess.run(pip + ["install", "--no-build-isolation", *how, d], capture_output=True, text=True,
                           env=env, cwd=d)
        if p.returncode:
            sys.exit(f"bench: installing {REPO} into {FLEETPATCH_VENV} failed (exit {p.returncode}): "
                     + " ".join(p.stderr.split())[-400:])
        deps = ""
        if not made and subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, env=env).returncode:
            log("fleetpatch's venv lacks a dependency (pip check): pip install with dependencies")
            subprocess.run(pip + ["install", "--no-build-isolation", d], check=True, env=env, cwd=d)
            deps = "; its dependencies installed again (pip check found one missing)"
    where = subprocess.run([str(py), "-c", "import fleetpatch; print(fleetpatch.__file__)"], capture_output=True,
                           text=True, env=env, cwd=str(FLEETPATCH_VENV)).stdout.strip()
    pkg = Path(where).parent
    if not where or REPO in pkg.parents:
        sys.exit(f"bench: {py} imports fleetpatch from {where or '(nowhere)'}, not from its venv")
    pycs = len(list(pkg.rglob("*.pyc")))
    version = subprocess.run([str(py), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, env=env).stdout.strip()
    return (f"fleetpatch from its own venv `{FLEETPATCH_VENV}` (Python {version}; "
            f"{'made now, ' if made else ''}the checkout {REPO} installed into it non-editable at the bench's start"
            f"{'' if made else ' (--no-deps --force-reinstall)'}, {pycs} .pyc files written by pip{deps}; "
            f"{time.monotonic() - t0:.0f} s)"), pkg


def container_daemon(flag: str = "--fleets container"):
    """(Dockerd, note) for the container fleet: FLEETPATCH_TEST_DOCKER_SOCK if set (it must
    answer), else the tests' daemon at /run/fleetpatch-test/docker/docker.sock if it answers,
    else a private one started here on its own socket and data root (BENCH_DOCKER_*), stopped
    at exit. Never another daemon. Exits with one line, naming `flag`, if none can be had."""
    from fleetpatch_demo.dockerd import DEFAULT_SOCK, SOCK_ENV, Dockerd, DockerError, docker_unavailable
    from fleetpatch_demo.images import containers_unavailable
    sock = os.environ.get(SOCK_ENV)
    if sock:
        reason = containers_unavailable(sock)
        if reason:
            sys.exit(f"bench: {flag}: {SOCK_ENV}={sock}: {reason}")
        return Dockerd(sock), {"sock": sock, "daemon": f"reused ({SOCK_ENV})"}
    if docker_unavailable(DEFAULT_SOCK) is None:
        reason = containers_unavailable(DEFAULT_SOCK)
        if reason:
            sys.exit(f"bench: {flag}: {reason}")
        return Dockerd(DEFAULT_SOCK), {"sock": DEFAULT_SOCK, "daemon": "reused (the tests' daemon)"}
    d = Dockerd(BENCH_DOCKER_SOCK, BENCH_DOCKER_ROOT)
    t = time.monotonic()
    try:
        d.start()   # stopped at exit (atexit), as it is this process's
    except DockerError as e:
        sys.exit(f"bench: {flag} needs a Docker daemon: {e}")
    reason = containers_unavailable(d.sock)
    if reason:
        sys.exit(f"bench: {flag}: {reason}")
    return d, {"sock": d.sock, "daemon": f"private, started by the bench in {time.monotonic() - t:.1f} s "
                                         f"(data root {d.data_root})"}


def out_names(fleets) -> tuple[str, str]:
    """A run with container hosts writes files of its own: the plain bench's results stay."""
    return ("results-containers.json", "RESULTS-containers.md") if "container" in fleets else \
        ("results.json", "RESULTS.md")


def skey(net: str, tool: str | None, n: int, fleet: str = "plain") -> str:
    """The summary's key: loopback/fleetpatch@8 (plain hosts, as ever), container:loopback/fleetpatch@8;
    the instrumented runs' (tool None): loopback@8, container:loopback@8."""
    k = f"{net}/{tool}@{n}" if tool else f"{net}@{n}"
    return k if fleet == "plain" else f"{fleet}:{k}"


def pyinfra_bin() -> Path:
    return PYINFRA_VENV / "bin" / "pyinfra"


def ansible_playbook() -> str | None:
    cand = Path(sys.executable).with_name("ansible-playbook")
    if cand.exists():
        return str(cand)
    return shutil.which("ansible-playbook")


def changed_files(diff_text: str) -> list[str]:
    out = []
    for line in diff_text.splitlines():
        if line.startswith("+++ "):
            p = line[4:].split("\t")[0].strip()
            out.append(p[2:] if p.startswith("b/") else p)
    return out


def expected_shas(diff_text: str, files: list[str]) -> dict:
    """Apply the diff with GNU patch to a copy of the pristine wheel files: the
    sha256 every host's files must have afterwards (independent of every tool)."""
    tree = sglang_tree(VERSION)
    with tempfile.TemporaryDirectory() as d:
        for f in files:
            (Path(d) / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / f, Path(d) / f)
        subprocess.run(["patch", "-p1", "-F0", "--batch", "--silent"], input=diff_text, text=True,
                       cwd=d, check=True)
        return {f: sha256((Path(d) / f).read_bytes()) for f in files}


def machine(pkg: Path | None = None) -> dict:
    """The machine, the checkout measured, and the agent as `pkg` (the installed fleetpatch that
    runs; else the one this process imports) sends it."""
    pkg = pkg or Path(fleetpatch.__file__).parent
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/fleetpatch"], cwd=REPO,
                               capture_output=True, text=True).stdout.split("\n")
        # the last commit that changed fleetpatch itself (HEAD may be a bench-only commit)
        src_commit = subprocess.run(["git", "log", "-1", "--format=%h %s", "--", "src/fleetpatch"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty, src_commit = "", [], ""
    # the agent as sent: its package's modules, in the order a host loads them
    agent_dir = pkg / "agent"
    agent = b"".join((agent_dir / f"{m}.py").read_bytes() for m in AGENT_MODULES)
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "fleetpatch_commit": commit,
            "fleetpatch_src_commit": src_commit, "fleetpatch_path": str(pkg),
            "fleetpatch_uncommitted": [l[3:] for l in dirty if l.strip()],
            "agent_sha256": sha256(agent)[:12], "agent_bytes": len(agent)}


def cpu_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


BENCH_TOKEN = f"{os.getpid()}-{time.time_ns()}"
os.environ["FLEETPATCH_BENCH_RUN"] = BENCH_TOKEN   # inherited by everything this bench starts
_HZ = os.sysconf("SC_CLK_TCK")


DOCKER_COMMS = ("dockerd", "containerd", "runc", "docker-init", "docker-proxy")


def _is_docker(pid: str, comm: bytes) -> bool:
    """The Docker daemon's side: dockerd, containerd and its shims, runc, and every process
    in a container (a cgroup under /docker/)."""
    if comm.decode(errors="replace").startswith(DOCKER_COMMS):
        return True
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return b"/docker/" in f.read()
    except OSError:
        return False


def foreign_cpu(fleet_ns: set) -> dict:
    """{pid: (ppid, cumulative CPU seconds: own + reaped children, docker?)} of every process
    that is not this bench's: not carrying FLEETPATCH_BENCH_RUN=<token> in its environment,
    not inside a fleet host's mount namespace, not this process, not pid 1 (which
    reaps our orphans). docker? marks the Docker daemon's processes and the containers'
    (the container hosts' engines; on a shared daemon also other users' containers).
    Other sessions on a shared machine show up here."""
    out = {}
    me = f"FLEETPATCH_BENCH_RUN={BENCH_TOKEN}".encode()
    skip = {"1", str(os.getpid())}   # this process: its environ predates the token
    for d in os.listdir("/proc"):
        if not d.isdigit() or d in skip:
            continue
        try:
            if os.stat(f"/proc/{d}/ns/mnt").st_ino in fleet_ns:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if me in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{d}/stat", "rb") as f:
                raw = f.read()
            head, tail = raw.rsplit(b")", 1)
            v = tail.split()
            comm = head.split(b"(", 1)[1]
            # ppid; utime stime cutime cstime
            out[int(d)] = (int(v[1]), sum(int(x) for x in v[11:15]) / _HZ, _is_docker(d, comm))
        except (OSError, ValueError, IndexError):
            pass
    return out


def foreign_delta(a: dict, b: dict, docker: bool = False) -> float:
    """CPU the foreign processes (docker=True: the Docker daemon's and the containers', else
    the others) used between snapshots a and b. A process that ended in between was (most
    likely) reaped by its parent, whose c[us]time then holds its whole life: what it had
    used before `a` is taken off again."""
    used = sum(t - a.get(pid, (0, 0.0, d))[1] for pid, (_, t, d) in b.items() if d == docker)
    used -= sum(t for pid, (ppid, t, d) in a.items() if pid not in b and ppid in b and b[ppid][2] == docker)
    return max(0.0, used)


def wait_quiet(max_wait: float, threshold: float = 20.0) -> float:
    """Wait (up to max_wait s) until the machine is less than `threshold` % busy over
    1 s; returns the busy share of the last second sampled."""
    deadline = time.monotonic() + max_wait
    while True:
        b0 = cpu_busy()
        time.sleep(1.0)
        b1 = cpu_busy()
        pct = 100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1])
        if pct < threshold or time.monotonic() >= deadline:
            return round(pct, 1)


def children_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------ the networks

class Net:
    """How the tools reach the hosts: straight to each sshd ("loopback"), or through
    the delay proxy ("delay": one listener per host).  Host keys are checked strictly
    either way: for the proxy a known_hosts file holds each host's key under its
    proxy port ([127.0.0.1]:PORT), so a tool connecting to a proxy port checks the
    key of the host behind it."""

    # OpenSSH client options for the baseline's ssh (--baseline-kex); empty = OpenSSH's defaults
    baseline_opts: list = []
    lateness: "LatenessLog | None" = None   # the delay proxy's lateness log ("delay" only)

    def __init__(self, name: str, ports: dict, known_hosts: Path, rtt_ms: float | None = None):
        self.name, self.ports, self.known_hosts, self.rtt_ms = name, ports, known_hosts, rtt_ms

    def ssh_argv(self, fleet: Fleet, name: str, *command: str, opts: list | None = None) -> list[str]:
        """fleet.ssh_argv with this net's port and known_hosts (and --baseline-kex, or `opts`)."""
        argv = fleet.ssh_argv(name, *command)
        argv[1:1] = list(self.baseline_opts if opts is None else opts)
        i = argv.index("-p")
        argv[i + 1] = str(self.ports[name])
        j = next(k for k, a in enumerate(argv) if a.startswith("UserKnownHostsFile="))
        argv[j] = f'UserKnownHostsFile="{self.known_hosts}"'
        return argv


def loopback_net(fleet: Fleet) -> Net:
    return Net("loopback", {n: h.ssh_port for n, h in fleet.hosts.items()}, fleet.known_hosts)


class DelayProxy:
    """bench/delayproxy.py as a child process: one listener per host. It stops by
    itself after max_seconds, or when this process closes its stdin (or dies)."""

    def __init__(self, fleet: Fleet, wd: Path, delay_ms: float, max_seconds: float, label: str = "",
                 trace: Path | None = None):
        self.fleet, self.wd, self.delay_ms, self.max_seconds = fleet, wd, delay_ms, max_seconds
        self.label = label   # "-container": the container fleet's proxy (its own known_hosts file)
        self.trace = trace   # the proxy's --trace file (a line per chunk read), for bench/proxy_timeline.py
        self.proc = None

    def __enter__(self) -> Net:
        echo = _EchoServer()
        targets = [h.ssh_port for h in self.fleet.hosts.values()] + [echo.port]
        # every forwarded chunk's lateness past its due time: a proxy starved of CPU by the hosts'
        # work (all on the same cores) delays more than --delay-ms, more for whoever talks then
        self.lateness = LatenessLog(self.wd / f"proxy-lateness{self.label}.txt")
        argv = [sys.executable, str(BENCH / "delayproxy.py"), "--delay-ms", str(self.delay_ms),
                "--max-seconds", str(self.max_seconds), "--lateness", str(self.lateness.path)]
        if self.trace is not None:
            argv += ["--trace", str(self.trace)]
        for t in targets:
            argv += ["--target", str(t)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"bench: the delay proxy did not start (exit {self.proc.wait()})")
        ports = {int(k): v for k, v in json.loads(line)["ports"].items()}
        first, rtt = echo.rtt_ms(ports[echo.port])
        echo.close()
        by_name = {n: ports[h.ssh_port] for n, h in self.fleet.hosts.items()}
        # the fleet's known_hosts, each entry moved to the host's proxy port
        keys = {}
        for l in self.fleet.known_hosts.read_text().splitlines():
            m = re.match(r"\[127\.0\.0\.1\]:(\d+) (.+)$", l)
            if m:
                keys[int(m.group(1))] = m.group(2)
        kh = self.wd / f"known_hosts-delay{self.label}"
        kh.write_text("".join(f"[127.0.0.1]:{by_name[n]} {keys[h.ssh_port]}\n" for n, h in self.fleet.hosts.items()))
        net = Net("delay", by_name, kh, rtt_ms=rtt)
        net.first_exchange_ms = first
        net.lateness = self.lateness
        return net

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()   # its cue to stop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LatenessLog:
    """The delay proxy's --lateness file (a line per chunk written: wall time, connection, direction,
    ms past its due time), read one run at a time from where the last read ended: each line once."""

    def __init__(self, path: Path):
        self.path = path
        path.write_text("")
        self._offset = 0

    def window(self, start: float, end: float) -> dict | None:
        """The chunks written between `start` and `end` (wall clock): how many, and the median,
        90th percentile and max of their lateness in ms; None when there were none."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return None
        whole = data[:data.rfind(b"\n") + 1]   # a line still being written is read next time
        self._offset += len(whole)
        late = []
        for line in whole.decode("ascii", "replace").splitlines():
            parts = line.split()
            if len(parts) == 4 and start <= float(parts[0]) <= end:
                late.append(float(parts[3]))
        if not late:
            return None
        late.sort()
        return {"chunks": len(late), "median_ms": round(med(late), 2),
                "p90_ms": round(late[min(len(late) - 1, int(len(late) * 0.9))], 2), "max_ms": round(late[-1], 2)}


class _EchoServer:
    """A one-connection TCP echo on 127.0.0.1: the proxy's round trip, measured."""

    def __init__(self):
        import socket
        self._socket = socket
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            c, _ = self.srv.accept()
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
            c.close()
        except OSError:
            pass

    def rtt_ms(self, port: int, n: int = 10) -> tuple[float, float]:
        """(first exchange on a new connection, median of the next n), in ms: the first
        includes the proxy's stand-in for the TCP handshake."""
        t0 = time.monotonic()
        s = self._socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setsockopt(self._socket.IPPROTO_TCP, self._socket.TCP_NODELAY, 1)
        ts = []
        for _ in range(n + 1):
            t = time.monotonic()
            s.sendall(b"x")
            s.recv(16)
            ts.append((time.monotonic() - t) * 1000)
        first = (time.monotonic() - t0) * 1000 - sum(ts[1:])
        s.close()
        return round(first, 1), round(med(ts[1:]), 1)

    def close(self):
        self.srv.close()


# ----------------------------------------------------------- per-host facts

def host_path(fleet: Fleet, name: str) -> str:
    return "EAGLEWorkerV2" if fleet.hosts[name].spec.spec_v2 else "EAGLEWorker"


def start_line(fleet: Fleet, name: str) -> str:
    """The inventory's start command with its env, as one shell-quoted line:
    env K=V … setsid <python> -m sglang_standin … (setsid: its own session)."""
    h = fleet.hosts[name]
    argv = [t.replace("{python}", h.remote_python) for t in shlex.split(h.start_command)]
    env = [f"{k}={v}" for k, v in h.server_env.items()]
    return " ".join(shlex.quote(w) for w in ["env", *env, "setsid", *argv])


def write_inventory(fleet: Fleet, names: list[str], path: Path, net: Net) -> Path:
    inv = fleet.inventory()
    inv["hosts"] = {n: {**inv["hosts"][n], "port": net.ports[n]} for n in names}
    inv["defaults"]["known_hosts"] = str(net.known_hosts)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def snapshot(fleet: Fleet, names) -> dict:
    """Before a run: each host's server pid and where its log ends (a container host: the
    time, its log being the container's output, and the container's id)."""
    out = {}
    for n in names:
        h = fleet.hosts[n]
        if h.containerized:
            out[n] = {"t": time.time(), "pid": fleet.server_pid(n), "container_id": fleet.container_id(n)}
        else:
            out[n] = {"log_size": h.log_path.stat().st_size if h.log_path.exists() else 0,
                      "pid": fleet.server_pid(n)}
    return out


def container_facts(fleet: Fleet, name: str, since: float, files) -> tuple[str, dict]:
    """A container host's output since `since` and {file: sha256} of the patched files as the
    container sees them (SGLang's checkout in the image, /sgl-workspace/sglang/python).
    Read by the bench through the daemon (`docker logs --since`, `docker exec … sha256sum`),
    not over SSH: the sshd's command log still counts only the tool's commands."""
    from fleetpatch_demo.images import SGL_CHECKOUT
    c = fleet.hosts[name].container_name
    logs = fleet.docker_cli("logs", "--since", f"{since:.9f}", c, check=False, timeout=60)
    paths = {f"{SGL_CHECKOUT}/{f}": f for f in files}
    sums = fleet.docker_cli("exec", c, "sha256sum", *paths, check=False, timeout=60)
    got = {}
    for line in sums.stdout.splitlines():
        sha, _, path = line.partition("  ")
        if path in paths:
            got[paths[path]] = sha
    return logs.stdout + logs.stderr, got


def reset_keeping_agent_cache(fleet: Fleet) -> None:
    """Every host back to pristine (engine files, logs, server, fleetpatch's ledger and
    locks), except fleetpatch's agent compile cache in the state dir: on a fleet it has
    run on before the cache is there (it is per agent version, filled by the warm-up
    run), and a bench of repeated rollouts that wiped it would time a first run each time.
    The probe's site-dir answer (probe-site-cache.json) and the agent's answer of where the
    engine package is (package-cache.json) are kept for the same reason, and so is the probe's
    runtime compiled for the host's build (probe-code: per fleetpatch version and interpreter,
    kept by a real fleet from its first deploy on). The probe's per-patch work (probe-plans:
    the watched files rewritten and compiled) is wiped: every bench run times the first deploy
    of a new patch. A container host keeps them in the container's own state dir
    (state/containers/NAME/): kept there too (wiped, each container run timed the agent's
    compile of its modules, about 30 ms of CPU per host)."""
    kept = []
    for name, h in fleet.hosts.items():
        state = h.host_dir / "state"
        for i, folder in enumerate([state, *sorted((state / "containers").glob("*"))]):
            for keep in ("agent-cache", "probe-site-cache.json", "package-cache.json", "probe-code"):
                cache = folder / keep
                if not cache.exists():
                    continue
                aside = h.host_dir / f"{keep}.{i}.bench-keep"
                if aside.is_dir():
                    shutil.rmtree(aside, ignore_errors=True)
                cache.rename(aside)
                kept.append((aside, cache))
    try:
        fleet.reset_all()
    finally:
        for aside, cache in kept:
            cache.parent.mkdir(parents=True, exist_ok=True)
            aside.rename(cache)


def server_cpu_ms(fleet: Fleet, name: str) -> float | None:
    """CPU (user + sys, its reaped children's too) of the server now running on a plain host, from
    /proc/<pid>/stat; on a container host, of everything in the container since it started (its
    cgroup's: the runtime makes a new one at each start); None where it cannot be read."""
    if fleet.container_hosts:
        pid = fleet.server_pid(name)
        return container_cpu_ms(pid) if pid else None
    try:
        pid = int(fleet.hosts[name].pidfile.read_text().split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return round(1000.0 * sum(int(x) for x in fields[11:15]) / _HZ, 1)
    except (OSError, ValueError, IndexError):
        return None


def container_cpu_ms(pid: int) -> float | None:
    """CPU of the cgroup that `pid` is in (a container's, with all its processes), from cgroup v1's
    cpuacct (cpuacct.usage, ns) or v2's cpu.stat (usage_usec); None where neither can be read."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        try:
            if "cpuacct" in controllers.split(","):
                for mount in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
                    usage = Path(f"/sys/fs/cgroup/{mount}{path}/cpuacct.usage")
                    if usage.exists():
                        return round(int(usage.read_text()) / 1e6, 1)
            elif controllers == "":
                for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                    stat = Path(f"{root}{path}/cpu.stat")
                    if stat.exists():
                        for row in stat.read_text().splitlines():
                            if row.startswith("usage_usec "):
                                return round(int(row.split()[1]) / 1e3, 1)
        except (OSError, ValueError):
            continue
    return None


def healthy_soon(fleet: Fleet, name: str, within: float = 5.0) -> bool:
    """The baseline, pyinfra and Ansible stop at the marker, which the server logs a
    moment before it answers /health: give it that moment, bounded."""
    deadline = time.monotonic() + within
    while True:
        if fleet.healthy(name):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def check(fleet: Fleet, names, before: dict, expect: dict) -> dict:
    """The bench's own verdict per host: {name: [problems]} ([] = success)."""
    out = {}
    for n in names:
        h = fleet.hosts[n]
        bad = []
        if h.containerized:
            window, got = container_facts(fleet, n, before[n]["t"], expect)
            if fleet.container_id(n) != before[n]["container_id"]:
                bad.append("container re-created during the run (the patch would be lost)")
        else:
            try:
                window = h.log_path.read_bytes()[before[n]["log_size"]:].decode("utf-8", "replace")
            except OSError:
                window = ""
            got = {}
            for f in expect:
                try:
                    got[f] = sha256((h.site_packages / f).read_bytes())
                except OSError:
                    got[f] = None
        path = host_path(fleet, n)
        other = "EAGLEWorker" if path == "EAGLEWorkerV2" else "EAGLEWorkerV2"
        if MARKERS[path] not in window:
            bad.append(f"marker for {path} not in the log since the run started")
        if MARKERS[other] in window:
            bad.append(f"marker for {other} in the log (wrong path)")
        for f, want in expect.items():
            if got.get(f) != want:
                bad.append(f"{f} not patched")
        pid = fleet.server_pid(n)
        if not pid or pid == before[n]["pid"]:
            bad.append("server not restarted")
        elif not healthy_soon(fleet, n):
            bad.append("server not healthy")
        out[n] = bad
    return out


def sshd_side(fleet: Fleet, names, t_launch: float) -> dict:
    """Commands per host and when they started, relative to the tool's launch
    (time.time(); the wrapper stamps with `date +%s.%N` on the same clock)."""
    per = {}
    for n in names:
        recs = fleet.command_records(n)
        per[n] = {"count": len(recs), "at": [round(t - t_launch, 3) for t, _ in recs],
                  "kinds": [classify(c) for _, c in recs]}
    return per


def classify(cmd: str) -> str:
    c = cmd.strip()
    if "fleetpatch-agent" in c:
        return "fleetpatch-agent"
    if c.startswith("sh -s"):
        return "sh -s (baseline)"
    if c.startswith("scp -t"):
        return "scp -t (pyinfra upload)"
    if c.startswith("sh -c '") and "AnsiballZ" not in c:
        return "pyinfra sh -c: " + re.sub(r"\s+", " ", c)[7:50]
    if "AnsiballZ" in c or "ANSIBALLZ" in c or "python" in c:
        return "ansible module (python)"
    if c.startswith("/bin/sh -c") or c.startswith("sh -c"):
        return "ansible shell: " + re.sub(r"\s+", " ", c)[10:50]
    return re.sub(r"\s+", " ", c)[:60]


# ------------------------------------------------------------------ tools

def fleet_kind(fleet: Fleet) -> str:
    return "container" if fleet.container_hosts else "plain"


def run_fleetpatch(fleet: Fleet, names, wd: Path, tag: str, net: Net, src: Path | None = None,
                   probe: bool = True) -> dict:
    inv = write_inventory(fleet, names, wd / f"hosts-{fleet_kind(fleet)}-{len(names)}-{net.name}.yaml", net)
    report = wd / f"fleetpatch-{tag}.json"
    argv = [str(fleetpatch_python()), "-m", "fleetpatch", "rollout", "--patch", PATCH, "--group", "all",
            "--canary", "0", "--report", str(report), "--inventory", str(inv)] + ([] if probe else ["--no-probe"])
    t_launch = time.time()
    t0 = time.monotonic()
    # the venv's python; src: another checkout's fleetpatch first on its path (--fleetpatch-before)
    env = {**fleetpatch_env(src), "COLUMNS": "200"}
    code, out, printed = run_stamped(argv, wd, env)
    wall = time.monotonic() - t0
    doc = json.loads(report.read_text()) if report.exists() else {"hosts": {}}
    hosts = {}
    for n in names:
        r = doc["hosts"].get(n, {})
        hosts[n] = {"ok": bool(r.get("ok")), "status": r.get("status"), "duration_s": r.get("duration_s"),
                    "round_trips": r.get("round_trips"), "verdict_after_s": r.get("verdict_after_s"),
                    "marker_to_verdict_s": r.get("marker_to_verdict_s"),
                    "probe_timings": r.get("probe_timings"), "apply_timings": r.get("apply_timings"),
                    "follow_timings": r.get("follow_timings")}
        proof = proof_at(fleet, n) if probe else None
        if proof is not None and n in printed:
            hosts[n]["verdict_latency_s"] = round(printed[n] - proof, 3)
    return {"wall_s": wall, "t_launch": t_launch, "exit": code, "hosts": hosts,
            "output_tail": out[-2500:] if code else ""}


def run_stamped(argv, wd: Path, env: dict) -> tuple[int, str, dict]:
    """Run fleetpatch, noting when each host's `done` line is printed (the verdict printed):
    (exit code, its output, {host: epoch of its done line})."""
    p = subprocess.Popen(argv, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, printed = [], {}
    timer = threading.Timer(TOOL_TIMEOUT, p.kill)
    timer.start()
    try:
        for line in p.stdout:
            at = time.time()
            lines.append(line)
            m = DONE_LINE.match(line)
            if m and m.group(1) not in printed:
                printed[m.group(1)] = at
        code = p.wait()
    finally:
        timer.cancel()
    return code, "".join(lines), printed


DONE_LINE = re.compile(r"^\d\d:\d\d:\d\d (\S+)\s+done\b")


def proof_at(fleet: Fleet, name: str) -> float | None:
    """When the proof existed on a plain host: the earliest record of an added line that ran
    (the probe's records carry the time they were written; None on a container host, whose
    records are inside the container, or where there is none)."""
    h = fleet.hosts[name]
    if getattr(h, "container", False) or fleet.container_hosts:
        return None
    times = []
    for rec in (h.state_dir / "probe" / "records").glob("*/[LF]-*"):
        try:
            t = json.loads(rec.read_text()).get("t")
        except (OSError, ValueError):
            continue
        if isinstance(t, (int, float)):
            times.append(t)
    return min(times) if times else None


def server_urls(fleet: Fleet, name: str) -> tuple[str, str]:
    """(health URL, /generate URL) of a host's server: the health URL its inventory entry gives
    fleetpatch (server.health_url), /generate on the same scheme, host and port."""
    from urllib.parse import urlsplit, urlunsplit
    health = fleet.inventory()["hosts"][name]["server"]["health_url"]
    u = urlsplit(health)
    return health, urlunsplit((u.scheme, u.netloc, "/generate", "", ""))


def checks_data(fleet: Fleet, name: str) -> dict:
    """What the *-checks peers need for the checks fleetpatch makes after a restart."""
    health, generate = server_urls(fleet, name)
    return {"ready": READY_LINE, "health_url": health, "generate_url": generate,
            "smoke": json.dumps(SMOKE_BODY)}


def baseline_script(fleet: Fleet, name: str, diff_text: str, files: list[str], timeout: int = 60,
                    checks: bool = False) -> str:
    h = fleet.hosts[name]
    q = shlex.quote
    if h.containerized:   # the engine's checkout inside the container; no pidfile, log or start line
        from fleetpatch_demo import containerhost
        from fleetpatch_demo.images import SGL_CHECKOUT
        assigns = {"SP": SGL_CHECKOUT, "CONTAINER": h.container_name, "LOG": "", "PIDFILE": "", "WORKDIR": "",
                   "START": "", "GRACE": str(containerhost.STOP_GRACE)}
    else:
        assigns = {"SP": h.remote_site_packages, "CONTAINER": "", "LOG": h.remote_log, "PIDFILE": h.remote_pidfile,
                   "WORKDIR": h.mount_point, "START": start_line(fleet, name), "GRACE": "10"}
    assigns.update({"MARKER": MARKERS[host_path(fleet, name)], "TIMEOUT": str(timeout),
                    "CHANGED": " ".join(files), "CHECKS": "1" if checks else "0"})
    if checks:
        assigns.update({k.upper(): v for k, v in checks_data(fleet, name).items()})
    text = (BENCH / "baseline.sh").read_text()
    if "\nFLEETPATCH_BENCH_DIFF_EOF\n" in "\n" + diff_text:
        raise SystemExit("the diff contains the heredoc delimiter")
    lines = text.split("\n")
    if lines.count("@VARS@") != 1 or lines.count("@DIFF@") != 1:
        raise SystemExit("bench/baseline.sh must hold the lines @VARS@ and @DIFF@ once each")
    lines[lines.index("@VARS@")] = "\n".join(f"{k}={q(v)}" for k, v in assigns.items())
    lines[lines.index("@DIFF@")] = diff_text.rstrip("\n")
    return "\n".join(lines)


def run_baseline(fleet: Fleet, names, wd: Path, tag: str, diff_text: str, files: list[str], net: Net,
                 opts: list | None = None, checks: bool = False) -> dict:
    scripts = {n: baseline_script(fleet, n, diff_text, files, checks=checks) for n in names}
    results: dict = {}
    t_launch = time.time()
    t0 = time.monotonic()

    def one(n):
        s = time.monotonic()
        p = subprocess.run(net.ssh_argv(fleet, n, "sh -s", opts=opts), input=scripts[n], capture_output=True, text=True,
                           timeout=TOOL_TIMEOUT)
        results[n] = {"ok": p.returncode == 0, "exit": p.returncode, "duration_s": round(time.monotonic() - s, 3),
                      "stderr": p.stderr[-600:] if p.returncode else ""}

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    code = 0 if all(r["ok"] for r in results.values()) else 1
    tail = "\n".join(f"{n}: exit {r['exit']}: {r['stderr']}" for n, r in results.items() if not r["ok"])
    return {"wall_s": wall, "t_launch": t_launch, "exit": code, "hosts": results, "output_tail": tail[-2500:]}


def ansible_files(fleet: Fleet, names, wd: Path, files: list[str], cp_dir: Path, net: Net) -> tuple[Path, Path]:
    d = wd / "ansible"
    d.mkdir(exist_ok=True)
    hosts = {}
    for n in names:
        h = fleet.hosts[n]
        hosts[n] = {
            "ansible_host": "127.0.0.1", "ansible_port": net.ports[n], "ansible_user": "root",
            "ansible_ssh_private_key_file": str(fleet.identity),
            "ansible_ssh_common_args": (f"-o UserKnownHostsFile={net.known_hosts} -o StrictHostKeyChecking=yes "
                                        "-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o BatchMode=yes"),
            "ansible_python_interpreter": "/usr/bin/python3",
            "fp_diff": str(DIFF), "fp_remote_diff": f"{h.remote_home}/{PATCH}.diff",
            "fp_site_packages": h.remote_site_packages, "fp_changed": files,
            "fp_pidfile": h.remote_pidfile, "fp_log": h.remote_log, "fp_workdir": h.mount_point,
            "fp_grace": 10, "fp_start": start_line(fleet, n), "fp_marker": MARKERS[host_path(fleet, n)],
        }
    inv = d / f"inventory-{len(names)}-{net.name}.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}, sort_keys=False))
    cfg = d / f"ansible-{len(names)}-{net.name}.cfg"
    cfg.write_text("\n".join([
        "[defaults]",
        f"forks = {len(names)}",
        "host_key_checking = True",
        "gathering = explicit",
        "retry_files_enabled = False",
        "interpreter_python = /usr/bin/python3",
        f"local_tmp = {d / 'tmp'}",
        "[ssh_connection]",
        "pipelining = True",
        "ssh_args = -o ControlMaster=auto -o ControlPersist=60s",
        f"control_path_dir = {cp_dir}",
        # the test fleet's ForceCommand wrapper runs every request as a shell
        # command, so the sftp subsystem cannot work: copy through the shell (dd)
        "transfer_method = piped",
        "",
    ]))
    return inv, cfg


def run_ansible(fleet: Fleet, names, wd: Path, tag: str, files: list[str], net: Net) -> dict:
    cp_dir = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))  # short: unix socket paths are limited
    inv, cfg = ansible_files(fleet, names, wd, files, cp_dir, net)
    env = {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOME": str(wd / "ansible" / "home"),
           "ANSIBLE_DEPRECATION_WARNINGS": "False"}
    argv = [ansible_playbook(), "-i", str(inv), str(BENCH / "playbook.yml")]
    t_launch = time.time()
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT, env=env, cwd=wd)
        wall = time.monotonic() - t0
    finally:
        close_masters(cp_dir)
    out = p.stdout + p.stderr
    hosts = {}
    for n in names:
        m = re.search(rf"^{re.escape(n)}\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out, re.M)
        ok = bool(m) and m.group(3) == "0" and m.group(4) == "0"
        hosts[n] = {"ok": ok, "recap": m.group(0) if m else None}
    return {"wall_s": wall, "t_launch": t_launch, "exit": p.returncode, "hosts": hosts,
            "output_tail": out[-2500:] if p.returncode else ""}


def run_pyinfra(fleet: Fleet, names, wd: Path, tag: str, files: list[str], net: Net, checks: bool = False) -> dict:
    d = wd / "pyinfra"
    d.mkdir(exist_ok=True)
    hosts = []
    for n in names:
        h = fleet.hosts[n]
        # pyinfra-checks: the follow operation also does fleetpatch's checks (empty values otherwise)
        extra = checks_data(fleet, n) if checks else dict.fromkeys(("ready", "health_url", "generate_url", "smoke"), "")
        hosts.append((n, {
            "ssh_hostname": "127.0.0.1", "ssh_port": net.ports[n], "ssh_user": "root",
            "ssh_key": str(fleet.identity), "ssh_allow_agent": False, "ssh_look_for_keys": False,
            # strict: a host key that is not in this file fails the host (no auto-add)
            "ssh_known_hosts_file": str(net.known_hosts), "ssh_strict_host_key_checking": "yes",
            "ssh_config_file": "/dev/null",
            # the test fleet's ForceCommand wrapper runs every request as a shell command,
            # so the sftp subsystem cannot work: scp is an exec request (`scp -t …`)
            "ssh_file_transfer_protocol": "scp",
            "fp_diff": str(DIFF), "fp_remote_diff": f"{h.remote_home}/{PATCH}.diff",
            "fp_site_packages": h.remote_site_packages, "fp_changed": files,
            "fp_pidfile": h.remote_pidfile, "fp_log": h.remote_log, "fp_workdir": h.mount_point,
            "fp_grace": 10, "fp_start": start_line(fleet, n), "fp_marker": MARKERS[host_path(fleet, n)],
            "fp_offset_file": f"{h.remote_home}/{PATCH}.log-offset",
            "fp_temp_dir": h.remote_home,
            "fp_checks": checks, **{f"fp_{k}": v for k, v in extra.items()},
        }))
    kind = "_checks" if checks else ""
    inv = d / f"inventory{kind}_{len(names)}_{net.name}.py"
    inv.write_text("# written by bench/run.py\nhosts = " + repr(hosts) + "\n")
    # --no-wait: each host goes through the operations at its own pace (no barrier
    # between operations), the fastest pyinfra can run this
    argv = [str(pyinfra_bin()), "-y", "--no-wait", "--parallel", str(len(names)), str(inv),
            str(BENCH / "pyinfra_deploy.py")]
    t_launch = time.time()
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT, cwd=d,
                       env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    wall = time.monotonic() - t0
    out = p.stdout + p.stderr
    (d / f"output{kind}-{tag}-{net.name}.txt").write_text(out)
    hosts_ok = {}
    n_ops = len(re.findall(r"^(files\.put|server\.shell)\(", (BENCH / "pyinfra_deploy.py").read_text(), re.M))
    for n in names:
        # pyinfra prints "[h03] Success" per host and operation, and names a failing host
        # in an error line; a host is ok when every operation succeeded on it
        wins = len(re.findall(rf"^\s*\[{re.escape(n)}\] Success\s*$", out, re.M))
        failed = re.search(rf"^\s*\[{re.escape(n)}\].*(Error|error|failed|Failed)", out, re.M)
        hosts_ok[n] = {"ok": wins == n_ops and not failed, "ops_ok": wins}
    return {"wall_s": wall, "t_launch": t_launch, "exit": p.returncode, "hosts": hosts_ok,
            "output_tail": out[-2500:] if p.returncode else ""}


def close_masters(cp_dir: Path) -> None:
    """Ansible leaves its ControlPersist masters running; stop them so no run
    starts with a warm connection (and no process is left behind)."""
    for sock in cp_dir.iterdir() if cp_dir.exists() else []:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=10)
    shutil.rmtree(cp_dir, ignore_errors=True)


def run_instrumented(fleet: Fleet, names, wd: Path, net: Net) -> dict:
    kind = fleet_kind(fleet)
    inv = write_inventory(fleet, names, wd / f"hosts-{kind}-{len(names)}-{net.name}.yaml", net)
    out = wd / f"instrumented-{kind}-{len(names)}.json"
    report = wd / f"instrumented-report-{kind}-{len(names)}.json"
    argv = [str(fleetpatch_python()), str(BENCH / "fp_instrumented.py"), str(out), "--", "rollout", "--patch", PATCH,
            "--group", "all", "--canary", "0", "--report", str(report), "--inventory", str(inv)]
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=wd, capture_output=True, text=True, timeout=TOOL_TIMEOUT, env=fleetpatch_env())
    wall = time.monotonic() - t0
    doc = json.loads(out.read_text()) if out.exists() else {"hosts": {}, "exit": p.returncode}
    rep = json.loads(report.read_text()) if report.exists() else {"hosts": {}}
    doc["wall_s"] = wall
    for n, r in rep.get("hosts", {}).items():
        doc["hosts"].setdefault(n, {})["report"] = {k: r.get(k) for k in ("ok", "duration_s", "verdict_after_s")}
    if p.returncode:
        doc["stderr"] = p.stderr[-2000:]
    return doc


def startup_times(reps: int = 3, fleetpatch_too: bool = True) -> dict:
    """Interpreter + import cost of each tool doing nothing (--version), each from where the bench
    runs it; and a bare start (`-c pass`) of the machine's interpreter and of fleetpatch's venv's."""
    out = {}
    env = fleetpatch_env()
    for tool, argv in (("fleetpatch", [str(fleetpatch_python()), "-m", "fleetpatch", "--version"]),
                       ("pyinfra", [str(pyinfra_bin()), "--version"]),
                       ("ansible", [ansible_playbook() or "ansible-playbook", "--version"]),
                       ("`python -c pass` (the machine's)", [sys.executable, "-c", "pass"]),
                       ("`python -c pass` (fleetpatch's venv)", [str(fleetpatch_python()), "-c", "pass"])):
        if not Path(argv[0]).exists() and not shutil.which(argv[0]):
            continue
        if argv[0] == str(fleetpatch_python()) and not fleetpatch_too:   # not installed by this run
            continue
        ts = []
        for _ in range(reps):
            t = time.monotonic()
            subprocess.run(argv, capture_output=True, env=env)
            ts.append(time.monotonic() - t)
        out[tool] = round(med(ts), 3)
    return out


def first_connect_times(fleet: Fleet, wd: Path, reps: int = 5) -> dict:
    """Launch of the process to its first TCP connect to the host, for `fleetpatch
    rollout` (1 host) and for the baseline's `ssh`: a listener of the bench's own
    stands in for the host's port and notes when the connection arrives, then
    closes it (the tool then fails on a host that is not SSH; it is killed)."""
    name = fleet.names[0]
    out = {}
    for tool in ("fleetpatch", "ssh"):
        ts = []
        for _ in range(reps):
            with socket.create_server(("127.0.0.1", 0)) as lsock:
                lsock.settimeout(10)
                net = Net("first-connect", {name: lsock.getsockname()[1]}, fleet.known_hosts)
                if tool == "fleetpatch":
                    inv = write_inventory(fleet, [name], wd / "hosts-first-connect.yaml", net)
                    argv = [str(fleetpatch_python()), "-m", "fleetpatch", "rollout", "--patch", PATCH,
                            "--group", "all", "--canary", "0", "--inventory", str(inv)]
                else:
                    argv = net.ssh_argv(fleet, name, "true")
                t0 = time.monotonic()
                p = subprocess.Popen(argv, cwd=wd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=fleetpatch_env())
                try:
                    conn, _ = lsock.accept()
                    ts.append(time.monotonic() - t0)
                    conn.close()
                except OSError:   # no connection within 10 s: counted as missing
                    pass
                finally:
                    p.kill()
                    p.wait()
        out[tool] = {"median_s": round(med(ts), 3) if ts else None, "runs_s": [round(t, 3) for t in ts]}
    return out


def container_ops(cfleet: Fleet, pfleet: Fleet | None, n: int, reps: int = 3) -> dict:
    """Where a container host's rollout spends time a plain host's does not: the runtime
    commands fleetpatch's agent runs on a container host (agent/container.py: `inspect` once
    per request, `stop -t GRACE` + `start` at the restart, `logs --since --follow` for the
    log), timed by the bench in the host's mount namespace with the host's docker CLI and
    socket, as the agent runs them, but not over SSH (the command logs are untouched).
    One host alone, then the restart on n hosts at once (as a rollout does); and for
    comparison the same restart of a plain host's server (TERM and wait, start), to /health.
    Medians in seconds."""
    from fleetpatch_demo import containerhost

    def rt(fleet, name, *argv):
        t = time.monotonic()
        p = fleet.run_in_host(name, *argv, capture_output=True, text=True, timeout=120)
        if p.returncode:
            raise SystemExit(f"bench: {' '.join(argv)} on {name}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        return time.monotonic() - t

    def to_health(fleet, name, t0, within=60.0):
        while not fleet.healthy(name, timeout=0.5):
            if time.monotonic() - t0 > within:
                return None
            time.sleep(0.01)
        return time.monotonic() - t0

    def c_restart(name):
        c = cfleet.hosts[name].container_name
        t0 = time.monotonic()
        stop = rt(cfleet, name, "docker", "stop", "-t", str(containerhost.STOP_GRACE), "--", c)
        t1 = time.monotonic()
        start = rt(cfleet, name, "docker", "start", "--", c)
        return {"stop_s": stop, "start_s": start, "start_to_health_s": to_health(cfleet, name, t1),
                "restart_to_health_s": time.monotonic() - t0}

    def p_restart(name):
        t0 = time.monotonic()
        pfleet.stop_server(name)
        stop = time.monotonic() - t0
        t1 = time.monotonic()
        pfleet.start_server(name)
        start = time.monotonic() - t1
        return {"stop_s": stop, "start_s": start, "start_to_health_s": to_health(pfleet, name, t1),
                "restart_to_health_s": time.monotonic() - t0}

    def medians(recs):
        return {k: round(med([r[k] for r in recs]), 3) for k in recs[0]}

    def at_once(fn, names):
        out = {}
        b0 = cpu_busy()
        t = time.monotonic()
        threads = [threading.Thread(target=lambda m=m: out.__setitem__(m, fn(m))) for m in names]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.monotonic() - t
        # CPU the whole machine spent meanwhile (both cores; the daemon, runc, the servers' starts)
        busy = round((cpu_busy()[0] - b0[0]) / _HZ, 2)
        return {"wall_s": round(wall, 3), "machine_cpu_s": busy, **medians(list(out.values()))}

    reset_keeping_agent_cache(cfleet)
    wait_quiet(30)
    name = cfleet.names[0]
    c = cfleet.hosts[name].container_name
    res = {"host": name, "reps": reps}
    cpu0 = children_cpu()
    res["inspect_s"] = round(med([rt(cfleet, name, "docker", "inspect", "--type", "container", "--", c)
                                  for _ in range(5)]), 3)
    # CPU of one `docker inspect` on the controller's side (nsenter + the docker CLI, a Go
    # program): what each runtime command costs the machine before the daemon does anything
    res["inspect_cli_cpu_s"] = round((children_cpu() - cpu0) / 5, 3)
    insp = {}
    t = time.monotonic()
    threads = [threading.Thread(target=lambda m=m: insp.__setitem__(m, rt(
        cfleet, m, "docker", "inspect", "--type", "container", "--", cfleet.hosts[m].container_name)))
        for m in cfleet.names[:n]]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    res[f"inspect_{n}_at_once"] = {"wall_s": round(time.monotonic() - t, 3), "median_s": round(med(insp.values()), 3)}
    since = f"{time.time() - 3600:.9f}"
    res["logs_since_s"] = round(med([rt(cfleet, name, "docker", "logs", "--timestamps", "--since", since, "--", c)
                                     for _ in range(5)]), 3)
    res["python3_on_host_s"] = round(med([rt(cfleet, name, "python3", "-S", "-c", "pass") for _ in range(5)]), 3)
    res["container_restart_1"] = medians([c_restart(name) for _ in range(reps)])
    res[f"container_restart_{n}_at_once"] = at_once(c_restart, cfleet.names[:n])
    if pfleet is not None:
        reset_keeping_agent_cache(pfleet)
        wait_quiet(30)
        res["plain_restart_1"] = medians([p_restart(pfleet.names[0]) for _ in range(reps)])
        res[f"plain_restart_{n}_at_once"] = at_once(p_restart, pfleet.names[:n])
    return res


# ------------------------------------------------------------------ report

def spread(xs) -> float | None:
    """Run-to-run spread: (max - min) / median, in %."""
    xs = [x for x in xs if x is not None]
    return round(100.0 * (max(xs) - min(xs)) / med(xs), 1) if len(xs) > 1 and med(xs) else None


def summarize(runs: list[dict], sizes: list[int], nets=NETS, fleets=("plain",)) -> dict:
    summary = {}
    reference_ms = gauge_reference(runs)
    for fleet, net, n, tool in ((f, net, n, t) for f in fleets for net in nets for n in sizes for t in TOOLS):
        rs = [r for r in runs if r["size"] == n and r["tool"] == tool and r.get("net", "loopback") == net
              and r.get("fleet", "plain") == fleet]
        if not rs:
            continue
        s = {"runs": len(rs), "wall_s": [round(r["wall_s"], 3) for r in rs],
             "wall_median_s": round(med([r["wall_s"] for r in rs]), 3),
             "wall_spread_pct": spread([r["wall_s"] for r in rs]),
             "gauge_ms": [r.get("gauge_ms") for r in rs],
             "wall_at_reference_s": [round(w, 3) if w else None for w in
                                     (at_reference(r["wall_s"], r.get("gauge_ms"), reference_ms) for r in rs)],
             "commands_per_host": sorted({c for r in rs for c in r["commands_per_host"]}),
             "commands_per_host_median": med([c for r in rs for c in r["commands_per_host"]]),
             "tool_ok": [r["tool_ok"] for r in rs], "checked_ok": [r["checked_ok"] for r in rs],
             "controller_cpu_median_s": round(med([r["controller_cpu_s"] for r in rs]), 3),
             "server_cpu_median_ms": med([c for r in rs for c in r.get("server_cpu_ms") or []]),
             "controller_cpu_per_host_ms": round(1000 * med([r["controller_cpu_s"] for r in rs]) / n, 1),
             "host_cpu_per_host_ms": (round(1000 * med([r["host_cpu_s"] for r in rs]) / n, 1)
                                      if all(r.get("host_cpu_s") is not None for r in rs) else None),
             "machine_busy_median_pct": med([r["machine_busy_pct"] for r in rs]),
             "foreign_cpu_median_s": med([r["foreign_cpu_s"] for r in rs]),
             "foreign_cpu_max_s": max(r["foreign_cpu_s"] for r in rs),
             "docker_cpu_median_s": med([r.get("docker_cpu_s") for r in rs]),
             "loadavg_before": [r.get("loadavg_before") for r in rs],
             "first_cmd_median_s": med([med([a[0] for a in r["cmd_at"] if a]) for r in rs]),
             "last_cmd_median_s": med([med([a[-1] for a in r["cmd_at"] if a]) for r in rs])}
        if tool.startswith("fleetpatch"):
            hs = [h for r in rs for h in r["hosts"].values()]
            s.update(fleetpatch_host_figures(hs))
            s["host_duration_median_s"] = med([h.get("duration_s") for h in hs])
            s["host_duration_max_s"] = max((h.get("duration_s") or 0) for h in hs)
            s["round_trips"] = sorted({h.get("round_trips") for h in hs if h.get("round_trips") is not None})
            s["verdict_after_median_s"] = med([h.get("verdict_after_s") for h in hs])
            # sshd-side phases: launch -> probe, probe -> apply, apply -> follow, follow -> exit
            ph = {"to_probe": [], "probe_to_apply": [], "apply_to_follow": [], "follow_to_exit": []}
            for r in rs:
                for at in r["cmd_at"]:
                    if len(at) == 1:   # one agent per host: launch -> its command -> exit
                        ph["to_probe"].append(at[0])
                        ph["follow_to_exit"].append(r["wall_s"] - at[0])
                    if len(at) == 3:
                        ph["to_probe"].append(at[0])
                        ph["probe_to_apply"].append(at[1] - at[0])
                        ph["apply_to_follow"].append(at[2] - at[1])
                        ph["follow_to_exit"].append(r["wall_s"] - at[2])
            s["sshd_phases_median_s"] = {k: round(med(v), 3) if v else None for k, v in ph.items()}
        summary[skey(net, tool, n, fleet)] = s
    # container hosts against plain hosts: the medians' ratio, and each repeat's ratio (the
    # two runs of one repeat ran back to back, so the machine's load was much the same)
    if "container" in fleets and "plain" in fleets:
        for net, n, tool in ((net, n, t) for net in nets for n in sizes for t in CONTAINER_TOOLS):
            c, p = summary.get(skey(net, tool, n, "container")), summary.get(skey(net, tool, n))
            if not c or not p:
                continue
            pairs = {}
            for r in runs:
                if r["size"] == n and r["tool"] == tool and r.get("net", "loopback") == net:
                    rep = r["tag"].split("-")[1]
                    pairs.setdefault(rep, {})[r.get("fleet", "plain")] = r["wall_s"]
            per = [round(v["container"] / v["plain"], 3) for _, v in sorted(pairs.items())
                   if "container" in v and "plain" in v]
            summary[f"container/plain:{net}/{tool}@{n}"] = {
                "ratio_of_medians": round(c["wall_median_s"] / p["wall_median_s"], 3),
                "ratio_per_repeat": per, "ratio_per_repeat_median": med(per),
                "container_median_s": c["wall_median_s"], "plain_median_s": p["wall_median_s"],
                "added_median_s": round(c["wall_median_s"] - p["wall_median_s"], 3)}
    return summary


def verdict_and_cpu_table(s: dict, fleets, nets, sizes) -> list[str]:
    """Issue 34's side-by-side figures: the verdict latency, the phases each host timed, and the
    CPU per host on the controller and on the hosts, for every tool."""
    lines = ["", "Verdict latency (the earliest probe record of an added line on the host -> that host's "
             "`done` line printed; medians over hosts, max in brackets) and the phases each host timed "
             "(the agent's age at its first request, pre-flight read, write, probe install, stop, whole restart; "
             "since 2026-12-07 11:00 the probe's install runs after the old server's TERM, inside stop and restart), "
             "and the agent process's own CPU per host by its last reply (`agent_cpu_s`, ms):", "",
             "| net | hosts | tool | verdict latency (max) | agent start | pre-flight | write | probe install | stop | "
             "restart | agent CPU per host |", "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for fl, net, n, tool in ((fl, net, n, t) for fl in fleets for net in nets for n in sizes for t in TOOLS):
        x = s.get(skey(net, tool, n, fl))
        if not x or not tool.startswith("fleetpatch"):
            continue
        ph = x.get("host_phases_median_s") or {}
        where = net if fl == "plain" else f"{net}, {fl} hosts"
        lat = (f"{fmt(x.get('verdict_latency_median_s'))} ({fmt(x.get('verdict_latency_max_s'))})"
               if x.get("verdict_latency_hosts") else "-")
        lines.append(f"| {where} | {n} | {tool} | {lat} | " + " | ".join(fmt(ph.get(k)) for k in (
            "agent_age_s", "probe_s", "write_s", "probe_install_s", "stop_s", "restart_s"))
                     + f" | {fmt(ph['agent_cpu_s'] * 1000, 0) if ph.get('agent_cpu_s') is not None else '-'} |")
    lines += ["", "CPU per host (ms): the tool's own processes on the controller / the hosts' side (the machine's "
              "busy CPU less the tool's and other sessions'; approximate), medians over the runs:", "",
              "| net | hosts | " + " | ".join(TOOLS) + " |", "| --- | ---: |" + " --- |" * len(TOOLS)]
    for fl, net, n in ((fl, net, n) for fl in fleets for net in nets for n in sizes):
        cells = []
        for tool in TOOLS:
            x = s.get(skey(net, tool, n, fl))
            cells.append(f"{fmt(x.get('controller_cpu_per_host_ms'))} / {fmt(x.get('host_cpu_per_host_ms'))}"
                         if x else "-")
        lines.append(f"| {net if fl == 'plain' else f'{net}, {fl} hosts'} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "CPU of each new server from its start to the end of the run (ms, /proc/PID/stat; on container "
              "hosts the container's cgroup, every process in it; the probe's cost per server start is the "
              "fleetpatch / fleetpatch-noprobe difference):", "",
              "| net | hosts | " + " | ".join(TOOLS) + " |", "| --- | ---: |" + " --- |" * len(TOOLS)]
    for fl, net, n in ((fl, net, n) for fl in fleets for net in nets for n in sizes):
        cells = [fmt((s.get(skey(net, tool, n, fl)) or {}).get("server_cpu_median_ms"), 0) for tool in TOOLS]
        lines.append(f"| {net if fl == 'plain' else f'{net}, {fl} hosts'} | {n} | " + " | ".join(cells) + " |")
    return lines


def fleetpatch_host_figures(hs: list) -> dict:
    """Medians over hosts of the verdict latency (proof on the host -> its verdict printed) and
    of the phases each host timed itself (the agent's age at its first request, the pre-flight
    read, the write, the probe's install, the stop, the rest of the restart)."""
    lat = [h["verdict_latency_s"] for h in hs if h.get("verdict_latency_s") is not None]
    out = {"verdict_latency_median_s": round(med(lat), 3) if lat else None,
           "verdict_latency_max_s": max(lat) if lat else None, "verdict_latency_hosts": len(lat),
           "marker_to_verdict_median_s": med([h.get("marker_to_verdict_s") for h in hs])}
    phases = {}
    for h in hs:
        for k, v in list((h.get("probe_timings") or {}).items()) + list((h.get("apply_timings") or {}).items()):
            if isinstance(v, (int, float)) and k != "agent_cpu_s":   # each reply's CPU so far: not a phase
                phases.setdefault(k, []).append(v)
        # the agent's own CPU by its last reply of the deploy (follow's end; else the latest it sent)
        cpu = [(h.get(t) or {}).get("agent_cpu_s") for t in ("follow_timings", "apply_timings", "probe_timings")]
        cpu = next((c for c in cpu if isinstance(c, (int, float))), None)
        if cpu is not None:
            phases.setdefault("agent_cpu_s", []).append(cpu)
    out["host_phases_median_s"] = {k: round(med(v), 3) for k, v in phases.items()}
    return out


def instrumented_summary(doc: dict) -> dict:
    hosts = doc.get("hosts", {})
    conn = [h.get("connect_s") for h in hosts.values() if h.get("connect_s")]
    ops: dict = {}
    for h in hosts.values():
        for c in h.get("calls", []):
            ops.setdefault(c["op"], []).append(c)
    return {
        "exit": doc.get("exit"), "wall_s": round(doc.get("wall_s", 0), 3), "import_s": doc.get("import_s"),
        "in_process_total_s": doc.get("total_s"),
        "connect_median_s": round(med(conn), 3) if conn else None,
        "connect_max_s": round(max(conn), 3) if conn else None,
        "ops": {op: {"count": len(cs), "median_s": round(med([c["s"] for c in cs]), 3),
                     "max_s": round(max(c["s"] for c in cs), 3),
                     "sent_median_B": int(med([c["sent"] for c in cs])),
                     "recv_median_B": int(med([c["recv"] for c in cs]))} for op, cs in ops.items()},
        "verdict_after_median_s": med([h.get("report", {}).get("verdict_after_s") for h in hosts.values()]),
    }


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


NET_TITLES = {"loopback": "loopback (no added delay)", "delay": "through the delay proxy"}


def net_title(res: dict, net: str) -> str:
    if net == "delay":
        d = res.get("delay") or {}
        return (f"through the delay proxy: {d.get('delay_ms', 0):g} ms each way, "
                f"measured round trip {fmt(d.get('rtt_ms'), 1)} ms")
    return "loopback (no added delay)"


def tables(res: dict) -> str:
    s, sizes = res["summary"], res["sizes"]
    nets = res.get("nets", ["loopback"])
    fleets = res.get("fleets", ["plain"])
    rows = [(f, t) for f in fleets for t in TOOLS]   # (fleet, tool), plain hosts' first
    label = lambda f, t: t if f == "plain" else f"{t} on {f} hosts"
    lines = []
    for net in nets:
        lines.append(f"### {net_title(res, net)}")
        lines.append("")
        lines.append("| hosts | tool | wall time, median (all runs) | spread | vs baseline | remote commands / host "
                     "(sshd side) | controller CPU | machine busy | other CPU (max) | hosts ok (tool / bench check) |")
        lines.append("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for n in sizes:
            base = s.get(f"{net}/baseline@{n}")
            for fl, tool in rows:
                x = s.get(skey(net, tool, n, fl))
                if not x:
                    continue
                walls = ", ".join(f"{w:.2f}" for w in x["wall_s"])
                cmds = "/".join(str(c) for c in x["commands_per_host"])
                oks = " ".join(f"{a}/{b}" for a, b in zip(x["tool_ok"], x["checked_ok"]))
                rel = f"{x['wall_median_s'] / base['wall_median_s']:.2f}x" if base else "-"
                sp = "-" if x.get("wall_spread_pct") is None else f"{x['wall_spread_pct']:.0f} %"
                lines.append(f"| {n} | {label(fl, tool)} | **{x['wall_median_s']:.2f} s** ({walls}) | {sp} | {rel} | {cmds} | "
                             f"{x['controller_cpu_median_s']:.2f} s | {x['machine_busy_median_pct']:.0f} % | "
                             f"{x['foreign_cpu_median_s']:.2f} s ({x['foreign_cpu_max_s']:.2f}) | {oks} (of {n}) |")
        lines.append("")
        lines += speed_lines(res, net)
        lines += container_lines(res, net)
        pairs = []
        for n in sizes:
            fp, c2 = s.get(f"{net}/fleetpatch@{n}"), s.get(f"{net}/baseline-c25519@{n}")
            if fp and c2:
                pairs.append(f"{n} hosts {fp['wall_median_s'] / c2['wall_median_s']:.2f}x")
        if pairs:
            lines.append("fleetpatch vs baseline-c25519 (the same one-ssh script with paramiko's key exchange): "
                         + ", ".join(pairs) + ".")
            lines.append("")
        ba = []
        for n in sizes:
            fp, old = s.get(f"{net}/fleetpatch@{n}"), s.get(f"{net}/fleetpatch-before@{n}")
            if fp and old:
                cmds = lambda x: "/".join(str(c) for c in x["commands_per_host"])
                ba.append(f"| {n} | {old['wall_median_s']:.2f} s | {fp['wall_median_s']:.2f} s | "
                          f"{fp['wall_median_s'] / old['wall_median_s']:.2f}x | {cmds(old)} → {cmds(fp)} |")
        if ba:
            commit = (res.get("tools") or {}).get("fleetpatch_before", "- at -").split(" at ", 1)[-1].split()[0]
            lines.append(f"Before / after on {net} (fleetpatch-before: {commit}):")
            lines.append("")
            lines.append("| hosts | before | after | after / before | remote commands / host |")
            lines.append("| ---: | ---: | ---: | ---: | --- |")
            lines += ba
            lines.append("")
    lines += checks_table(res)
    if "loopback" in nets and "delay" in nets:
        rtt = (res.get("delay") or {}).get("rtt_ms")
        lines.append("What the slow network adds (delay median - loopback median; in round trips of the measured "
                     f"{fmt(rtt, 1)} ms), and each tool's delay median over the baseline's plus two round trips:")
        lines.append("")
        lines.append("| hosts | tool | loopback | delay | added | added round trips | delay - (baseline + 2 RTT) |")
        lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for n in sizes:
            b = s.get(f"delay/baseline@{n}")
            for tool in TOOLS:
                lo, de = s.get(f"loopback/{tool}@{n}"), s.get(f"delay/{tool}@{n}")
                if not lo or not de:
                    continue
                add = de["wall_median_s"] - lo["wall_median_s"]
                rts = f"{add / (rtt / 1000):.1f}" if rtt else "-"
                over = (f"{de['wall_median_s'] - (b['wall_median_s'] + 2 * rtt / 1000):+.2f} s"
                        if b and rtt else "-")
                lines.append(f"| {n} | {tool} | {lo['wall_median_s']:.2f} s | {de['wall_median_s']:.2f} s | "
                             f"{add:+.2f} s | {rts} | {over} |")
        lines.append("")
    lines += lateness_table(res)
    lines.append("fleetpatch, per host (from its report and the sshd-side command timestamps; medians):")
    lines.append("")
    lines.append("| net | hosts | host duration_s (max) | round trips | launch → 1st command (probe) | probe → apply | "
                 "apply → follow (apply+restart) | last command → exit | verdict_after_s |")
    lines.append("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for fl, net, n in ((fl, net, n) for fl in fleets for net in nets for n in sizes):
        x = s.get(skey(net, "fleetpatch", n, fl))
        if not x:
            continue
        ph = x["sshd_phases_median_s"]
        where = net if fl == "plain" else f"{net}, {fl} hosts"
        lines.append(f"| {where} | {n} | {fmt(x['host_duration_median_s'])} ({fmt(x['host_duration_max_s'])}) | "
                     f"{'/'.join(map(str, x['round_trips']))} | {fmt(ph['to_probe'])} | {fmt(ph['probe_to_apply'])} | "
                     f"{fmt(ph['apply_to_follow'])} | {fmt(ph['follow_to_exit'])} | {fmt(x['verdict_after_median_s'])} |")
    lines += verdict_and_cpu_table(s, fleets, nets, sizes)
    ins = res.get("instrumented") or {}
    if ins:
        lines.append("")
        lines.append("fleetpatch, one instrumented in-process rollout per size and net (timers around `Remote.open`, "
                     "`Remote.call`/`stream`; bytes on the SSH channels; medians over hosts):")
        lines.append("")
        lines.append("| net | hosts | import | connect (max) | per op: s, sent/recv | total |")
        lines.append("| --- | ---: | ---: | ---: | --- | ---: |")
        for key, x in ins.items():
            net, _, n = key.rpartition("@") if "@" in key else ("loopback", "", key)
            if ":" in net:   # container:loopback@8
                fl, _, net = net.partition(":")
                net = f"{net}, {fl} hosts"
            ops = "; ".join(f"{name} ×{c['count']}: {c['median_s']:.2f} s, "
                            f"{c['sent_median_B'] / 1024:.0f}/{c['recv_median_B'] / 1024:.0f} KiB"
                            for name, c in x["ops"].items()) or "-"
            lines.append(f"| {net} | {n} | {fmt(x['import_s'])} | {fmt(x['connect_median_s'])} "
                         f"({fmt(x['connect_max_s'])}) | {ops} | {fmt(x['in_process_total_s'])} |")
    co = res.get("container_ops") or {}
    if co:
        lines.append("")
        lines += container_ops_lines(co)
    st = res.get("startup") or {}
    if st:
        lines.append("")
        lines.append("Tool start-up alone (`--version`, median of 3): "
                     + ", ".join(f"{k} {v:.3f} s" for k, v in st.items()) + ".")
    fc = res.get("first_connect") or {}
    if fc.get("fleetpatch", {}).get("median_s") is not None:
        lines.append("")
        lines.append("Launch to the first TCP connect to the host (`fleetpatch rollout`, 1 host; the baseline's "
                     "`ssh`; median, each run's figure in brackets): "
                     + ", ".join(f"{k} {v['median_s']:.3f} s ({', '.join(f'{t:.3f}' for t in v['runs_s'])})"
                                 for k, v in fc.items() if v.get("median_s") is not None) + ".")
    return "\n".join(lines)


def gauge_reference(runs: list[dict]) -> float | None:
    """The speed every run's wall time is brought to (speedgauge.py): the median gauge of all the runs."""
    return med([r.get("gauge_ms") for r in runs])


def gauge_fit(runs: list[dict]) -> dict:
    """{hosts: Pearson's r} between each run's gauge and the median CPU of its new servers (the same
    stand-in start in every run), per size (a server's CPU grows with the hosts beside it): how
    much of the servers' CPU the machine's speed explains."""
    out = {}
    for n in sorted({r["size"] for r in runs}):
        pairs = [(r.get("gauge_ms"), med(r.get("server_cpu_ms") or [])) for r in runs if r["size"] == n]
        pairs = [(g, c) for g, c in pairs if g and c]
        if len(pairs) < 3:
            continue
        try:
            out[n] = round(statistics.correlation([g for g, _ in pairs], [c for _, c in pairs]), 2)
        except statistics.StatisticsError:
            continue
    return out


def speed_lines(res: dict, net: str) -> list[str]:
    """The same runs at one machine speed (bench/speedgauge.py): each run's wall time times the
    reference gauge over its own."""
    s, sizes = res["summary"], res["sizes"]
    rows = []
    for n in sizes:
        base = s.get(f"{net}/baseline@{n}")
        base_at = med((base or {}).get("wall_at_reference_s") or [])
        for tool in TOOLS:
            x = s.get(skey(net, tool, n))
            at = [w for w in (x or {}).get("wall_at_reference_s") or [] if w]
            if not at:
                continue
            gauges = ", ".join(fmt(g, 1) for g in x["gauge_ms"])
            sp = spread(at)
            rel = f"{med(at) / base_at:.2f}x" if base_at else "-"
            rows.append(f"| {n} | {tool} | **{med(at):.2f} s** ({', '.join(f'{w:.2f}' for w in at)}) | "
                        f"{'-' if sp is None else f'{sp:.0f} %'} | {rel} | {gauges} |")
    if not rows:
        return []
    ref = gauge_reference(res.get("runs") or [])
    fit = gauge_fit([r for r in res.get("runs") or [] if r.get("net", "loopback") == net
                     and r.get("fleet", "plain") == "plain"])
    return ["The same runs at one machine speed: each run's wall time times the reference gauge "
            f"({fmt(ref, 2)} ms, the median of every run's) over its own (`bench/speedgauge.py`: the CPU "
            "of a fixed loop, sampled every 0.1 s while the run went on; a slower moment of this shared "
            "machine gives a larger gauge). Pearson's r between a run's gauge and its new servers' median "
            "CPU (the same start in every run of a size), by hosts: "
            + (", ".join(f"{n}: {r:.2f}" for n, r in fit.items()) or "-")
            + ". Where r is well below 1 the machine's speed explains only part of the spread, and these "
            "figures correct for more than it explains: read them beside the raw ones, not instead.", "",
            "| hosts | tool | wall time at the reference speed, median (all runs) | spread | vs baseline | "
            "gauge per run (ms) |", "| ---: | --- | --- | ---: | ---: | --- |", *rows, ""]


def container_lines(res: dict, net: str) -> list[str]:
    """The container hosts against the plain hosts on `net`: medians, ratio, spreads, commands."""
    s, out = res["summary"], []
    for n in res["sizes"]:
        for tool in CONTAINER_TOOLS:
            ratio = s.get(f"container/plain:{net}/{tool}@{n}")
            if not ratio:
                continue
            c, p = s[skey(net, tool, n, "container")], s[skey(net, tool, n)]
            cmds = lambda x: "/".join(str(v) for v in x["commands_per_host"])
            if not out:
                out += ["Container hosts against plain hosts (the same rollout, the same run; the fleets' order "
                        "alternating per repeat):", "",
                        "| hosts | tool | plain hosts: median (spread) | container hosts: median (spread) | "
                        "container / plain (per repeat) | added | commands / host (plain / container) | "
                        "docker CPU per run (container runs) |",
                        "| ---: | --- | ---: | ---: | --- | ---: | --- | ---: |"]
            sp = lambda x: "-" if x.get("wall_spread_pct") is None else f"{x['wall_spread_pct']:.0f} %"
            out.append(f"| {n} | {tool} | {p['wall_median_s']:.2f} s ({sp(p)}) | {c['wall_median_s']:.2f} s ({sp(c)}) | "
                       f"**{ratio['ratio_of_medians']:.2f}x** ({', '.join(f'{v:.2f}' for v in ratio['ratio_per_repeat'])}) | "
                       f"{ratio['added_median_s']:+.2f} s | {cmds(p)} / {cmds(c)} | "
                       f"{fmt(c.get('docker_cpu_median_s'))} s |")
    return out + [""] if out else []


def container_ops_lines(co: dict) -> list[str]:
    out = ["The container runtime's commands, as the agent runs them on a container host (the host's docker CLI "
           f"and socket, in its namespace; not over SSH; {co['host']}, medians): `docker inspect` "
           f"{co['inspect_s']:.3f} s (CPU {fmt(co.get('inspect_cli_cpu_s'), 3)} s of the CLI), "
           + "".join(f"on {k.split('_')[1]} hosts at once {v['median_s']:.3f} s each ({v['wall_s']:.3f} s for all), "
                     for k, v in co.items() if k.startswith("inspect_") and k.endswith("_at_once"))
           + f"`docker logs --since` {co['logs_since_s']:.3f} s, `python3 -S -c pass` on the "
           f"host {co['python3_on_host_s']:.3f} s. A restart (stop, start, to /health):", "",
           "| restart | hosts at once | wall | machine CPU | stop | start | start → /health | stop → /health |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key, x in co.items():
        if not isinstance(x, dict) or "_restart_" not in key:
            continue
        kind, _, rest = key.partition("_restart_")
        hosts = rest.split("_")[0]
        out.append(f"| {'docker stop -t 10 + docker start' if kind == 'container' else 'plain: TERM + wait, spawn'} "
                   f"| {hosts} | {fmt(x.get('wall_s'))} | {fmt(x.get('machine_cpu_s')) + (' s' if x.get('machine_cpu_s') is not None else '')} | {fmt(x['stop_s'])} | {fmt(x['start_s'])} | "
                   f"{fmt(x['start_to_health_s'])} | {fmt(x['restart_to_health_s'])} |")
    return out


def container_md(res: dict) -> str:
    d = res.get("docker")
    if not d:
        return ""
    starts = res.get("fleet_start_s") or {}
    return f"""
Container hosts (`--fleets {','.join(res.get('fleets', []))}`): c00, c01, … are sshd hosts like h00, h01, … whose
engine runs in a Docker container of `{d.get('image')}` (Debian trixie, SGLang {VERSION} laid out as in
lmsysorg/sglang, the stand-in as the container's main process, `--network host`, `--restart always`); the
inventory names `engine.container`, `server.log: container`, `restart.kind: container`. Docker daemon:
{d.get('daemon')}, at `{d.get('sock')}`. Before every container run each container is re-created from the image
(`docker rm -f`, `docker run`, to /health). The bench's check reads the files inside the container (`docker exec …
sha256sum`), the container's output since the run started (`docker logs --since`), the container's main pid (new)
and id (unchanged). Docker CPU = CPU of dockerd, containerd, the shims, runc and every process in a container during
the run (the container hosts' engines; on a shared daemon also other users' containers); it is not in "other CPU".
Fleet start: {', '.join(f'{k} {v:.0f} s' for k, v in starts.items())}.

"""


def where_tools_run(t: dict) -> str:
    """The Versions paragraph's sentence on where each tool runs from (older results: what they noted)."""
    if not t.get("fleetpatch_venv"):
        return (f"fleetpatch's bytecode: {t.get('fleetpatch_bytecode', 'not compiled by the bench')}, as `pip install` "
                "does; the other tools are pip-installed.")
    return (f"Where each tool runs from: {t['fleetpatch_venv']}, every fleetpatch run (fleetpatch-noprobe, "
            "fleetpatch-before with its other src first on PYTHONPATH, the instrumented run, the start-up figure) on "
            f"that venv's python; pyinfra from its own venv `{t.get('pyinfra_venv', PYINFRA_VENV)}`; Ansible on the "
            f"machine's interpreter ({t.get('ansible_from', '-')}); the baseline and baseline-checks are the OpenSSH "
            f"client and a POSIX sh script run on the hosts (GNU patch, coreutils, {t.get('curl', 'curl')}).")


def lateness_table(res: dict) -> list[str]:
    """The delay proxy's own lag past each chunk's due time, per tool and size (medians over the runs
    of each run's median, 90th percentile and max): the proxy shares the cores with every host, so a
    busy moment delays a chunk beyond the link's delay, more for a tool whose traffic falls then."""
    rows = {}
    for r in res.get("runs", []):
        if r.get("net") == "delay" and r.get("proxy_late") and r.get("fleet", "plain") == "plain":
            rows.setdefault((r["size"], r["tool"]), []).append(r["proxy_late"])
    if not rows:
        return []
    out = ["The delay proxy's own lateness: ms past each chunk's due time (the proxy runs on the same two "
           "cores as the hosts), medians over the runs of each run's median / 90th percentile / max, and the "
           "chunks it forwarded per run:", "",
           "| hosts | tool | median | p90 | max | chunks per run |", "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for (n, tool), xs in sorted(rows.items(), key=lambda kv: (kv[0][0], TOOLS.index(kv[0][1])
                                                             if kv[0][1] in TOOLS else 99)):
        m = lambda k: med([x[k] for x in xs])
        out.append(f"| {n} | {tool} | {m('median_ms'):.1f} ms | {m('p90_ms'):.1f} ms | {m('max_ms'):.1f} ms | "
                   f"{m('chunks'):.0f} |")
    return out + [""]


def checks_table(res: dict) -> list[str]:
    """fleetpatch against the peers doing the same checks after the marker (ready line, health, smoke)."""
    s, out = res["summary"], []
    for net in res.get("nets", ["loopback"]):
        for n in res["sizes"]:
            fp, bc, pc = (s.get(f"{net}/{t}@{n}") for t in ("fleetpatch", "baseline-checks", "pyinfra-checks"))
            if not fp or not (bc or pc):
                continue
            if not out:
                out += ["The same checks: fleetpatch against the baseline and pyinfra doing, after the marker, what "
                        "fleetpatch does before its verdict (the ready line, /health until 200, one smoke request); "
                        "wall medians, fleetpatch's ratio to each, and what the checks add to each peer "
                        "(-checks median - its median without them):", "",
                        "| net | hosts | fleetpatch | baseline-checks | fleetpatch / baseline-checks | "
                        "pyinfra-checks | fleetpatch / pyinfra-checks | checks add (baseline / pyinfra) |",
                        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
            w = lambda x: f"{x['wall_median_s']:.2f} s" if x else "-"
            r = lambda x: f"**{fp['wall_median_s'] / x['wall_median_s']:.2f}x**" if x else "-"
            add = lambda x, y: f"{x['wall_median_s'] - y['wall_median_s']:+.2f} s" if x and y else "-"
            out.append(f"| {net} | {n} | {w(fp)} | {w(bc)} | {r(bc)} | {w(pc)} | {r(pc)} | "
                       f"{add(bc, s.get(f'{net}/baseline@{n}'))} / {add(pc, s.get(f'{net}/pyinfra@{n}'))} |")
    return out + [""] if out else []


def results_md(res: dict) -> str:
    m = res["machine"]
    t = res["tools"]
    unc = m.get("fleetpatch_uncommitted") or []
    dirty = (f" plus uncommitted work in the tree at run time ({', '.join(unc)}; host agent "
             f"{m.get('agent_bytes', m.get('hostagent_bytes'))} bytes, "
             f"sha256 {m.get('agent_sha256', m.get('hostagent_sha256'))}…)") if unc else ""
    load = res.get("load") or {}
    runs = res.get("runs", [])
    fore = [r.get("foreign_cpu_s", 0) for r in runs]
    busy_before = [r.get("busy_before_pct") for r in runs if r.get("busy_before_pct") is not None]
    d = res.get("delay") or {}
    delay_md = f"""The delay proxy (`bench/delayproxy.py`) adds {d.get('delay_ms', 0):g} ms each way to every chunk of every
connection, one listener per host on 127.0.0.1; measured round trip through it {fmt(d.get('rtt_ms'), 1)} ms
(loopback without it: well under 0.1 ms). A new connection's first bytes flow one round trip late, as after
TCP's handshake on a real link (connect + first echo: {fmt(d.get('first_exchange_ms'), 1)} ms). Every tool connects to the proxy ports with the same strict host key
checking, against a known_hosts file that holds each host's key under its proxy port.
""" if d else ""
    order = ("per size and repeat: loopback then the delay proxy, the fleets in alternating order "
             "(in even repeats as --fleets names them, in odd ones reversed), the tool order rotated per repeat") if len(res.get("fleets", [])) > 1 \
        else "per size and repeat: loopback then the delay proxy,\nthe tool order rotated per repeat"
    return f"""# Benchmark results

Generated by `bench/run.py` (`invoke bench`) on {res['date']}; one run, sizes {', '.join(map(str, res['sizes']))},
{res['repeats']} repeats per size, net and tool, interleaved ({order}), the fleet reset to pristine before every run. Total bench time {res['bench_s']:.0f} s.

**Machine: {m['cpus']} CPUs ({m['cpu_model']}), kernel {m['kernel']}. Every test host (sshd, the
stand-in servers, every command the tools run "remotely") shares these {m['cpus']} cores with the tool
under test, and the network is loopback.** Figures are relative, not what a real fleet of separate
machines over a real network would show.

Machine load from others during the run: load average {load.get('start', '-')} at the start and
{load.get('end', '-')} at the end (1/5/15 min); CPU used by processes that are not the bench's, per run:
median {fmt(med(fore))} s, max {fmt(max(fore) if fore else None)} s; machine busy just before a run (after
waiting up to {res.get('quiet_wait', 0):.0f} s for < 20 %): median {fmt(med(busy_before), 0)} %, max
{fmt(max(busy_before) if busy_before else None, 0)} %.

{delay_md}
Versions: Python {m['python']}, fleetpatch at {m['fleetpatch_commit']} (`{m.get('fleetpatch_path', '')}`; last
change to src/fleetpatch: {m.get('fleetpatch_src_commit', '-')[:90]}){dirty}, {t.get('pyinfra', 'pyinfra -')},
{t.get('ansible')}, {t.get('openssh')}, {t.get('patch')}. Stand-in startup delay 0 s; patch `{PATCH}` (2 files).
The baseline's ssh key exchange: {res.get('baseline_kex', 'OpenSSH default')}. {where_tools_run(t)}
{('fleetpatch-before: ' + t['fleetpatch_before'] + '.') if t.get('fleetpatch_before') else ''}
{container_md(res)}Each host's reset to pristine keeps fleetpatch's agent compile cache (`state/agent-cache`, filled on every host by the warm-up run), as on a fleet
fleetpatch has run on before; everything else in the state dir goes.
baseline-c25519 is the same one-ssh baseline with `-o KexAlgorithms=curve25519-sha256`, the key exchange
paramiko (fleetpatch, pyinfra) negotiates. The baseline, pyinfra and Ansible stop at the marker (the issue's job);
fleetpatch also waits, before its verdict, for the server's ready line, a 200 from its health URL and one smoke
request (`POST /generate`, HTTP 200 with a non-empty "text"). baseline-checks and pyinfra-checks are the baseline
and pyinfra doing those checks too (the same one ssh per host, the same three operations): "the same checks" below.

{tables(res)}

Wall time = launch of the tool's process (fleetpatch, pyinfra, ansible-playbook) or of the first `ssh`
(baseline) to the exit of the last; it includes each tool's own start-up. Spread = (slowest - fastest) /
median over the repeats. vs baseline = median / the baseline's median on the same net and size.
Commands per host are counted by the fleet's sshd ForceCommand wrapper (one line per SSH exec request).
Controller CPU = user+system CPU of the tool's local processes (getrusage of the bench's children).
Machine busy = share of both cores busy during the run (/proc/stat), hosts and the proxy included. Other
CPU = CPU used during the run by processes that are not the bench's (other sessions on this shared
machine; from /proc, approximate). "hosts ok" is the tool's own verdict / the bench's independent check
(file sha256, new healthy server, marker of the right path in the log written since the run started).
"""


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,8,32")
    ap.add_argument("--repeats", default="3")
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                    help=f"any of {','.join(TOOLS)} (default {','.join(DEFAULT_TOOLS)}; "
                         f"{' and '.join(CHECKS_TOOLS)} run only when named)")
    ap.add_argument("--nets", default=",".join(NETS),
                    help="loopback (straight to each sshd) and/or delay (through bench/delayproxy.py)")
    ap.add_argument("--delay-ms", default="25", help="the proxy's delay each way (default 25: 50 ms RTT)")
    ap.add_argument("--fleets", default="plain",
                    help="plain (the engine in a venv on each host) and/or container (the engine in a Docker "
                         "container on each host; fleetpatch and the baseline run there): plain,container times both in one "
                         "run, the order alternating per repeat, and writes results-containers.json and "
                         "RESULTS-containers.md (default plain)")
    ap.add_argument("--fleetpatch-before", default="", metavar="CHECKOUT",
                    help="another fleetpatch checkout (e.g. a git worktree of an older commit), run as the "
                         "tool fleetpatch-before from CHECKOUT/src: a before/after table from one run")
    ap.add_argument("--baseline-kex", default="",
                    help="KexAlgorithms for the baseline's ssh, e.g. curve25519-sha256 (the key exchange "
                         "paramiko uses); default: OpenSSH's own (9.x: sntrup761x25519-sha512 first)")
    ap.add_argument("--out", default=str(BENCH), help="where results.json and RESULTS.md go")
    ap.add_argument("--root", default=None, help="fleet + scratch directory (default: a new temp dir)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get/pip install missing tools")
    ap.add_argument("--no-instrumented", action="store_true")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="only write RESULTS.md (into --out) again from an existing results.json")
    ap.add_argument("--quiet-wait", default="60",
                    help="before each run wait up to S seconds for the machine to be <20%% busy (0: don't)")
    a = ap.parse_args(argv)
    if a.render:
        try:
            res = json.loads(Path(a.render).read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"bench: cannot read {a.render}: {e}")
        res["summary"] = summarize(res["runs"], res["sizes"], res.get("nets", ["loopback"]),
                                   res.get("fleets", ["plain"]))
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / out_names(res.get("fleets", ["plain"]))[1]).write_text(results_md(res))
        print(tables(res))
        return 0
    try:
        sizes = [int(x) for x in a.sizes.split(",") if x]
    except ValueError:
        sys.exit(f"bench: --sizes takes numbers separated by commas, not {a.sizes!r}")
    tools = [t for t in a.tools.split(",") if t]
    nets = [x for x in a.nets.split(",") if x]
    fleets = [x for x in a.fleets.split(",") if x]
    if not sizes or max(sizes) > MAX_HOSTS or min(sizes) < 1:
        sys.exit(f"bench: sizes must be 1..{MAX_HOSTS}")
    if not tools or set(tools) - set(TOOLS):
        sys.exit(f"bench: unknown tool(s) {sorted(set(tools) - set(TOOLS))}; choose from {','.join(TOOLS)}")
    if not nets or set(nets) - set(NETS):
        sys.exit(f"bench: unknown net(s) {sorted(set(nets) - set(NETS))}; choose from {','.join(NETS)}")
    if not fleets or set(fleets) - set(FLEETS) or len(set(fleets)) != len(fleets):
        sys.exit(f"bench: --fleets takes plain and/or container, not {a.fleets!r}")
    if "container" in fleets and not set(tools) & set(CONTAINER_TOOLS):
        sys.exit("bench: --fleets container: only fleetpatch and the baseline run on container hosts; "
                 "add fleetpatch or baseline to --tools")
    a.repeats = number("--repeats", a.repeats, whole=True, minimum=1, what="a whole number of 1 or more")
    a.delay_ms = number("--delay-ms", a.delay_ms, minimum=0, what="milliseconds, a number of 0 or more")
    a.quiet_wait = number("--quiet-wait", a.quiet_wait, minimum=0, what="seconds, a number of 0 or more")
    if a.baseline_kex and not re.fullmatch(r"[A-Za-z0-9@.,+_-]+", a.baseline_kex):
        sys.exit(f"bench: --baseline-kex takes an OpenSSH KexAlgorithms list, not {a.baseline_kex!r}")
    Net.baseline_opts = ["-o", f"KexAlgorithms={a.baseline_kex}"] if a.baseline_kex else []
    if os.geteuid() != 0:
        sys.exit("bench: the test fleet needs root (mount namespaces)")
    if "fleetpatch-before" in tools and checkout_src(a.fleetpatch_before) is None:
        sys.exit(f"bench: --fleetpatch-before {a.fleetpatch_before or '(missing)'}: not a fleetpatch checkout "
                 "(no src/fleetpatch in it); give a git worktree of an older commit")
    if a.fleetpatch_before and "fleetpatch-before" not in tools:
        sys.exit("bench: --fleetpatch-before runs as the tool fleetpatch-before: add it to --tools")
    docker, docker_note = (container_daemon() if "container" in fleets else (None, None))
    t_bench = time.monotonic()
    tool_notes = ensure_tools(not a.no_install, need_pyinfra=bool({"pyinfra", "pyinfra-checks"} & set(tools)),
                              need_ansible="ansible" in tools)
    fp_pkg = None
    if any(t.startswith("fleetpatch") for t in tools):
        tool_notes["fleetpatch_venv"], fp_pkg = install_fleetpatch(not a.no_install)
        log(tool_notes["fleetpatch_venv"])
    tool_notes["pyinfra_venv"] = str(PYINFRA_VENV)
    tool_notes["ansible_from"] = f"`{ansible_playbook() or 'ansible-playbook'}` on {sys.executable}"
    if set(CHECKS_TOOLS) & set(tools):
        tool_notes["curl"] = (subprocess.run(["curl", "--version"], capture_output=True, text=True).stdout
                              .split("\n")[0].split(" (")[0] if shutil.which("curl") else "curl: missing")
    before_src = None
    if "fleetpatch-before" in tools:
        before_src = checkout_src(a.fleetpatch_before)
        tool_notes["fleetpatch_before"] = (f"{before_src} at " + subprocess.run(
            ["git", "-C", str(before_src), "log", "-1", "--format=%h %s"], capture_output=True,
            text=True).stdout.strip()[:100] + "; " + compile_fleetpatch(before_src / "fleetpatch"))
    diff_text = DIFF.read_text()
    files = changed_files(diff_text)
    expect = expected_shas(diff_text, files)
    root = Path(a.root or tempfile.mkdtemp(prefix="fleetpatch-bench-"))
    if not a.root:   # at exit, interrupted or not (by then the fleet's context has stopped it)
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    wd = root / "work"
    wd.mkdir(parents=True, exist_ok=True)
    n_hosts = max(sizes)
    specs = {
        "plain": [HostSpec(f"h{i:02d}", version=VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0)
                  for i in range(n_hosts)],
        # the same hosts with the engine in a container (c00, c02, … v1; c01, c03, … v2)
        "container": [HostSpec(f"c{i:02d}", version=VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0,
                               container=True) for i in range(n_hosts)],
    }
    runs: list[dict] = []
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "sizes": sizes, "repeats": a.repeats, "nets": nets,
           "fleets": fleets, "tools_run": tools, "quiet_wait": a.quiet_wait,
           "baseline_kex": a.baseline_kex or "OpenSSH default", "load": {"start": load_avg()},
           "machine": machine(fp_pkg), "tools": tool_notes, "patch": PATCH, "runs": runs}
    if docker is not None:
        res["docker"] = docker_note
    with contextlib.ExitStack() as stack:
        fleet_by: dict[str, Fleet] = {}
        for fl in fleets:
            what = "sshd hosts" if fl == "plain" else "container hosts (sshd + the engine in a Docker container)"
            log(f"starting a fleet of {n_hosts} {what} under {root}")
            t = time.monotonic()
            fleet_by[fl] = stack.enter_context(Fleet(root / ("fleet" if fl == "plain" else "cfleet"), specs[fl],
                                                     docker_sock=docker.sock if fl == "container" else None))
            res.setdefault("fleet_start_s", {})[fl] = round(time.monotonic() - t, 2)
            if fl == "container":
                res["docker"]["image"] = fleet_by[fl]._images.get(VERSION)
        net_by: dict[tuple, Net] = {}
        for fl, fleet in fleet_by.items():
            net_by[fl, "loopback"] = loopback_net(fleet)
            if "delay" in nets:
                # bounded: it stops by itself well after the longest bench this could be
                proxy_max = 600 + len(sizes) * a.repeats * len(tools) * 2 * len(fleets) * TOOL_TIMEOUT
                net_by[fl, "delay"] = stack.enter_context(
                    DelayProxy(fleet, wd, a.delay_ms, proxy_max, label="" if fl == "plain" else f"-{fl}"))
                if "delay" not in res:
                    res["delay"] = {"delay_ms": a.delay_ms, "rtt_ms": net_by[fl, "delay"].rtt_ms,
                                    "first_exchange_ms": net_by[fl, "delay"].first_exchange_ms,
                                    "max_seconds": proxy_max}
                    log(f"delay proxy up: {a.delay_ms:g} ms each way, measured RTT {net_by[fl, 'delay'].rtt_ms} ms, "
                        f"first exchange on a new connection {net_by[fl, 'delay'].first_exchange_ms} ms")
        runners = {
            "fleetpatch": lambda fleet, names, tag, net: run_fleetpatch(fleet, names, wd, tag, net),
            "fleetpatch-noprobe": lambda fleet, names, tag, net: run_fleetpatch(fleet, names, wd, tag, net,
                                                                               probe=False),
            "fleetpatch-before": lambda fleet, names, tag, net: run_fleetpatch(fleet, names, wd, tag, net,
                                                                              src=before_src),
            "baseline": lambda fleet, names, tag, net: run_baseline(fleet, names, wd, tag, diff_text, files, net),
            "baseline-c25519": lambda fleet, names, tag, net: run_baseline(fleet, names, wd, tag, diff_text, files,
                                                                          net, opts=C25519),
            "baseline-checks": lambda fleet, names, tag, net: run_baseline(fleet, names, wd, tag, diff_text, files,
                                                                          net, checks=True),
            "pyinfra": lambda fleet, names, tag, net: run_pyinfra(fleet, names, wd, tag, files, net),
            "pyinfra-checks": lambda fleet, names, tag, net: run_pyinfra(fleet, names, wd, tag, files, net,
                                                                        checks=True),
            "ansible": lambda fleet, names, tag, net: run_ansible(fleet, names, wd, tag, files, net),
        }
        every_ns = lambda: {h.ns_ino for f in fleet_by.values() for h in f.hosts.values() if h.ns_ino}

        def one(fl, tool, names, tag, net: Net, record=True):
            fleet = fleet_by[fl]
            t = time.monotonic()
            reset_keeping_agent_cache(fleet)   # container hosts: containers re-created from the image
            fleet.clear_commands()
            reset_s = time.monotonic() - t
            before = snapshot(fleet, names)
            quiet = wait_quiet(a.quiet_wait) if a.quiet_wait > 0 else None
            fleet_ns = every_ns()
            loadavg = load_avg()
            f0 = foreign_cpu(fleet_ns)
            cpu0, busy0 = children_cpu(), cpu_busy()
            with SpeedGauge() as gauge:
                r = runners[tool](fleet, names, tag, net)
            cpu1, busy1 = children_cpu(), cpu_busy()
            r["gauge_ms"], r["gauge_samples"] = gauge.median_ms(), len(gauge.samples)
            f1 = foreign_cpu(fleet_ns)
            r["foreign_cpu_s"] = round(foreign_delta(f0, f1), 2)
            # the Docker daemon's and the containers' CPU (for a container fleet: the engines'
            # side of the rollout; on a shared daemon also other users' containers)
            r["docker_cpu_s"] = round(foreign_delta(f0, f1, docker=True), 2)
            r["busy_before_pct"] = quiet
            r["loadavg_before"] = loadavg
            # CPU of the tool's own processes on the controller side (the tool process and
            # everything it forked locally: ansible forks, ssh clients), and how busy the
            # whole machine (controller + every host) was during the run
            r["controller_cpu_s"] = round(cpu1 - cpu0, 3)
            r["machine_busy_pct"] = round(100.0 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 1)
            # the hosts' side (sshd, agents or remote shells, the servers): the machine's busy CPU less
            # the tool's own and the other sessions' (approximate: /proc/stat and /proc)
            machine_cpu = (busy1[0] - busy0[0]) / _HZ
            r["host_cpu_s"] = round(max(0.0, machine_cpu - r["controller_cpu_s"] - r["foreign_cpu_s"]), 2)
            side = sshd_side(fleet, names, r["t_launch"])
            # each new server's CPU since its start (the probe's cost per server start shows here)
            r["server_cpu_ms"] = [server_cpu_ms(fleet, n) for n in names]
            checked = check(fleet, names, before, expect)
            r.update({"tool": tool, "fleet": fl, "net": net.name, "size": len(names), "tag": tag,
                      "reset_s": round(reset_s, 2),
                      "tool_ok": sum(1 for n in names if r["hosts"].get(n, {}).get("ok")),
                      "checked_ok": sum(1 for n in names if not checked[n]),
                      "problems": {n: p for n, p in checked.items() if p},
                      "commands_per_host": [side[n]["count"] for n in names],
                      "cmd_at": [side[n]["at"] for n in names],
                      "command_kinds": side[names[0]]["kinds"]})
            if net.lateness is not None:
                r["proxy_late"] = net.lateness.window(r["t_launch"], r["t_launch"] + r["wall_s"] + 0.5)
            r["wall_s"] = round(r["wall_s"], 3)
            log(f"{'(warm-up) ' if not record else ''}{net.name:8s} {fl:9s} {tool:10s} {len(names):2d} hosts  "
                f"{r['wall_s']:6.2f} s  exit {r['exit']}  "
                f"busy before {r['busy_before_pct']}% load {loadavg} gauge {r['gauge_ms']} ms other CPU {r['foreign_cpu_s']} s "
                f"docker CPU {r['docker_cpu_s']} s  ok {r['tool_ok']}/{len(names)} (check {r['checked_ok']})  "
                f"cmds/host {sorted(set(r['commands_per_host']))}")
            if r["checked_ok"] != len(names) or r["tool_ok"] != len(names):
                log(f"  problems: {json.dumps(r['problems'])[:800]}")
                if r.get("output_tail"):
                    log("  output: " + r["output_tail"][-1500:])
            if record:
                runs.append(r)
            return r

        def tools_for(fl):
            return [t for t in tools if fl == "plain" or t in CONTAINER_TOOLS]

        # Not recorded. fleetpatch's runs go to every host: each host's agent compile cache is
        # then filled, as on a fleet fleetpatch has run on before (the claim the results make),
        # instead of the first run of each size paying the compile on the hosts it had not seen.
        log("warm-up (not recorded): one run of each tool on 1 host; fleetpatch's on every host")
        for fl, fleet in fleet_by.items():
            for tool in tools_for(fl):
                warm = fleet.names if tool.startswith("fleetpatch") else fleet.names[:1]
                one(fl, tool, warm, f"warmup-{fl}", net_by[fl, "loopback"], record=False)
        for n in sizes:
            for rep in range(a.repeats):
                k = rep % len(tools)
                # the fleets' order alternates per repeat (plain first, then container first, …)
                order = fleets if rep % 2 == 0 else fleets[::-1]
                for netname in nets:
                    for fl in order:
                        names = fleet_by[fl].names[:n]
                        tag = f"{n}-{rep}" if fl == "plain" else f"{n}-{rep}-{fl}"
                        for tool in tools[k:] + tools[:k]:
                            if tool in tools_for(fl):
                                one(fl, tool, names, tag, net_by[fl, netname])
        if not a.no_instrumented and "fleetpatch" in tools:
            res["instrumented"] = {}
            for fl, fleet in fleet_by.items():
                for netname in nets:
                    for n in sizes:
                        reset_keeping_agent_cache(fleet)
                        fleet.clear_commands()
                        doc = run_instrumented(fleet, fleet.names[:n], wd, net_by[fl, netname])
                        key = skey(netname, None, n, fl)
                        res["instrumented"][key] = instrumented_summary(doc)
                        res.setdefault("instrumented_raw", {})[key] = doc
                        log(f"instrumented fleetpatch {key}: {json.dumps(res['instrumented'][key])}")
        if "container" in fleet_by:
            res["container_ops"] = container_ops(fleet_by["container"], fleet_by.get("plain"),
                                                 max(n for n in sizes))
            log(f"container runtime ops: {json.dumps(res['container_ops'])}")
        first = fleet_by[fleets[0]]
        res["startup"] = startup_times(fleetpatch_too=fp_pkg is not None)
        if fp_pkg is not None:   # fleetpatch's venv is there
            res["first_connect"] = first_connect_times(first, wd)
    res["load"]["end"] = load_avg()
    res["bench_s"] = time.monotonic() - t_bench
    res["summary"] = summarize(runs, sizes, nets, fleets)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    json_name, md_name = out_names(fleets)
    (out / json_name).write_text(json.dumps(res, indent=1) + "\n")
    (out / md_name).write_text(results_md(res))
    print()
    print(tables(res))
    print()
    log(f"done in {res['bench_s']:.0f} s; wrote {out / json_name} and {out / md_name}")
    bad = [r for r in runs if r["checked_ok"] != r["size"]]
    return 1 if bad else 0


def load_avg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "-"


def number(flag: str, text: str, *, minimum: float, what: str, whole: bool = False):
    """A flag's value as a number, or one line naming the flag and what it takes."""
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = None
    if value is None or value != value or value in (float("inf"), float("-inf")) or value < minimum:
        sys.exit(f"bench: {flag} takes {what}, not {text!r}")
    return value


def _interrupted(signum, frame):
    # Ctrl-C or SIGTERM: the fleet's context stops its sshds and servers and the proxy
    # stops; a second signal must not cut that short and leave them running
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; the test fleet and the delay proxy were stopped, no results written",
              file=sys.stderr)
        sys.exit(130)
