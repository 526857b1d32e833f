"""patches/ directories: manifests, revision choice by engine version, path safety, the sibling rule.

A patch is a folder ``<dir>/<name>/`` holding ``patch.yaml`` and one unified
diff per revision. `load_patch` validates everything that can be checked
without a host -- the manifest (keys and types), every revision's diff
(parsed by `diffapply.parse_diff`, which refuses unsafe paths), and the two
rules that keep a patch from silently never running:

- the sibling rule: a revision that changes one file of a sibling pair of the
  engine profile (for SGLang ``eagle_worker.py`` / ``eagle_worker_v2.py``) and
  not the other is refused (a revision whose ``engine_versions`` admit no
  release the profile knows: on each host whose files hold that sibling, by
  ``check-patch`` and ``deploy-patch``);
- the marker rule: a revision that changes or creates a file bearing a code
  path must have a marker for (at least one of) that file's paths (a deleted
  file's code runs nowhere, so it needs none) -- only where markers alone judge
  execution: ``executed: off`` at load, ``--no-probe`` or ``engine.probe:
  false`` before any host is contacted (`require_markers`);

both unless the manifest says ``allow_single_path: "<reason>"``. A file that a
revision creates or deletes (`FileDiff.op`, see `diffapply`) counts as changed
for the sibling rule, and keeps diffapply's path rules (inside the package, no
``..``, no ``__pycache__``). Every
problem is a `PatchError` (exit 2) naming the file, the key or line, and the fix.

`Patch.choose` picks the revision for one host's engine version; a host with
no fitting revision is a per-host failure (`NoRevisionFits`), not exit 2.
"""
from __future__ import annotations

import difflib
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

import fleetpatch

from .diffapply import CREATE, DELETE, DiffError, FileDiff, parse_diff, refuse_crlf_hunks
from .errors import FleetpatchError, UsageError
from .inventory import decode_utf8, load_yaml, value_shown, key_shown

__all__ = [
    "PatchError",
    "NoRevisionFits",
    "Marker",
    "Prove",
    "Revision",
    "Superseded",
    "Patch",
    "search_dirs",
    "parse_ref",
    "load_patch",
    "available_patches",
    "shipped_dir",
    "MANIFEST",
]

MANIFEST = "patch.yaml"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TOP_KEYS = ("name", "summary", "engine", "revisions", "markers", "executed", "expect", "smoke_expect", "forbid",
             "allow_single_path", "superseded", "unported", "prove")
_REV_KEYS = ("rev", "diff", "engine_versions")
_MARKER_KEYS = ("regex",)
_SUPERSEDED_KEYS = ("engine_versions", "use")
_UNPORTED_KEYS = ("engine_versions", "why")
_PROVE_KEYS = ("requests", "concurrency", "max_new_tokens", "wait")
EXECUTED = ("any", "off")   # patch.yaml's `executed:`: the probe may judge execution, or markers alone


class PatchError(UsageError):
    """A patch that cannot be used (exit 2): names the file (patch.yaml / .diff), the key or line, and the fix."""

    def __init__(self, message: str, *, file: Optional[str] = None, key: Optional[str] = None):
        self.file = file
        self.key = key
        super().__init__(message)


def _perr(file: str, key: Optional[str], reason: str) -> PatchError:
    return PatchError(f"{file}: {key}: {reason}" if key else f"{file}: {reason}", file=file, key=key)


