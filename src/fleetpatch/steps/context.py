"""What every step of one host works through: the command's `Job`, and the
per-host `HostRun` (host, job, remote, lock, engine version, clock), opened and
closed by `host_step`."""
from __future__ import annotations

import getpass
import hashlib
import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit, urlunsplit

from .. import dialer, diffapply, lockview, protocol
from ..engines import LaunchConfig
from ..engines import for_node_rank
from ..engines import get as get_profile
from ..errors import HostFailure, Status
from ..hostcalls import HostResult, base_request, split_command
from ..inventory import Host
from ..knownhosts import KnownHosts
from ..patchset import Patch
from ..probe.hintstore import HintStore
from ..probe.splice import Hints as SpliceHints
from ..remote import Remote, Transport

if TYPE_CHECKING:
    from ..dials import Dial, Dials
    from .lock import HostLock

Progress = Callable[[str, str, str], None]


@dataclass
class Job:
    """What the operator asked for, shared by every host of one command."""

    hosts_by_name: dict
    patch: Patch | None = None
    rev: int | None = None
    # --patch of verify-logs and rollback when this laptop has no such folder: the host's record has it
    patch_name: str | None = None
    timeout: float | None = None
    no_restart: bool = False
    on_failure: str = "keep"
    force: bool = False
    break_lock: bool = False
    accept_new_host_keys: bool = False
    dest: Path = Path(".fleetpatch/sources")
    progress: Progress = lambda host, phase, detail="": None
    holder: str = field(default_factory=lambda: f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}")
    # uuid4's randomness without importing uuid (which imports platform: ~5 ms at every start)
    token: str = field(default_factory=lambda: os.urandom(16).hex())
    patch_dirs: list = field(default_factory=list)
    settle_s: float = 2.0
    lock_renew_s: float = protocol.LOCK_RENEW_S   # how often the agent holding a lock renews it
    # How to reach a host's agent; None: SSH. Tests pass transport_local.LocalTransport.
    transport: Callable[[Host], Transport] | None = None
    # drain.Drainer when a router section applies (router-aware restarts); None: plain restarts
    drain: object | None = None
    # --inventory as given (None: the default), for the commands fleetpatch tells the operator to run
    inventory_arg: str | None = None
    bake_s: float | None = None   # --bake: how long bake watches each host
    probe: bool = True            # False: --no-probe (markers alone judge execution)
    # the run's Ctrl-C: fired by the rollout's loop, seen by first contacts and drains
    interrupt: dialer.Interrupt = field(default_factory=dialer.Interrupt)
    # the known_hosts files, read once for every host of the run (dials.py's share it)
    known_hosts: KnownHosts = field(default_factory=KnownHosts)
    # each distinct (diff, host file) applied once per run, not once per host
    applied: diffapply.AppliedFiles = field(default_factory=diffapply.AppliedFiles)
    # connections the command opened ahead, while it loaded (dials.py); None: each host dials in its step
    dials: "Dials | None" = None
    # the functions-mode lines of each distinct patched file, worked out once (probe/splice.py), and
    # kept on this laptop for the runs after this one
    splice_hints: SpliceHints = field(default_factory=lambda: SpliceHints(store=HintStore()))


@dataclass
class HostRun:
    """One host's part of a command: what every step of it needs. The lock is set
    while a `HostLock` block holds it; the version once the probe has read it."""

    job: Job
    host: Host
    remote: Remote
    started: float = field(default_factory=time.monotonic)
    lock: "HostLock | None" = None
    version: str | None = None
    dial: "Dial | None" = None   # its connection, being opened ahead, until connect() takes it

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def profile(self):
        return profile_of(self.host)

    @property
    def timeout(self) -> float:
        """How long to wait for the markers after a restart."""
        return self.job.timeout if self.job.timeout is not None else float(self.host.server.ready_timeout)

    def progress(self, phase: str, detail: str = "") -> None:
        self.job.progress(self.host.name, phase, detail)

    def request(self, **fields) -> protocol.Request:
        """A request to this host's agent: the fields every request carries, and `fields`."""
        return dict(base_request(self.host, self.job), **fields)

    def result(self, ok: bool, status: Status, message: str, **kw) -> HostResult:
        kw.setdefault("engine_version", self.version)
        return HostResult(self.host.name, ok, status, message, **kw)


class HeldLock:
    """The host's lock as one server's (or one rank's) steps see it: the release never rides on
    its requests (more servers follow under the same lock); the `with HostLock` block that took
    it releases it at the end."""

    def __init__(self, lock):
        self.lock = lock

    def release_followup(self) -> list:
        return []

    def chained_done(self, reply: dict) -> None:
        return None

    def __getattr__(self, name: str):
        return getattr(self.lock, name)


def server_runs(run: HostRun) -> list[HostRun]:
    """One HostRun per server of a host with several (`servers:`): the same connection, lock and
    job, the host seen as that server (its progress lines say which server: "drain [s1] out of
    the router")."""
    def job_of(view):
        def progress(host, phase, detail=""):
            run.job.progress(host, phase, f"[{view.server_name}] {detail}".rstrip())
        # the host's rollback is done by the host's step, for all its servers
        return replace(run.job, on_failure="keep", progress=progress)
    return [replace(run, host=view, job=job_of(view), lock=HeldLock(run.lock))
            for view in run.host.server_views()]


