"""What every request to a host's agent carries, and what one host's work returns.

Below `steps` and `drain`, which both build requests and results."""
from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field

from . import protocol
from .engines import LaunchConfig
from .engines import get as get_profile
from .errors import Status
from .inventory import Host


@dataclass
class HostResult:
    host: str
    ok: bool
    status: Status
    message: str = ""
    engine_version: str | None = None
    patch: str | None = None
    executed_path: str | None = None
    markers: list = field(default_factory=list)
    duration_s: float = 0.0
    round_trips: int = 0
    files: dict | None = None
    details: dict = field(default_factory=dict)
    # what failed in its own words, without the host's name or what that left on the host (set by
    # the drain's router steps that end before the restart); not in the report: `message` says it
    reason: str | None = None

    def to_json(self) -> dict:
        out = {"ok": self.ok, "status": str(self.status), "message": self.message,
               "engine_version": self.engine_version, "patch": self.patch,
               "executed_path": self.executed_path, "markers": self.markers,
               "duration_s": round(self.duration_s, 3), "round_trips": self.round_trips}
        if self.files is not None:
            out["files"] = self.files
        out.update(self.details)
        return out


def agent_restart(host: Host) -> dict:
    """The restart settings as the agent needs them, start already split:
    the operator's command line is tokenised here, never passed to a shell."""
    r = host.server.restart
    out = {"kind": r.kind, "env": dict(r.env or {}), "workdir": r.workdir, "pidfile": r.pidfile,
           "stop_grace": r.stop_grace, "unit": r.unit, "program": r.program, "config": r.config}
    if r.kind == "command":
        out["argv"] = [tok.replace("{python}", host.engine.python) for tok in split_command(r.start)]
    return out


@functools.lru_cache(maxsize=1024)
def split_command(command: str) -> tuple:
    """shlex.split, once per distinct command line: every request carries the restart
    settings, and a fleet's hosts mostly share one start command (shlex is slow)."""
    return tuple(shlex.split(command))


def base_request(host: Host, job) -> protocol.Request:
    """The fields every request carries; `job` gives the run's lock token."""
    profile = get_profile(host.engine.kind)
    return protocol.Request(state_dir=host.engine.state_dir, package=profile.package,
                            launch_env_prefixes=list(profile.launch_env_prefixes), log=host.server.log,
                            restart=agent_restart(host), health_url=host.server.health_url,
                            lock_token=job.token, **container_fields(host), **server_fields(host),
                            **({"version_file": profile.version_file} if profile.version_file else {}),
                            **({"api_key_env": profile.api_key_env} if profile.api_key_env else {}))


def smoke_fields(host: Host, prompt: str, max_new_tokens: int) -> dict:
    """The smoke request as the host's engine takes it (`path`, `body`, `answer`, maybe `model_from`):
    SGLang's POST /generate, vLLM's POST /v1/completions naming the model the start command serves."""
    profile = get_profile(host.engine.kind)
    r = host.server.restart
    argv = [tok.replace("{python}", host.engine.python) for tok in split_command(r.start)] if r.start else []
    return profile.smoke_request(prompt, int(max_new_tokens), LaunchConfig(argv=argv, env=dict(r.env or {})))


def server_fields(host: Host) -> dict:
    """A host with several servers: all their names (the ledger keeps each one's restarts), and
    which one a request is for (a view of one server: `Host.server_views`)."""
    if not host.servers:
        return {}
    return {"server_names": [name for name, _ in host.servers], "server_name": host.server_name}


def patch_lost_message(host: Host, lost: dict) -> str:
    """One host's `patch-lost`: its container was re-created since fleetpatch wrote into it."""
    return (f"{host.name}: patch-lost: the container {lost.get('name')} was re-created at {lost.get('created')} "
            f"(id {str(lost.get('new_id'))[:12]}, was {str(lost.get('old_id'))[:12]} when "
            f"{', '.join(lost.get('patches') or []) or 'the patch'} was deployed): the image's files are back and "
            "the patched code no longer runs; deploy-patch applies it again")


def container_fields(host: Host) -> dict:
    """A container host's requests name the container, its runtime and the interpreter in it."""
    e = host.engine
    return {"container": {"name": e.container, "runtime": e.runtime, "python": e.python}} if e.container else {}