def _did_you_mean(word: Any, known: Sequence[str]) -> str:
    """' (did you mean 'X'?)' for the known word closest to `word`, case ignored; '' when none is close."""
    if not isinstance(word, str) or not word.strip():
        return ""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(word.strip().lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def _refuse_unknown_keys(file: str, prefix: str, node: dict, known: Sequence[str], shape: str = "") -> None:
    """Exit 2 on the first key of `node` that is not in `known`, naming it and the likely one."""
    for k in node:
        if k not in known:
            where = f"{prefix}.{key_shown(k)}" if prefix else key_shown(k)
            raise _perr(file, where, f"unknown key{_did_you_mean(k, known)}; "
                                     f"{shape or 'known keys: ' + ', '.join(known)}")


class NoRevisionFits(FleetpatchError):
    """No revision of the patch admits this host's engine version (a per-host failure, not exit 2)."""


@dataclass(frozen=True)
class Marker:
    path: str                  # code path name, e.g. "EAGLEWorker"
    literal: Optional[str] = None
    regex: Optional[str] = None

    def matches(self, line: str) -> bool:
        if self.literal is not None:
            return self.literal in line
        if self.regex is not None:
            return re.search(self.regex, line) is not None
        return False

    def describe(self) -> str:
        if self.literal is not None:
            return f'"{self.literal}"'
        return f"regex /{self.regex}/"


@dataclass(frozen=True)
class Superseded:
    """patch.yaml's `superseded:`: from these engine versions on, upstream has the change; `use` says how."""

    engine_versions: SpecifierSet
    spec_text: str             # as written in patch.yaml
    use: str                   # what to use instead, e.g. "--speculative-adaptive"

    def admits(self, engine_version: str) -> bool:
        try:
            return self.engine_versions.contains(Version(str(engine_version)), prereleases=True)
        except InvalidVersion:
            return False


@dataclass
class Revision:
    rev: int
    diff_file: Path
    diff_text: str
    diff_sha256: str           # of the .diff file's bytes
    engine_versions: SpecifierSet
    files: List[FileDiff]
    spec_text: str = ""        # engine_versions as written in patch.yaml

    @property
    def paths(self) -> List[str]:
        return [f.path for f in self.files]

    def admits(self, engine_version: str) -> bool:
        try:
            v = Version(engine_version)
        except (InvalidVersion, TypeError):
            return False
        return self.engine_versions.contains(v, prereleases=True)


@dataclass(frozen=True)
class Prove:
    """patch.yaml's `prove:`: the smoke requests each restarted server gets before its verdict,
    so that lines which run per request (or only for larger batches) get their chance to run."""

    requests: int = 1                      # 0 sends none
    concurrency: int = 1                   # how many at once
    max_new_tokens: Optional[int] = None   # None: server.smoke's
    wait: float = 10.0                     # seconds to keep watching after the last answer, while unproven


@dataclass(frozen=True)
class Unported:
    """patch.yaml's `unported:`: engine versions no revision fits, and why (what a port must deal with)."""

    engine_versions: SpecifierSet
    why: str

    def admits(self, engine_version: str) -> bool:
        try:
            return self.engine_versions.contains(Version(str(engine_version)), prereleases=True)
        except InvalidVersion:
            return False


@dataclass
class Patch:
    name: str
    summary: str
    engine: str
    revisions: List[Revision]          # ascending rev
    markers: Dict[str, Marker]         # code path name -> Marker
    expect: List[str]
    forbid: List[str]
    allow_single_path: Optional[str]
    source_dir: Path
    # lines the log must show after the smoke request of a router-aware restart:
    # proof that the patched code ran for a request, not only at start-up
    smoke_expect: List[str] = field(default_factory=list)
    # "any": the probe may judge whether the patched code ran (the default); "off": markers alone
    executed: str = "any"
    superseded: Optional[Superseded] = None
    unported: Optional[Unported] = None
    prove: Prove = field(default_factory=Prove)

    @property
    def manifest(self) -> Path:
        return self.source_dir / MANIFEST

    def revision(self, rev: int) -> Optional[Revision]:
        for r in self.revisions:
            if r.rev == rev:
                return r
        return None

    def support(self) -> str:
        """'r1 ==0.5.9, r2 ==0.5.8': what each revision supports."""
        return ", ".join(f"r{r.rev} {r.spec_text or str(r.engine_versions) or '(any version)'}"
                         for r in self.revisions)

    def choose(self, rev: Optional[int], engine_version: str) -> Revision:
        """The revision for a host running `engine_version`: `rev` if given (and it fits), else the newest that fits."""
        try:
            Version(str(engine_version))
        except InvalidVersion:
            raise NoRevisionFits(f"{self.name}: the host's {self.engine} version {engine_version!r} is not a "
                                 f"PEP 440 version, so no revision can be chosen; revisions support: "
                                 f"{self.support()}") from None
        if rev is not None:
            r = self.revision(rev)
            if r is None:
                raise NoRevisionFits(f"{self.name} has no revision {rev}; revisions: "
                                     f"{', '.join(str(x.rev) for x in self.revisions)}")
            if not r.admits(engine_version):
                fitting = [x.rev for x in self.revisions if x.admits(engine_version)]
                hint = (f"; r{fitting[-1]} does: use {self.label(fitting[-1])}, or {self.name} to choose by version"
                        if fitting else "")
                raise NoRevisionFits(f"{self.label(rev)} does not support {self.engine} {engine_version}: "
                                     f"r{rev} supports {r.spec_text or r.engine_versions}{hint}")
            return r
        for r in sorted(self.revisions, key=lambda x: x.rev, reverse=True):
            if r.admits(engine_version):
                return r
        why = (f": {self.unported.why}" if self.unported is not None and self.unported.admits(engine_version)
               else "")
        raise NoRevisionFits(f"{self.name} has no revision for {self.engine} {engine_version}{why}; "
                             f"revisions support: {self.support()}")

    def label(self, rev: Union[int, Revision, None]) -> str:
        """'name@rev' ('name' when the revision is unknown): how every message names a patch's revision."""
        if isinstance(rev, Revision):
            rev = rev.rev
        return f"{self.name}@{rev}" if rev is not None else self.name


# --------------------------------------------------------------------------- lookup


def shipped_dir() -> Path:
    """The patches shipped inside the fleetpatch package."""
    return Path(fleetpatch.__file__).parent / "patches"


def search_dirs(patches_opt: Optional[str], cwd: Path) -> List[Path]:
    """[DIR] if given, then cwd/"patches" if it exists, then the shipped fleetpatch/patches."""
    dirs: List[Path] = []
    if patches_opt:
        d = Path(os.path.expanduser(str(patches_opt)))
        if not d.is_absolute():
            d = Path(cwd) / d
        if not d.is_dir():
            raise PatchError(f"--patches {patches_opt}: not a directory (it should hold <name>/patch.yaml folders)")
        dirs.append(d)
    local = Path(cwd) / "patches"
    if local.is_dir():
        dirs.append(local)
    dirs.append(shipped_dir())
    out: List[Path] = []
    seen = set()
    for d in dirs:
        key = os.path.realpath(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def parse_ref(ref: str) -> Tuple[str, Optional[int]]:
    """'name' -> ('name', None); 'name@3' (or 'name@r3') -> ('name', 3)."""
    if not isinstance(ref, str) or not ref.strip():
        raise PatchError("--patch: give a patch as NAME or NAME@REV")
    ref = ref.strip()
    name, sep, rev_s = ref.partition("@")
    if not _NAME.match(name):
        raise PatchError(f"--patch {ref}: {name!r} is not a patch name (letters, digits, '.', '-', '_'; "
                         "give NAME or NAME@REV)")
    if not sep:
        return name, None
    m = re.match(r"^[rR]?(\d+)$", rev_s)
    if not m or int(m.group(1)) < 1:
        raise PatchError(f"--patch {ref}: {rev_s!r} is not a revision number (give NAME@REV, e.g. {name}@1)")
    return name, int(m.group(1))


def available_patches(dirs: Sequence[Path]) -> List[str]:
    names = set()
    for d in dirs:
        try:
            for child in Path(d).iterdir():
                if (child / MANIFEST).is_file():
                    names.add(child.name)
        except OSError:
            continue
    return sorted(names)


def _display(path: Path) -> str:
    """A path as the user would write it: relative to the current folder when inside it."""
    try:
        cwd = Path.cwd()
        p = Path(os.path.abspath(path))
        return str(p.relative_to(cwd))
    except (ValueError, OSError):
        return str(path)


# --------------------------------------------------------------------------- validation


def _str(file: str, key: str, value: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise _perr(file, key, f"expected a string, got {value_shown(value)}")
    if not empty_ok and not value.strip():
        raise _perr(file, key, "must not be empty")
    return value


def _str_list(file: str, key: str, value: Any) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _perr(file, key, f"expected a list of strings, got {value_shown(value)}")
    return [_str(file, f"{key}[{i}]", v) for i, v in enumerate(value)]


def _marker(file: str, name: Any, value: Any, profile) -> Marker:
    known = list(getattr(profile, "path_names", lambda: [])() or [])
    example = known[0] if known else "EAGLEWorker"
    if not isinstance(name, str) or not name.strip():
        raise _perr(file, f"markers.{value_shown(name)}", f"a marker's key must be a code path name, e.g. {example}")
    key = f"markers.{key_shown(name)}"
    if known and name not in known:
        engine = getattr(profile, "kind", "") or "the engine"
        noun = getattr(profile, "path_noun", "") or "code path"
        raise _perr(file, key, f"{engine} has no {noun} {name!r}{_did_you_mean(name, known)}; a marker's key "
                               f"is the code path it proves ran, one of: {', '.join(known)}")
    if isinstance(value, str):
        if not value.strip():
            raise _perr(file, key, "must not be empty: an empty marker would match every line")
        return Marker(path=name, literal=value)
    if isinstance(value, dict):
        _refuse_unknown_keys(file, key, value, _MARKER_KEYS, 'a marker is a literal string or {regex: "..."}')
        if "regex" not in value:
            raise _perr(file, f"{key}.regex", 'required: a marker is a literal string or {regex: "..."}')
        rx = _str(file, f"{key}.regex", value["regex"])
        try:
            compiled = re.compile(rx)
        except (re.error, OverflowError, RecursionError) as exc:  # "a{4294967296}" overflows
            raise _perr(file, f"{key}.regex", f"invalid regular expression {rx!r}: {exc}") from None
        if compiled.search("") is not None:
            raise _perr(file, f"{key}.regex", f"{rx!r} matches an empty line, so it would match every line; "
                                              "make it match only the patched code's log line")
        return Marker(path=name, regex=rx)
    raise _perr(file, key, f'expected a literal string or {{regex: "..."}}, got {value_shown(value)}')


def _markers(file: str, node: Any, profile) -> Dict[str, Marker]:
    """`markers:` checked: known code paths only, and no two paths with the same marker."""
    if node is None:
        return {}
    if not isinstance(node, dict):
        raise _perr(file, "markers", f"expected a mapping of code path -> marker, got {value_shown(node)}")
    markers: Dict[str, Marker] = {}
    for name, value in node.items():
        marker = _marker(file, name, value, profile)
        for other in markers.values():
            if (other.literal, other.regex) == (marker.literal, marker.regex):
                raise _perr(file, f"markers.{key_shown(name)}",
                            f"the same marker as markers.{key_shown(other.path)} ({marker.describe()}): a line it "
                            f"matches would not tell {other.path} from {name}. Give each path a line that only "
                            "its own code logs")
        markers[name] = marker
    return markers


def _spec(file: str, key: str, spec_text: Any) -> SpecifierSet:
    """A non-empty PEP 440 specifier string (`engine_versions`)."""
    if not isinstance(spec_text, str):
        raise _perr(file, key, f"expected a PEP 440 specifier string such as \"==0.5.9\", got {value_shown(spec_text)} "
                               "(quote it)")
    try:
        spec = SpecifierSet(spec_text)
    except InvalidSpecifier:
        raise _perr(file, key, f"{spec_text!r} is not a PEP 440 version specifier (e.g. \"==0.5.9\", "
                               f"\">=0.5.8,<0.5.10\")") from None
    if not spec_text.strip():
        raise _perr(file, key, 'must not be empty: say which engine versions it is for, e.g. "==0.5.9"')
    return spec


def _executed(file: str, value: Any) -> str:
    """`executed: any|off` (YAML reads a bare off as false)."""
    if value is None or value == "any":
        return "any"
    if value is False or value == "off":
        return "off"
    raise _perr(file, "executed", f"expected any (the default: the probe may judge execution) or off (markers "
                                  f"alone), got {value_shown(value)}")


def _prove(file: str, node: Any) -> Prove:
    """`prove: {requests, concurrency, max_new_tokens, wait}`, each optional."""
    if node is None:
        return Prove()
    if not isinstance(node, dict):
        raise _perr(file, "prove", "expected a mapping {requests: 1, concurrency: 1, max_new_tokens: 8, wait: 10}, "
                                   f"got {value_shown(node)}")
    _refuse_unknown_keys(file, "prove", node, _PROVE_KEYS)
    least = {"requests": 0, "concurrency": 1, "max_new_tokens": 1, "wait": 0}
    for key, value in node.items():
        number = (int, float) if key == "wait" else (int,)
        if isinstance(value, bool) or not isinstance(value, number) or value < least[key]:
            what = "a number of seconds" if key == "wait" else "a whole number"
            raise _perr(file, f"prove.{key}", f"expected {what}, at least {least[key]}, got {value_shown(value)}")
    return Prove(**{k: (float(v) if k == "wait" else v) for k, v in node.items()})


def _superseded(file: str, node: Any) -> Optional[Superseded]:
    """`superseded: {engine_versions, use}`: from which engine versions on upstream has the change."""
    if node is None:
        return None
    if not isinstance(node, dict):
        raise _perr(file, "superseded", f'expected a mapping {{engine_versions: ">=...", use: "..."}}, '
                                        f"got {value_shown(node)}")
    _refuse_unknown_keys(file, "superseded", node, _SUPERSEDED_KEYS)
    for k in _SUPERSEDED_KEYS:
        if node.get(k) is None:
            raise _perr(file, f"superseded.{k}", "required but missing")
    spec = _spec(file, "superseded.engine_versions", node["engine_versions"])
    use = _str(file, "superseded.use", node["use"]).strip()
    return Superseded(engine_versions=spec, spec_text=node["engine_versions"].strip(), use=use)


def _unported(file: str, node: Any) -> Optional[Unported]:
    """`unported: {engine_versions, why}`: the versions that no revision fits, and why."""
    if node is None:
        return None
    if not isinstance(node, dict):
        raise _perr(file, "unported", f'expected a mapping {{engine_versions: ">=...", why: "..."}}, got {value_shown(node)}')
    _refuse_unknown_keys(file, "unported", node, _UNPORTED_KEYS)
    for k in _UNPORTED_KEYS:
        if node.get(k) is None:
            raise _perr(file, f"unported.{k}", "required but missing")
    spec = _spec(file, "unported.engine_versions", node["engine_versions"])
    return Unported(engine_versions=spec, why=" ".join(_str(file, "unported.why", node["why"]).split()))


def _read_diff(folder: Path, file: str, key: str, name: Any, profile,
               package: str) -> Tuple[Path, str, str, List[FileDiff]]:
    diff_name = _str(file, key, name)
    if re.search(r"[\x00-\x1f\x7f]", diff_name):
        raise _perr(file, key, f"{diff_name!r} contains a control character; give the name of a .diff file in "
                               f"{_display(folder)}/")
    if "/" in diff_name or "\\" in diff_name or diff_name in (".", "..") or diff_name == MANIFEST:
        raise _perr(file, key, f"{diff_name!r} must be the name of a .diff file in {_display(folder)}/ "
                               "(no directories)")
    path = folder / diff_name
    shown = _display(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        have = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
        raise _perr(file, key, f"{diff_name!r}: no such file in {_display(folder)}/"
                               + (f" (files there: {', '.join(have)})" if have else "")) from None
    except IsADirectoryError:
        raise _perr(file, key, f"{diff_name!r} is a directory, not a diff file") from None
    except OSError as exc:
        raise _perr(file, key, f"cannot read {shown}: {exc.strerror or exc}") from None
    text = data.decode("utf-8", "surrogateescape")
    try:
        files = parse_diff(text, shown, package=package)
        ending_of = getattr(profile, "line_ending", None)
        if ending_of is not None:
            refuse_crlf_hunks(files, shown, ending_of, getattr(profile, "kind", "") or package)
    except DiffError as exc:
        err = PatchError(str(exc), file=shown, key=None)
        err.diff_error = exc  # type: ignore[attr-defined]
        raise err from exc
    return path, text, hashlib.sha256(data).hexdigest(), files


def _check_rules(patch_file: str, diff_shown: str, rev: int, files: List[FileDiff], markers: Dict[str, Marker],
                 allow_single_path: Optional[str], profile, spec: Optional[SpecifierSet] = None) -> None:
    """The sibling rule, and the marker rule unless `markers` is None (the probe judges execution)."""
    if allow_single_path:
        return
    changed = [f.path for f in files]
    fix = ('or, if the patch really concerns one path only, set allow_single_path: "<reason>" in '
           f"{patch_file}")
    # Only pairs that exist in the versions this revision targets: 0.5.13+ has no v1 file.
    # A revision for releases the profile does not know has its sibling rule judged on each
    # host, by the files that host has (steps.plan), not here.
    pairs = (profile.siblings_for(spec) if spec is not None and hasattr(profile, "siblings_for")
             else getattr(profile, "sibling_pairs", []))
    for have, miss in lone_siblings(changed, pairs)[:1]:
        raise PatchError(
            f"{diff_shown}: revision {rev} changes {have} but not its sibling {miss}: a server on the "
            f"other code path would run the unpatched file and the patch would never execute. "
            f"Patch both files, {fix}", file=diff_shown)
    if markers is None:
        return   # the probe proves which lines ran: markers are optional
    gap = _marker_gap(files, markers, profile)
    if gap is not None:
        path, paths, verb = gap
        want = " or ".join(paths)
        raise PatchError(
            f"{diff_shown}: revision {rev} {verb} {path} (code path {want}) but {patch_file} has no marker "
            f"for {want}: nothing would prove the patched code ran. Add markers: {{{paths[0]}: "
            f'"<a line only the patched code logs>"}}, {fix}', file=diff_shown)


def lone_siblings(changed: Sequence[str], pairs) -> List[Tuple[str, str]]:
    """(the changed file, its unchanged sibling) of each sibling pair that `changed` holds one file of."""
    return [((a, b) if a in changed else (b, a)) for a, b in pairs or [] if (a in changed) != (b in changed)]


def _marker_gap(files: List[FileDiff], markers, profile) -> Optional[Tuple[str, List[str], str]]:
    """(file, its code paths, verb) of the first changed or created path-bearing file without a marker."""
    # Deleted code logs nothing: the marker rule is for the files whose code will run.
    for fd in files:
        if fd.op == DELETE:
            continue
        paths = list(profile.paths_of_file(fd.path) or [])
        if paths and not any(p in markers for p in paths):
            return fd.path, paths, "creates" if fd.op == CREATE else "changes"
    return None


def require_markers(patch: "Patch", profile, why: str) -> None:
    """With the probe off (`why`: --no-probe, engine.probe: false), markers alone judge execution:
    a revision that changes a path-bearing file without a marker for its path is refused (exit 2)."""
    if patch.allow_single_path:
        return
    for revision in patch.revisions:
        gap = _marker_gap(revision.files, patch.markers, profile)
        if gap is not None:
            path, paths, verb = gap
            raise PatchError(
                f"{_display(patch.manifest)}: {why} judges by markers alone, but revision {revision.rev} {verb} "
                f"{path} (code path {' or '.join(paths)}) and {patch.name} has no marker for "
                f"{' or '.join(paths)}: nothing would prove the patched code ran. Add markers: {{{paths[0]}: "
                f'"<a line only the patched code logs>"}}, or let the probe judge (drop {why})',
                file=_display(patch.manifest), key="markers")


def load_patch(ref: str, dirs: List[Path], profile) -> Tuple[Patch, Optional[int]]:
    """Find and validate the patch named by `ref` ("name" or "name@rev"); returns (patch, rev or None)."""
    name, want_rev = parse_ref(ref)
    folder: Optional[Path] = None
    for d in dirs:
        cand = Path(d) / name / MANIFEST
        if cand.is_file():
            folder = cand.parent
            break
    if folder is None:
        avail = available_patches(dirs)
        looked = ", ".join(_display(Path(d)) for d in dirs)
        raise PatchError(f"unknown patch {name!r}; available: {', '.join(avail) if avail else '(none)'} "
                         f"(looked in {looked})")
    patch = _load_folder(folder, name, profile)
    if want_rev is not None and patch.revision(want_rev) is None:
        raise PatchError(f"{_display(patch.manifest)}: {name} has no revision {want_rev}; revisions: "
                         f"{', '.join(str(r.rev) for r in patch.revisions)} ({patch.support()})",
                         file=_display(patch.manifest), key="revisions")
    return patch, want_rev


def manifest_engine(ref: str, dirs: List[Path]) -> Optional[str]:
    """The `engine:` a patch's manifest names, or None where it cannot be read (load_patch says why)."""
    name = parse_ref(ref)[0]
    for d in dirs:
        if (Path(d) / name / MANIFEST).is_file():
            try:
                engine = _read_manifest(Path(d) / name)[1].get("engine")
            except PatchError:
                return None
            return engine if isinstance(engine, str) else None
    return None


def _read_manifest(folder: Path) -> tuple:
    """(how messages name patch.yaml, its top-level mapping), the keys checked."""
    manifest = folder / MANIFEST
    file = _display(manifest)
    try:
        data = manifest.read_bytes()
    except OSError as exc:
        raise _perr(file, None, f"cannot read: {exc.strerror or exc}") from None
    doc = load_yaml(decode_utf8(data, file, _perr), file, _perr)
    if doc is None:
        raise _perr(file, None, "empty; expected name, engine, revisions, markers")
    if not isinstance(doc, dict):
        raise _perr(file, None, f"expected a mapping at the top, got {value_shown(doc)}")
    _refuse_unknown_keys(file, "", doc, _TOP_KEYS)
    for k in ("name", "engine", "revisions"):
        if doc.get(k) is None:
            raise _perr(file, k, "required but missing")
    return file, doc


@dataclass(frozen=True)
class _Manifest:
    """Where a patch.yaml is read from, and the engine its diffs are checked against."""
    file: str
    folder: Path
    profile: Any
    package: str


def _revision(m: _Manifest, i: int, node, seen: Dict[int, str], markers, asp) -> Revision:
    """One entry of `revisions`, its diff read and the path rules checked."""
    file, key = m.file, f"revisions[{i}]"
    if not isinstance(node, dict):
        raise _perr(file, key, f"expected a mapping with rev, diff, engine_versions, got {value_shown(node)}")
    _refuse_unknown_keys(file, key, node, _REV_KEYS)
    for k in _REV_KEYS:
        if node.get(k) is None:
            raise _perr(file, f"{key}.{k}", "required but missing")
    rev = node["rev"]
    if isinstance(rev, bool) or not isinstance(rev, int) or rev < 1:
        raise _perr(file, f"{key}.rev", f"expected a positive integer, got {value_shown(rev)}")
    if rev in seen:
        raise _perr(file, f"{key}.rev", f"revision {rev} is listed twice (also {seen[rev]})")
    seen[rev] = key
    spec_text = node["engine_versions"]
    spec = _spec(file, f"{key}.engine_versions", spec_text)
    path, diff_text, sha, files = _read_diff(m.folder, file, f"{key}.diff", node["diff"], m.profile, m.package)
    _check_rules(file, _display(path), rev, files, markers, asp, m.profile, spec)
    return Revision(rev=rev, diff_file=path, diff_text=diff_text, diff_sha256=sha,
                    engine_versions=spec, files=files, spec_text=spec_text.strip())


def _load_folder(folder: Path, name: str, profile) -> Patch:
    file, doc = _read_manifest(folder)

    pname = _str(file, "name", doc["name"])
    if pname != name:
        raise _perr(file, "name", f"{pname!r} must equal the folder name {name!r}")
    summary = _str(file, "summary", doc.get("summary") or "", empty_ok=True)
    engine = _str(file, "engine", doc["engine"])
    kind = getattr(profile, "kind", None)
    if kind and engine != kind:
        raise _perr(file, "engine", f"this patch is for {engine!r}, but the engine profile is {kind!r}")
    package = getattr(profile, "package", None) or engine

    markers = _markers(file, doc.get("markers"), profile)
    executed = _executed(file, doc.get("executed"))
    superseded = _superseded(file, doc.get("superseded"))
    unported = _unported(file, doc.get("unported"))
    prove = _prove(file, doc.get("prove"))

    expect = _str_list(file, "expect", doc.get("expect"))
    forbid = _str_list(file, "forbid", doc.get("forbid"))
    smoke_expect = _str_list(file, "smoke_expect", doc.get("smoke_expect"))
    asp = doc.get("allow_single_path")
    if asp is not None:
        if not isinstance(asp, str) or not asp.strip():
            raise _perr(file, "allow_single_path",
                        f"expected a non-empty reason (a string), got {value_shown(asp)}")

    revs_node = doc["revisions"]
    if not isinstance(revs_node, list):
        raise _perr(file, "revisions", f"expected a list of {{rev, diff, engine_versions}}, got {value_shown(revs_node)}")
    if not revs_node:
        raise _perr(file, "revisions", "no revisions listed")
    revisions: List[Revision] = []
    seen: Dict[int, str] = {}
    manifest = _Manifest(file, folder, profile, package)
    for i, node in enumerate(revs_node):
        # with `executed: off` markers alone judge execution: the marker rule holds at load
        rule_markers = markers if executed == "off" else None
        revisions.append(_revision(manifest, i, node, seen, rule_markers, asp))
    revisions.sort(key=lambda r: r.rev)
    return Patch(name=pname, summary=summary, engine=engine, revisions=revisions, markers=markers,
                 expect=expect, forbid=forbid, allow_single_path=asp, source_dir=folder, smoke_expect=smoke_expect,
                 executed=executed, superseded=superseded, unported=unported, prove=prove)
