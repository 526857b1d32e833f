"""fetch: copy the engine files of the profile from a host, with fetch.json."""
from __future__ import annotations

import json
import time
from pathlib import Path

from .. import redact
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from .context import HostRun, host_step, probe, sha256
from .plan import file_bytes, version_note


def recorded_patches(ledger: dict) -> list[str]:
    """The patches the host's ledger records as applied, as name@rev, oldest first."""
    patches = ledger.get("patches") or {}
    ordered = sorted(patches, key=lambda n: (patches[n].get("seq", 0), patches[n].get("applied_at", ""), n))
    return [patches[n].get("label") or f"{n}@{patches[n].get('rev', '?')}" for n in ordered]


@host_step
def fetch(run: HostRun) -> HostResult:
    host, profile = run.host, run.profile
    run.progress("fetch")
    reply = probe(run.remote, host, run.job, profile.fetch_files(None), content=True, lock=False)
    version = run.version = reply.get("version")
    wanted = profile.fetch_files(version)
    dest = Path(run.job.dest) / host.name
    files = {}
    for path in wanted:
        data = file_bytes(reply, path)
        if data is None:
            continue
        if sha256(data) != reply["files"][path]["sha256"]:
            raise HostFailure(Status.ERROR, f"{host.name}: {path} arrived damaged (sha256 differs from the host's); "
                                            "nothing was written locally for it; rerun fetch")
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        files[path] = sha256(data)
    missing = [p for p in wanted if p not in files]
    patches = recorded_patches(reply.get("ledger") or {})
    meta = {"host": host.name, "engine": profile.kind, "version": version,
            "package_dir": reply.get("package_dir"), "python": host.engine.python, "files": files,
            "patches": patches, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "fetch.json").write_text(json.dumps(redact.data(meta), indent=2, sort_keys=True) + "\n")
    msg = f"{len(files)} files to {dest}"
    if missing:
        msg += f" ({len(missing)} not present on the host: {', '.join(missing)})"
    if patches:
        msg += (f"; these files already carry {', '.join(patches)} (the host's ledger): a diff written against "
                "them applies on top of " + ("that patch" if len(patches) == 1 else "those patches"))
    note = version_note(profile, version)
    if note:   # a release the profile does not know: the files of every known release were looked for
        msg += f"\n  {note}"
    return run.result(True, Status.FETCHED, msg, files=files, details={"patches": patches})