def new_run(job: Job, host: Host) -> HostRun:
    """The host's run, its connection not opened yet (or being opened ahead: job.dials)."""
    dial = job.dials.take(host.name) if job.dials is not None else None
    if dial is not None:
        return HostRun(job, host, dial.remote, started=dial.started, dial=dial)
    return HostRun(job, host, Remote(host, hosts_by_name=job.hosts_by_name,
                                     accept_new_host_keys=job.accept_new_host_keys,
                                     transport=job.transport(host) if job.transport else None,
                                     interrupt=job.interrupt, known_hosts=job.known_hosts))


def connect(hr: HostRun) -> None:
    """Open the run's connection (a HostFailure if it cannot be). Ctrl-C drops a connection
    still being made: nothing has been sent to the host yet."""
    hr.progress("connect")
    if hr.dial is not None:   # dialled ahead: its outcome, as if it were dialled here
        dial, hr.dial = hr.dial, None
        dial.wait()
        return
    with hr.job.interrupt.first_contact():
        hr.remote.open()


def finish_run(hr: HostRun, result: HostResult) -> HostResult:
    """The run's connection closed, its time and round trips on its result."""
    hr.remote.close()
    result.duration_s = time.monotonic() - hr.started
    result.round_trips = hr.remote.round_trips
    hr.progress("done", result.status)
    return result


def host_step(fn: Callable[[HostRun], HostResult]):
    """A host operation as `step(job, host)`: timed, its connection opened and
    closed, every failure turned into the host's result."""

    def run(job: Job, host: Host) -> HostResult:
        hr = new_run(job, host)
        try:
            connect(hr)
            result = fn(hr)
        except HostFailure as f:
            result = HostResult(host.name, False, f.status, f.message)
        except EOFError as e:
            # paramiko's own, when the link or the host's sshd session dies at a moment that no
            # narrower handler covers (between the dial and the agent's first answer)
            result = HostResult(host.name, False, Status.ERROR, (
                f"{host.name}: the SSH session closed (the connection was cut or the host's sshd session killed"
                f"{': ' + str(e) if str(e) else ''}); a plain rerun reads the host's ledger and finishes or "
                "undoes what was done"))
        except Exception as e:  # a bug must not take the other hosts down with it
            result = HostResult(host.name, False, Status.ERROR, f"{host.name}: {type(e).__name__}: {e}")
        except BaseException:
            hr.remote.close()
            raise
        return finish_run(hr, result)

    run.__name__ = fn.__name__
    run.__qualname__ = fn.__qualname__
    run.__doc__ = fn.__doc__
    run.__wrapped__ = fn
    return run


# ----------------------------------------------------------------- helpers

def profile_of(host: Host):
    """The host's engine profile, as its node rank reads it (a rank above 0 has its own "up" line)."""
    return for_node_rank(get_profile(host.engine.kind), host.node_rank)


def inventory_launch(host: Host, session: dict | None = None) -> LaunchConfig:
    """What fleetpatch's restart starts: the inventory's start, and its env over `session` (the
    probe's `session_env`: what the agent's SSH session gives a `command` restart's server, as a
    host's /etc/environment does), as the agent's start_command_server does."""
    r = host.server.restart
    argv = [tok.replace("{python}", host.engine.python) for tok in split_command(r.start or "")]
    inherited = dict(session or {}) if r.kind == "command" else {}
    return LaunchConfig(argv=argv, env={**inherited, **(r.env or {})}, source="inventory")


def session_env(probe_reply: dict | None) -> dict:
    """The engine's variables in the agent's SSH session, from a probe's reply ({} where none said)."""
    return dict((probe_reply or {}).get("session_env") or {})


def running_launch(host: Host, probe_reply: dict) -> LaunchConfig:
    server = probe_reply.get("server") or {}
    if server.get("alive") and server.get("argv"):
        return LaunchConfig(argv=server["argv"], env=server.get("env") or {}, source="process")
    return inventory_launch(host, session_env(probe_reply))


def server_info_url(health_url: str | None, path: str | None = "/server_info") -> str | None:
    """The server's settings endpoint beside its health URL (the profile's `server_info_path`);
    None where the engine has none (vLLM: its facts come from the log and the launch)."""
    if not health_url or not path:
        return None
    parts = urlsplit(health_url)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def probe(remote: Remote, host: Host, job: Job, files: list[str], content: bool,
          lock: str | None = None) -> protocol.ProbeReply:
    """Read the host; with `lock` (the command the lock is for) take its lock first."""
    req = protocol.ProbeRequest(**base_request(host, job), files=files, content=content)
    if lock:
        req["lock"] = lock_claim(job, lock)
    return remote.call("probe", req)


def lock_claim(job: Job, command: str) -> protocol.LockClaim:
    """This run's claim on a host's lock, for `command` (what the lock says the holder is doing)."""
    return protocol.LockClaim(token=job.token, holder=job.holder, force=job.break_lock, command=command,
                              laptop=socket.gethostname(), pid=os.getpid(),
                              pid_start=lockview.process_start(os.getpid()), boot_id=lockview.boot_id(),
                              renew_s=job.lock_renew_s)


def deploy_command(job: Job) -> str:
    """What a deploy does to one host, as the command line that does it again."""
    rev = f"@{job.rev}" if job.rev is not None else ""
    return f"deploy-patch --patch {job.patch.name}{rev}"


def rollback_command(job: Job) -> str:
    name = job.patch.name if job.patch else job.patch_name
    return "rollback" + (f" --patch {name}" if name else "")

