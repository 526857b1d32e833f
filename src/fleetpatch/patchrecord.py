"""A deployed patch as the host keeps it, so that verify-logs and rollback work
from any laptop.

At deploy the apply request carries a `protocol.PatchRecord`, which the agent
keeps in the patch's ledger entry: the manifest as data (name, engine, markers,
expect, forbid, smoke_expect, executed, allow_single_path, superseded), the
revision deployed (rev, engine_versions, the diff's name and sha256, the files
and what it does to each), and the lines it adds as numbered in the files
written there (offsets included: the probe's judge needs them).

For judging a deployed patch the host's record is authoritative: it is what was
deployed. A local folder of the same name that differs from it (an edited
manifest, another diff under the same revision) is named, not used; an entry
written by an older fleetpatch, which kept no record, is judged by the local
folder as before.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from . import protocol
from .diffapply import FileDiff
from .patchset import Marker, Patch, Revision, Superseded

# Where a patch rebuilt from a record says it came from (Patch.source_dir).
RECORD_SOURCE = Path("<the host's record>")


def manifest_data(patch: Patch) -> Dict[str, Any]:
    """patch.yaml as data: every key that judging a deployed patch reads, and the rest of what it says."""
    data: Dict[str, Any] = {
        "name": patch.name, "summary": patch.summary, "engine": patch.engine,
        "markers": {path: (m.literal if m.literal is not None else {"regex": m.regex})
                    for path, m in sorted(patch.markers.items())},
        "expect": list(patch.expect), "forbid": list(patch.forbid), "smoke_expect": list(patch.smoke_expect),
        "executed": patch.executed, "allow_single_path": patch.allow_single_path,
    }
    if patch.superseded is not None:
        data["superseded"] = {"engine_versions": patch.superseded.spec_text, "use": patch.superseded.use}
    return data


def revision_data(revision: Revision) -> Dict[str, Any]:
    return {"rev": revision.rev, "engine_versions": revision.spec_text or str(revision.engine_versions),
            "diff": revision.diff_file.name, "diff_sha256": revision.diff_sha256,
            "files": {f.path: f.op for f in revision.files}}


def record_of(patch: Patch, revision: Revision, added: Optional[Dict[str, List[int]]] = None) -> protocol.PatchRecord:
    """What the host keeps of `revision` of `patch`; `added`: the lines it adds as applied there."""
    return protocol.PatchRecord(manifest=manifest_data(patch), revision=revision_data(revision),
                                added={p: list(lines) for p, lines in (added or {}).items()})


def _marker(path: str, value: Any) -> Marker:
    if isinstance(value, dict):
        return Marker(path=path, regex=value.get("regex"))
    return Marker(path=path, literal=value)


def _spec(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(text or "")
    except InvalidSpecifier:   # a record is judged by its markers, never refused for this
        return SpecifierSet("")


def patch_of(record: protocol.PatchRecord) -> Patch:
    """The deployed patch rebuilt from the host's record: its markers, expect, forbid and the
    revision that was deployed (its diff's text is not kept; `record["added"]` has its lines)."""
    m, r = record.get("manifest") or {}, record.get("revision") or {}
    files = [FileDiff(path=path, raw_path=path, hunks=[], op=op) for path, op in sorted((r.get("files") or {}).items())]
    revision = Revision(rev=r.get("rev"), diff_file=RECORD_SOURCE / (r.get("diff") or ""), diff_text="",
                        diff_sha256=r.get("diff_sha256") or "", engine_versions=_spec(r.get("engine_versions")),
                        files=files, spec_text=r.get("engine_versions") or "")
    sup = m.get("superseded")
    superseded = (Superseded(engine_versions=_spec(sup.get("engine_versions")), spec_text=sup.get("engine_versions"),
                             use=sup.get("use") or "") if isinstance(sup, dict) else None)
    return Patch(name=m.get("name") or "", summary=m.get("summary") or "", engine=m.get("engine") or "",
                 revisions=[revision], markers={p: _marker(p, v) for p, v in (m.get("markers") or {}).items()},
                 expect=list(m.get("expect") or []), forbid=list(m.get("forbid") or []),
                 allow_single_path=m.get("allow_single_path"), source_dir=RECORD_SOURCE / (m.get("name") or ""),
                 smoke_expect=list(m.get("smoke_expect") or []), executed=m.get("executed") or "any",
                 superseded=superseded)


def differences(local: Patch, record: protocol.PatchRecord) -> List[str]:
    """How the local folder `local` differs from the host's record, one phrase per file or key:
    'patch.yaml markers.EAGLEWorkerV2', 'x.r1.diff sha256 1a2b3c4d5e6f here, 9f8e7d6c5b4a deployed'."""
    recorded, here = record.get("manifest") or {}, manifest_data(local)
    out = []
    for key in sorted(set(recorded) | set(here)):
        if key == "markers":
            rec_m, loc_m = recorded.get(key) or {}, here.get(key) or {}
            out += [f"patch.yaml markers.{p}" for p in sorted(set(rec_m) | set(loc_m)) if rec_m.get(p) != loc_m.get(p)]
        elif recorded.get(key) != here.get(key):
            out.append(f"patch.yaml {key}")
    rev = (record.get("revision") or {})
    mine = local.revision(rev.get("rev"))
    if mine is None:
        out.append(f"patch.yaml revisions: no rev {rev.get('rev')}")
    elif mine.diff_sha256 != rev.get("diff_sha256"):
        out.append(f"{mine.diff_file.name} sha256 {mine.diff_sha256[:12]} here, "
                   f"{str(rev.get('diff_sha256'))[:12]} deployed")
    elif (mine.spec_text or str(mine.engine_versions)) != rev.get("engine_versions"):
        out.append(f"patch.yaml revisions[rev={mine.rev}].engine_versions")
    return out
