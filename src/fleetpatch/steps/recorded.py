"""The patches a host records as deployed, as verify-logs and rollback judge them:
by the host's record of each (what was deployed, see `patchrecord`), or for an
entry an older fleetpatch wrote without one, by this laptop's patch folder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import patchrecord
from ..engines import get as get_profile
from ..errors import HostFailure, Status
from ..inventory import Host
from ..patchset import MANIFEST, Patch, PatchError, load_patch
from .context import Job


@dataclass
class Deployed:
    """One patch as this host's ledger names it, ready to be judged."""

    name: str
    label: str
    patch: Patch
    record: dict | None = None   # the host's record (None: an entry written by an older fleetpatch)
    note: str | None = None      # one line: how the local folder differs from the record

    @property
    def added(self) -> dict | None:
        """The lines the deployed revision adds, as numbered on the host (None: not recorded)."""
        return (self.record or {}).get("added")


def wanted_name(job: Job) -> str | None:
    """The patch named by --patch, whether or not this laptop has its folder."""
    return job.patch.name if job.patch else job.patch_name


def _local(job: Job, host: Host, name: str) -> tuple[Patch | None, str, bool]:
    """(this laptop's copy or None, why not, whether a folder of that name is here at all)."""
    if job.patch and job.patch.name == name:
        return job.patch, "", True
    here = any((Path(d) / name / MANIFEST).is_file() for d in job.patch_dirs)
    try:
        return load_patch(name, job.patch_dirs, get_profile(host.engine.kind))[0], "", True
    except PatchError as e:
        return None, str(e), here


def _note(d: Deployed, local: Patch | None, why: str, here: bool) -> str | None:
    """One line naming how the local folder differs from what the host recorded, if it does."""
    if local is None:
        return (f"the local copy of {d.name} cannot be loaded ({why}); judged by the host's "
                f"record of {d.label}, which is what was deployed") if here else None
    diffs = patchrecord.differences(local, d.record)
    if not diffs:
        return None
    return (f"the local {d.name} differs from what was deployed as {d.label} "
            f"({'; '.join(diffs)}); judged by the host's record, which is what was deployed")


def deployed(job: Job, host: Host, entries: list[tuple[str, dict | None]]) -> list[Deployed]:
    """Each (name, ledger entry) as judged on this host: by the host's record where the
    entry has one, else by the local folder; one HostFailure names the host once and
    every patch that has neither, with what to do. An entry of None (the ledger does
    not name the patch) needs the local folder."""
    out, missing, why_not = [], [], []
    for name, entry in entries:
        entry = entry or {}
        label = entry.get("label") or f"{name}@?"
        local, why, here = _local(job, host, name)
        record = entry.get("record")
        if record:
            d = Deployed(name, label, patchrecord.patch_of(record), record)
            d.note = _note(d, local, why, here)
            out.append(d)
        elif local is not None:
            out.append(Deployed(name, label, local))
        else:
            missing.append(name)
            why_not.append(why)
    if missing:
        it = "it" if len(missing) == 1 else "they"
        raise HostFailure(Status.ERROR, f"{host.name}: the ledger records {', '.join(missing)} as applied, but "
                                        f"{it} cannot be loaded here: {'; '.join(why_not)}; nothing was changed; "
                                        f"the host keeps no record of {'its' if it == 'it' else 'their'} manifest "
                                        "(deployed by an older fleetpatch): rerun with --patches DIR, the folder "
                                        "that holds <name>/patch.yaml (a deploy by this fleetpatch records it)")
    return out


def with_notes(result, found: list[Deployed]):
    """The host's result, with a line for each local folder that differs from the host's record."""
    notes = [d.note for d in found if d.note]
    if notes:
        result.details.setdefault("notes", []).extend(notes)
    return result
