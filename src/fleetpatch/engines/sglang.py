"""The SGLang engine profile: files, code paths, routing and log signatures.

What each release has (files, worker classes and where `create_worker` takes
them from, siblings, algorithms, the lines that show the path, the ready line,
the ServerArgs dump's shape) is data: engines/sglang_releases/<release>.json,
generated from the release's PyPI wheel by `invoke engine-facts --version X`
(sglang_wheel.py reads the wheel with ast, never imports it) and loaded by
sglang_facts.py.  This module holds the routing logic those facts feed.
Paths are relative to the directory that holds the `sglang` package.

How SGLang picks its speculative worker, by version range
---------------------------------------------------------
The scheduler asks `SpeculativeAlgorithm.create_worker(server_args)`
(sglang/srt/speculative/spec_info.py; a registry plus `scheduler.py` in 0.5.7)
for the worker class.  For the EAGLE family the choice is made only by
`server_args.disable_overlap_schedule` (+ `enable_multi_layer_eagle`), which
`ServerArgs._handle_speculative_decoding` sets at startup:

* 0.5.7           SGLANG_ENABLE_SPEC_V2 (default False) opts EAGLE/EAGLE3 into
                  spec v2; topk > 1 on v2 is a ValueError.  STANDALONE has no v2
                  worker (StandaloneWorker always).  Multi-layer EAGLE is chosen
                  in scheduler.py for any algorithm.
* 0.5.8 - 0.5.10  as 0.5.7, STANDALONE joins spec v2 (StandaloneWorkerV2).
* 0.5.11          SGLANG_ENABLE_SPEC_V2 defaults to True: spec v2 unless topk > 1
                  (silent fallback to v1), SGLANG_ENABLE_SPEC_V2 false, or
                  --disable-overlap-schedule.  DFLASH -> DFlashWorker.
* 0.5.12          as 0.5.11; --speculative-algorithm is free text (uppercased,
                  plugins); FROZEN_KV_MTP -> FrozenKVMTPWorker.
* 0.5.13          the v1 EAGLE/standalone/multi-layer workers are gone: always the
                  V2 class; SGLANG_ENABLE_SPEC_V2 false only selects non-overlap
                  (synchronous) scheduling.  The logic moved to
                  sglang/srt/arg_groups/speculative_hook.py.
* 0.5.14 - 0.5.23 SGLANG_ENABLE_SPEC_V2 is removed (a warning if set, to 0.5.20); DFLASH
                  and FROZEN_KV_MTP use V2 workers; NGRAMWorker is a BaseSpecWorker;
                  DSPARK (0.5.16+) and UNO (0.5.20+) join; overlapped or synchronous
                  (--disable-overlap-schedule) v2 is the only question.

A release without facts is *unknown*: `knows()` is False and nothing is guessed
(`version_note()` says how the path is judged instead).
"""
from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import sglang_facts as facts
from .base import EngineProfile, Evidence, Facts, LaunchConfig, Prediction, Resolution, Signature
from .sglang_facts import Release

SPEC = "sglang/srt/speculative/"
SERVER_ARGS = "sglang/srt/server_args.py"
ENVIRON = "sglang/srt/environ.py"
SPEC_INFO = SPEC + "spec_info.py"
SPEC_REGISTRY = SPEC + "spec_registry.py"
SPEC_HOOK = "sglang/srt/arg_groups/speculative_hook.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
ENGINE = "sglang/srt/entrypoints/engine.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"

# ----------------------------------------------------------------- releases
# Every release's files, worker classes, siblings, algorithms and recognised lines come
# from its facts file (engines/sglang_releases/<release>.json, generated from the wheel).
PATH_FILES = facts.PATH_FILES            # worker class -> its file (every known release)
SIBLING_PAIRS = facts.SIBLING_PAIRS      # files that serve one role on the v1 and the v2 path
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
ENV_SPEC_V2 = "SGLANG_ENABLE_SPEC_V2"
# sglang.srt.environ.EnvBool.parse: value.lower() in these lists, anything else (also "" and
# " true") warns "Invalid value for ..." and falls back to the default (checked per release).
ENV_TRUE = ("true", "1", "yes", "y")
ENV_FALSE = ("false", "0", "no", "n")
READY_LINE = "The server is fired up and ready to roll!"
# launch_dummy_health_check_server (utils/common.py, every release 0.5.7+), on a rank above 0
NODE_READY_LINE = "Dummy health check server started in background thread at "
DUMP_PREFIX = "server_args=ServerArgs("          # the dataclass repr, up to 0.5.18
DUMP_DICT_PREFIX = "server_args={"               # resolved_dict(), 0.5.19+ (redacted from 0.5.22)
TRACEBACK = facts.TRACEBACK
SIG = facts.SIGNATURES
DUMP, READY = SIG["DUMP"], SIG["READY"]
TOPK_V2_ERROR = SIG["F_TOPK"].text
PP_ERROR_OLD, PP_ERROR_NEW = SIG["F_PP_OLD"].text, SIG["F_PP_NEW"].text
DFLASH_PP_ERROR = "Currently DFLASH speculative decoding only supports pp_size == 1."
F_TRACEBACK, F_ARGPARSE = facts.F_TRACEBACK, facts.F_ARGPARSE
VersionRange = Release
RANGES: Tuple[Release, ...] = facts.RELEASES


def _range_of(version: str) -> Optional[Release]:
    name = facts.release_of(version)
    return facts.BY_NAME[name] if name else None



# ----------------------------------------------------------------- facts
# A field as the repr (`name=value`, up to 0.5.18) or the dict (`'name': value`, 0.5.19+) shows it.
_DUMP_FIELDS = {
    name: re.compile(rf"(?:(?<![A-Za-z0-9_]){name}=|['\"]{name}['\"]:\s*)({value})")
    for name, value in (("speculative_algorithm", r"None|'([^']*)'"),
                        ("enable_multi_layer_eagle", "True|False"), ("disable_overlap_schedule", "True|False"))
}


def dump_start(line: str) -> int:
    """Where the ServerArgs dump starts in a log line (-1: the line is not one)."""
    at = line.find(DUMP_PREFIX)
    return at if at >= 0 else line.find(DUMP_DICT_PREFIX)


def parse_dump(line: str) -> Dict[str, object]:
    """The routing fields of the ServerArgs dump, by field name, whatever the release's
    shape: `server_args=ServerArgs(...)` or `server_args={...}` (redacted or not)."""
    return dict(_parse_dump(line))


# A follow judges its whole log window again at each decisive batch (~20 times a host), and
# the dump is a line of several KiB that three look-behind searches scan each time: the
# laptop's largest cost per host (issue 34). The same line object comes back each time.
@functools.lru_cache(maxsize=256)
def _parse_dump(line: str) -> Tuple[Tuple[str, object], ...]:
    out: Dict[str, object] = {}
    start = dump_start(line)
    if start < 0:
        return ()
    body = line[start:]
    for name, rx in _DUMP_FIELDS.items():
        m = rx.search(body)
        if not m:
            continue
        if name == "speculative_algorithm":
            out[name] = None if m.group(1) == "None" else m.group(1)[1:-1]
        else:
            out[name] = m.group(1) == "True"
    return tuple(out.items())


# Which signatures a log line holds, for a release (None: not a known one). A follow judges
# its whole window again at each decisive batch, so each line is asked about ~20 times, each
# time against every signature (issue 34): asked once per line object here.
@functools.lru_cache(maxsize=64)   # a release's signatures are fixed
def _failures_of(release: Optional[str]) -> Tuple[Signature, ...]:
    if release is not None:
        return tuple(facts.BY_NAME[release].failures)
    out: List[Signature] = []
    for r in RANGES:
        for s in r.failures:
            if s not in out:
                out.append(s)
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def _first_failure(release: Optional[str], line: str) -> Optional[Signature]:
    for s in _failures_of(release):
        if s.matches(line):
            return s
    return None


@functools.lru_cache(maxsize=16384)
def _signatures_in(release: Optional[str], line: str) -> Tuple[Signature, ...]:
    sigs = facts.BY_NAME[release].signatures if release is not None else ()
    return tuple(s for s in sigs if s.matches(line))


def _fields_text(fields: Dict[str, object]) -> str:
    parts = []
    for name in ("speculative_algorithm", "enable_multi_layer_eagle", "disable_overlap_schedule"):
        if name in fields:
            v = fields[name]
            parts.append(f"{name}={v!r}" if isinstance(v, str) else f"{name}={v}")
    return ", ".join(parts)


def _dump_evidence(line: str, fields: Dict[str, object]) -> str:
    if DUMP_PREFIX in line:
        return f"{DUMP_PREFIX}... {_fields_text(fields)} ...)"
    return f"{DUMP_DICT_PREFIX}... {_fields_text(fields)} ...}}"


def _norm_algorithm(name: Optional[str]) -> Optional[str]:
    if name is None:
        return None
    up = str(name).upper()
    return "EAGLE" if up == "NEXTN" else up


# ----------------------------------------------------------------- launch parsing
_VALUE_FLAGS = {
    "--speculative-algorithm": "algorithm",
    "--speculative-eagle-topk": "topk",
    "--pp-size": "pp",
    "--pipeline-parallel-size": "pp",
    "--config": "config",
}
_BOOL_FLAGS = {
    "--enable-multi-layer-eagle": "multi_layer",
    "--disable-overlap-schedule": "disable_overlap",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class LaunchArgs:
    algorithm: Optional[str] = None
    topk: Optional[int] = None
    pp: int = 1
    multi_layer: bool = False
    disable_overlap: bool = False
    config: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)   # from an `env A=B ...` prefix
    errors: List[str] = field(default_factory=list)     # what argparse would reject
    given: List[str] = field(default_factory=list)      # the flags seen, for messages


def parse_argv(argv: Sequence[str]) -> LaunchArgs:
    """The speculative-decoding flags of a server command line, as argparse reads them.

    argv[0] is the interpreter or script (may contain spaces); `-m module`,
    `env A=B cmd ...` and `sh -c "cmd ..."` are understood.  Flags are `--flag
    value` or `--flag=value`; the last occurrence wins.  (argparse's prefix
    abbreviations such as `--speculative-algo` are not recognised.)
    """
    args = [str(a) for a in argv]
    out = LaunchArgs()
    # env A=B python ...
    while args and os.path.basename(args[0]) == "env":
        i = 1
        while i < len(args) and (args[i] in ("-i", "-") or _ENV_NAME.match(args[i])):
            if "=" in args[i]:
                k, _, v = args[i].partition("=")
                out.env[k] = v
            i += 1
        args = args[i:]
    # sh -c "python -m sglang.launch_server ..."
    if args and os.path.basename(args[0]) in ("sh", "bash", "dash", "zsh") and "-c" in args[1:]:
        i = args.index("-c", 1)
        if i + 1 < len(args):
            try:
                inner = parse_argv(shlex.split(args[i + 1]))
            except ValueError:
                inner = None
            if inner is not None:
                inner.env = {**out.env, **inner.env}
                return inner
    i = 1
    while i < len(args):
        tok = args[i]
        if tok == "--":
            break
        name, eq, val = tok.partition("=")
        if name in _VALUE_FLAGS:
            key = _VALUE_FLAGS[name]
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    val = args[i + 1]
                    i += 1
                else:
                    out.errors.append(f"argument {name}: expected one argument")
                    i += 1
                    continue
            out.given.append(f"{name} {val}")
            if key in ("topk", "pp"):
                try:
                    setattr(out, key, int(val))
                except ValueError:
                    out.errors.append(f"argument {name}: invalid int value: {val!r}")
            else:
                setattr(out, key, val)
        elif name in _BOOL_FLAGS and not eq:
            setattr(out, _BOOL_FLAGS[name], True)
            out.given.append(name)
        i += 1
    return out


def env_flag(raw: Optional[str], default: Optional[bool]) -> Tuple[Optional[bool], str, str]:
    """SGLANG_ENABLE_SPEC_V2 as sglang.srt.environ.EnvBool reads it.

    Returns (value, state, description); state is "unset" | "true" | "false" | "invalid".
    """
    if raw is None:
        return default, "unset", f"{ENV_SPEC_V2} is not set"
    low = raw.lower()
    if low in ENV_TRUE:
        return True, "true", f"{ENV_SPEC_V2}={raw}"
    if low in ENV_FALSE:
        return False, "false", f"{ENV_SPEC_V2}={raw}"
    return default, "invalid", (f"{ENV_SPEC_V2}={raw!r} is not a boolean (sglang reads it as its default, "
                                f"{default})")


# ----------------------------------------------------------------- the profile
class SGLangProfile(EngineProfile):
    kind = "sglang"
    package = "sglang"
    ready_line = READY_LINE
    node_ready_line = NODE_READY_LINE
    # "[2026-01-05 10:11:12 DP0 TP0] ": logging's time, then the data/tensor parallel ranks
    log_prefix = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[^\]]*\] ")
    # SGLANG_ENABLE_SPEC_V2 routes the worker; the rest of a server's environment may hold secrets
    launch_env_prefixes = ("SGLANG_",)
    # Facts.values: "algorithm" (str, or None = no speculative decoding), "multi_layer" (bool),
    # "overlap" (bool: overlap scheduling on, i.e. not disable_overlap_schedule)
    fact_keys = ("algorithm", "multi_layer", "overlap")
    path_noun, path_noun_short = "speculative decoding worker", "speculative worker"
    whole_evidence = (DUMP_PREFIX + "...", DUMP_DICT_PREFIX + "...")   # log_facts' summary of the (very long) ServerArgs dump
    ranges = RANGES

    def __init__(self) -> None:
        self.sibling_pairs: List[Tuple[str, str]] = list(SIBLING_PAIRS)

    # ---------------------------------------------------------- versions
    def range_for(self, version: Optional[str]) -> Optional[VersionRange]:
        return _range_of(str(version)) if version else None

    def knows(self, version: Optional[str]) -> bool:
        """Whether `version` is a release the profile has facts for (PEP 440: `0.5.23+cu128`
        is 0.5.23; a pre-release or dev build, or a release without facts, is not known)."""
        return self.range_for(version) is not None

    def release_of(self, version: Optional[str]) -> Optional[str]:
        """The known release `version` is ("0.5.23+cu128" -> "0.5.23"); None when not known."""
        return facts.release_of(version)

    def known_versions(self) -> str:
        return f"{RANGES[0].name} \u2013 {RANGES[-1].name}"

    def version_status(self, version: Optional[str]) -> str:
        """"known", "newer", "older", "pre-release" (also dev builds), "unreleased" (between
        known releases, e.g. a post release without facts), "missing" or "invalid"."""
        if self.knows(version):
            return "known"
        if version is None or not str(version).strip():
            return "missing"
        v = facts.parse(version)
        if v is None:
            return "invalid"
        if v.is_prerelease or v.is_devrelease:
            return "pre-release"
        if Version(v.public) > Version(RANGES[-1].name):
            return "newer"
        return "older" if Version(v.public) < Version(RANGES[0].name) else "unreleased"

    def add_release_command(self, version: Optional[str]) -> str:
        """The maintainer command that adds a release's facts (run in a fleetpatch checkout)."""
        return f"invoke engine-facts --version {version or '<version>'}"

    def version_note(self, version: Optional[str]) -> Optional[str]:
        """None for a known release; else one line saying why the path will not be predicted,
        and how it is judged instead (never the text "None")."""
        status = self.version_status(version)
        if status == "known":
            return None
        known, shown = self.known_versions(), str(version).strip() if version is not None else ""
        what = {"newer": f"SGLang {shown} is newer than the profile ({known})",
                "older": f"SGLang {shown} is older than the profile ({known})",
                "pre-release": f"SGLang {shown} is a pre-release or dev build, which the profile ({known}) "
                               "does not know",
                "unreleased": f"SGLang {shown} is not a release the profile knows ({known})",
                "missing": f"the host does not say which SGLang it runs (no version in its dist-info; "
                           f"the profile knows {known})",
                "invalid": f"SGLang version {shown!r} is not a PEP 440 version (the profile knows {known})"}[status]
        return what + ": the path will be judged by what runs (the probe) and the markers."

    # ---------------------------------------------------------- files and paths
    def fetch_files(self, version: Optional[str]) -> List[str]:
        """Files `fetch` copies.  For a known version they all exist in it; for None
        or an unknown version, the union over every range (a host may lack some)."""
        rng = self.range_for(version)
        if rng is not None:
            return list(rng.files)
        out: List[str] = []
        for r in RANGES:
            for f in r.files:
                if f not in out:
                    out.append(f)
        return out

    def siblings(self, version: Optional[str]) -> List[Tuple[str, str]]:
        """The sibling pairs whose both files exist in `version` (all pairs if unknown)."""
        rng = self.range_for(version)
        if rng is None:
            return list(self.sibling_pairs)
        return list(rng.siblings)

    def siblings_for(self, specifier) -> List[Tuple[str, str]]:
        """The sibling pairs present in any known version a PEP 440 specifier
        admits; none when it admits no version we know: whether a host of such a
        release has both files of a pair is read from its own files (steps.plan)."""
        admitted = [v for rng in RANGES for v in rng.verified if specifier.contains(v, prereleases=True)]
        if not admitted:
            return []
        out: List[Tuple[str, str]] = []
        for v in admitted:
            for pair in self.siblings(v):
                if pair not in out:
                    out.append(pair)
        return out

    @staticmethod
    def _norm_path(path: str) -> str:
        p = path.replace("\\", "/")
        for prefix in ("a/", "b/"):
            if p.startswith(prefix + "sglang/") or p.startswith(prefix + "python/sglang/"):
                p = p[len(prefix):]
        if p.startswith("python/sglang/"):
            p = p[len("python/"):]
        return p

    def paths_of_file(self, path: str, version: Optional[str] = None) -> List[str]:
        p = self._norm_path(path)
        return [name for name, f in PATH_FILES.items() if f == p]

    def path_names(self) -> List[str]:
        return list(PATH_FILES)

    def line_ending(self, path: str) -> Optional[str]:
        """LF for the files the profile knows (the wheels' are LF throughout; a few
        other SGLang files, e.g. srt/models/apertus.py, are CRLF); None for the rest."""
        return "\n" if self._norm_path(path) in self.fetch_files(None) else None

    def file_of_path(self, path_name: Optional[str], version: Optional[str] = None) -> Optional[str]:
        """The file of a code path; None when the path does not exist in `version`.
        For an unknown (or no) version the canonical file is returned."""
        if not path_name or path_name not in PATH_FILES:
            return None
        rng = self.range_for(version)
        if rng is None:
            return PATH_FILES[path_name]
        return dict(rng.paths).get(path_name)

    def ancestors(self, path_name: Optional[str], version: Optional[str]) -> List[str]:
        """Worker classes `path_name` inherits from (nearest first): code in their
        files runs on `path_name` too."""
        rng = self.range_for(version)
        if rng is None or not path_name:
            return []
        bases = dict(rng.bases)
        out, cur = [], path_name
        while cur in bases and bases[cur] not in out:
            cur = bases[cur]
            out.append(cur)
        return out

    def failure_signatures(self, version: Optional[str]) -> List[Signature]:
        rng = self.range_for(version)
        return list(_failures_of(rng.name if rng is not None else None))

    def find_failures(self, version: Optional[str], lines: Sequence[str]) -> List[Tuple[int, Signature]]:
        rng = self.range_for(version)
        release = rng.name if rng is not None else None
        hits = []
        for i, line in enumerate(lines):
            s = _first_failure(release, line)
            if s is not None:
                hits.append((i, s))
        return hits

    # ---------------------------------------------------------- routing
    def family(self, rng: VersionRange, algorithm: Optional[str], multi_layer: Optional[bool]) -> Optional[str]:
        algo = _norm_algorithm(algorithm)
        if algo is None:
            return None
        if multi_layer and (rng.multi_layer_any_algorithm or algo in ("EAGLE", "EAGLE3")):
            return "multi_layer_eagle"
        # a release's worker families are named after the algorithm (reviewed facts)
        return "eagle" if algo == "EAGLE3" else algo.lower()

    def resolve(self, version: Optional[str], values: Dict[str, object]) -> Resolution:
        """The worker class for a set of facts (see Facts.values)."""
        rng = self.range_for(version)
        if rng is None:
            return Resolution(None, False, f"sglang {version or '(version unknown)'} is not in fleetpatch's "
                                           f"engine profile (known: {self.known_versions()})")
        if "algorithm" not in values:
            return Resolution(None, False, "the speculative algorithm is not known")
        algo = _norm_algorithm(values["algorithm"])  # type: ignore[arg-type]
        if algo is None:
            return Resolution(None, True, "no speculative decoding")
        needs_ml = rng.multi_layer_any_algorithm or algo in ("EAGLE", "EAGLE3")
        if needs_ml and "multi_layer" not in values:
            return Resolution(None, False, "whether multi-layer EAGLE is on is not known")
        fam = self.family(rng, algo, bool(values.get("multi_layer")))
        workers = rng.worker_map.get(fam or "")
        if not workers:
            return Resolution(None, False, f"speculative algorithm {algo} is not a builtin of sglang {version}")
        v1, v2 = workers
        if v1 and v2:
            if "overlap" not in values:
                return Resolution(None, False, "whether the overlap scheduler is on is not known")
            return Resolution(v2 if values["overlap"] else v1, True)
        return Resolution(v1 or v2, True)

    def log_facts(self, version: Optional[str], lines: Sequence[str], first_line_no: int = 1) -> Facts:
        """Facts stated by the log window: the version's warnings, then the
        ServerArgs dump (the final values: it wins over the warnings)."""
        rng = self.range_for(version)
        release = rng.name if rng is not None else None
        warn = Facts("log")
        dump = Facts("log")
        for i, line in enumerate(lines):
            n = first_line_no + i
            if dump_start(line) >= 0:
                fields = parse_dump(line)
                if fields:
                    ev = Evidence("log", n, _dump_evidence(line, fields))
                    dump = Facts("log")  # the last dump in the window is the current boot
                    if "speculative_algorithm" in fields:
                        dump.values["algorithm"] = fields["speculative_algorithm"]
                        dump.evidence["algorithm"] = ev
                    if "enable_multi_layer_eagle" in fields:
                        dump.values["multi_layer"] = fields["enable_multi_layer_eagle"]
                        dump.evidence["multi_layer"] = ev
                    if "disable_overlap_schedule" in fields:
                        dump.values["overlap"] = not fields["disable_overlap_schedule"]
                        dump.evidence["overlap"] = ev
                continue
            for s in _signatures_in(release, line):
                ev = Evidence("log", n, self.strip_prefix(line))
                warn.notes.append(ev)
                for k, v in s.sets:
                    warn.values[k] = v
                    warn.evidence[k] = ev
        # The dump's values are final; the warnings stay as supporting lines (notes).
        return Facts("log", {**warn.values, **dump.values}, {**warn.evidence, **dump.evidence},
                     [ev for ev in warn.notes if ev not in dump.evidence.values()])

    def server_info_facts(self, version: Optional[str], info: Optional[dict]) -> Optional[Facts]:
        if not isinstance(info, dict):
            return None
        fields = {k: info[k] for k in ("speculative_algorithm", "enable_multi_layer_eagle",
                                       "disable_overlap_schedule") if k in info}
        if not fields:
            return None
        ev = Evidence("server_info", None, "/server_info " + _fields_text(fields))
        f = Facts("server_info")
        if "speculative_algorithm" in fields:
            f.values["algorithm"] = fields["speculative_algorithm"]
            f.evidence["algorithm"] = ev
        if "enable_multi_layer_eagle" in fields:
            f.values["multi_layer"] = bool(fields["enable_multi_layer_eagle"])
            f.evidence["multi_layer"] = ev
        if "disable_overlap_schedule" in fields:
            f.values["overlap"] = not bool(fields["disable_overlap_schedule"])
            f.evidence["overlap"] = ev
        return f

    def launch_facts(self, prediction: Optional[Prediction], launch: Optional[LaunchConfig]) -> Optional[Facts]:
        if prediction is None or not prediction.known_version or not prediction.starts:
            return None
        src = launch.source if launch is not None else "launch"
        ev = Evidence("launch", None, f"{src} launch configuration: {prediction.inputs or '(no speculative flags)'}")
        f = Facts("launch")
        f.values["algorithm"] = prediction.algorithm
        f.values["multi_layer"] = prediction.multi_layer
        f.evidence["algorithm"] = f.evidence["multi_layer"] = ev
        if prediction.overlap is not None:
            f.values["overlap"] = prediction.overlap
            f.evidence["overlap"] = ev
        return f

    def same_fact(self, key: str, a: object, b: object) -> bool:
        # "NEXTN" is an alias ServerArgs turns into "EAGLE"; the case of free text is not kept (0.5.12+)
        if isinstance(a, str) or isinstance(b, str):
            return _norm_algorithm(a) == _norm_algorithm(b)  # type: ignore[arg-type]
        return a == b

    def facts_text(self, values: Mapping[str, object]) -> str:
        """The facts under their ServerArgs names, as the dump and /server_info show them."""
        parts = []
        if "algorithm" in values:
            v = values["algorithm"]
            parts.append(f"speculative_algorithm={v!r}" if isinstance(v, str) else f"speculative_algorithm={v}")
        if "multi_layer" in values:
            parts.append(f"enable_multi_layer_eagle={values['multi_layer']}")
        if "overlap" in values:
            parts.append(f"disable_overlap_schedule={not values['overlap']}")
        return ", ".join(parts)

    # ---------------------------------------------------------- prediction
    def predict(self, version: str, launch: LaunchConfig) -> Prediction:
        """The worker a launch selects on `version`, as ServerArgs and create_worker decide it."""
        # A follow judges the same launch at every batch of lines, and a fleet's hosts
        # mostly share theirs: once per distinct launch (shlex was ~a tenth of the laptop's CPU).
        try:
            return _predicted(self, version, tuple(str(a) for a in launch.argv or ()),
                              tuple(sorted((launch.env or {}).items())))
        except TypeError:   # an environment value that cannot be a key: judged uncached
            return self._predict(version, launch)

    def _predict(self, version: str, launch: LaunchConfig) -> Prediction:
        args = parse_argv(launch.argv or [])
        q = _Launch(self, version, self.range_for(version), args, {**(launch.env or {}), **args.env}.get(ENV_SPEC_V2))
        refused = _before_routing(q)
        if refused is not None:
            return refused
        algo = _norm_algorithm(args.algorithm)
        routed = _route(q, algo)
        if isinstance(routed, Prediction):
            return routed
        overlap, cause = routed
        failed = _pp_failure(q, algo)
        if failed is not None:
            return failed
        res = self.resolve(version, {"algorithm": algo, "multi_layer": args.multi_layer, "overlap": overlap})
        return q.result(res.path if res.determined else None, True, cause + _multi_layer_note(q, algo),
                        algorithm=algo, overlap=overlap)


# ----------------------------------------------------------------- prediction, step by step
@dataclass
class _Launch:
    """One `predict` call: the launch as SGLang reads it, and how to answer it."""

    profile: SGLangProfile
    version: str
    rng: Optional[VersionRange]
    args: LaunchArgs
    raw_env: Optional[str]        # SGLANG_ENABLE_SPEC_V2 as set (None: not set)

    def __post_init__(self) -> None:
        self.inputs = _inputs(self.args, self.raw_env)
        self.notes = [f"--config {self.args.config} is not read: settings in that file are not part of "
                      "this prediction (the log decides)"] if self.args.config else []
        # SGLANG_ENABLE_SPEC_V2 as EnvBool reads it: (value, state, description)
        self.env_val, self.env_state, self.env_desc = env_flag(self.raw_env, self.rng.env_default if self.rng
                                                               else None)

    def result(self, path, starts, cause, error=None, algorithm=None, overlap=None) -> Prediction:
        rng = self.rng
        return Prediction(path=path, file=self.profile.file_of_path(path, self.version) if path else None,
                          starts=starts, cause=cause, error=error, known_version=rng is not None,
                          version=self.version or "", algorithm=algorithm, multi_layer=self.args.multi_layer,
                          overlap=overlap, range=rng.name if rng else None, inputs=self.inputs, notes=self.notes)

    def refuse(self, cause: str, error: str, algorithm=None, overlap=None) -> Prediction:
        """A launch that does not start."""
        return self.result(None, False, cause, error=error, algorithm=algorithm, overlap=overlap)

    @property
    def topk_over_1(self) -> bool:
        return self.args.topk is not None and self.args.topk > 1


def _inputs(args: LaunchArgs, raw_env: Optional[str]) -> str:
    flags = " ".join(args.given) if args.given else "no speculative flags"
    env = f"{ENV_SPEC_V2}={raw_env}" if raw_env is not None else f"{ENV_SPEC_V2} not set"
    return f"{flags}; {env}"


def _before_routing(q: _Launch) -> Optional[Prediction]:
    """The answer when the launch never reaches the worker choice: an unknown
    version, a command line argparse rejects, no or no builtin algorithm."""
    version, rng, raw_algo = q.version, q.rng, q.args.algorithm
    if rng is None:
        return q.result(None, True, f"sglang {version or '(version unknown)'} is not in fleetpatch's engine "
                                    f"profile (known: {q.profile.known_versions()}): the code path cannot be "
                                    "predicted, and is not guessed")
    if q.args.errors:
        return q.refuse(f"the command line is invalid ({q.args.errors[0]}): the server would not start",
                        q.args.errors[0])
    if raw_algo is None:
        return q.result(None, True, "--speculative-algorithm is not set: no speculative decoding worker runs")
    if rng.algorithm_choices is not None and raw_algo not in rng.algorithm_choices:
        return q.refuse(f"--speculative-algorithm {raw_algo} is not one of {', '.join(rng.algorithm_choices)} "
                        f"in sglang {version}: the server would not start",
                        f"argument --speculative-algorithm: invalid choice: {raw_algo!r}")
    algo = _norm_algorithm(raw_algo)
    if algo not in rng.algorithms:
        return q.result(None, True, f"--speculative-algorithm {raw_algo} is not a builtin algorithm of sglang "
                                    f"{version} (a plugin may register it): its worker cannot be predicted",
                        algorithm=algo)
    return None


Routed = Union[Prediction, Tuple[bool, str]]   # a launch that does not start, or (overlap, cause)


def _route(q: _Launch, algo: str) -> Routed:
    """Overlap scheduling on or off, and why: what picks v1 or v2 within a family."""
    if algo == "NGRAM":
        v2_only = q.rng.policy == "v2-only"
        return ((not q.args.disable_overlap) if v2_only else False,
                "--speculative-algorithm NGRAM runs NGRAMWorker"
                + ("" if v2_only else " (the overlap scheduler is disabled for ngram)"))
    if algo in ("DFLASH", "FROZEN_KV_MTP"):
        if q.rng.policy == "v2-only":
            return not q.args.disable_overlap, f"--speculative-algorithm {algo} runs its V2 worker in sglang {q.version}"
        return False, (f"--speculative-algorithm {algo} has no spec v2 in sglang {q.version}: "
                       "the overlap scheduler is disabled")
    return _POLICIES[q.rng.policy](q, algo)


def _v2_opt_in(q: _Launch, algo: str) -> Routed:
    """0.5.7 - 0.5.10: SGLANG_ENABLE_SPEC_V2 opts the EAGLE family into spec v2."""
    if algo in q.rng.v2_algorithms and q.env_val:
        if q.topk_over_1:
            return q.refuse(f"--speculative-eagle-topk {q.args.topk} cannot run on spec v2: the server would not "
                            "start", TOPK_V2_ERROR, algorithm=algo, overlap=True)
        cause = f"{q.env_desc}: spec v2 with overlap scheduling"
        return True, cause + (" (spec v2 overrides --disable-overlap-schedule)" if q.args.disable_overlap else "")
    if algo not in q.rng.v2_algorithms:
        return False, (f"sglang {q.version} has no spec v2 for {algo}: it runs the v1 worker"
                       + (f" even with {q.env_desc}" if q.env_val else f" ({q.env_desc})"))
    if q.topk_over_1:
        return False, f"{q.env_desc} (and --speculative-eagle-topk {q.args.topk} needs the v1 path)"
    return False, f"{q.env_desc}: spec v1, the overlap scheduler is disabled"


def _v2_default(q: _Launch, algo: str) -> Routed:
    """0.5.11 - 0.5.12: spec v2 unless topk > 1, the variable false or --disable-overlap-schedule."""
    if q.topk_over_1 and not q.args.disable_overlap:
        return False, (f"--speculative-eagle-topk {q.args.topk} makes sglang {q.version} fall back to spec v1 "
                       "(spec v2 only supports topk = 1)")
    if not q.env_val and not q.args.disable_overlap:
        return False, f"{q.env_desc} turns spec v2 off: spec v1, the overlap scheduler is disabled"
    if q.args.disable_overlap:
        return False, "--disable-overlap-schedule selects spec v1"
    if q.env_state == "unset":
        return True, f"spec v2 is the default in sglang {q.version} ({ENV_SPEC_V2} is not set): overlap scheduling"
    return True, f"{q.env_desc}: spec v2 with overlap scheduling"


def _v2_only_env(q: _Launch, algo: str) -> Routed:
    """0.5.13: V2 workers only; the variable false selects synchronous scheduling."""
    cause = f"sglang {q.version} has only the spec v2 workers"
    if not q.env_val:
        return False, cause + f"; {q.env_desc} selects non-overlap (synchronous) scheduling"
    if q.args.disable_overlap:
        return False, cause + "; --disable-overlap-schedule selects non-overlap (synchronous) scheduling"
    return True, cause + ", with overlap scheduling"


def _v2_only(q: _Launch, algo: str) -> Routed:
    """0.5.14+: V2 workers only; SGLANG_ENABLE_SPEC_V2 is gone."""
    cause = f"sglang {q.version} has only the spec v2 workers"
    if q.raw_env is not None:
        cause += f" ({ENV_SPEC_V2} is ignored: it was removed in 0.5.14)"
    return not q.args.disable_overlap, cause + (
        "; --disable-overlap-schedule selects non-overlap (synchronous) scheduling" if q.args.disable_overlap
        else ", with overlap scheduling")


_POLICIES = {"v2-opt-in": _v2_opt_in, "v2-default": _v2_default, "v2-only-env": _v2_only_env, "v2-only": _v2_only}


def _multi_layer_note(q: _Launch, algo: str) -> str:
    if q.args.multi_layer and (q.rng.multi_layer_any_algorithm or algo in ("EAGLE", "EAGLE3")):
        return "; --enable-multi-layer-eagle selects the multi-layer worker"
    return ""


def _pp_failure(q: _Launch, algo: str) -> Optional[Prediction]:
    """Pipeline parallelism: ServerArgs.check_server_args asserts; DFLASH refuses earlier (0.5.11+)."""
    if q.args.pp <= 1:
        return None
    if q.rng.pp_error is None:   # 0.5.21+: some combinations start; the release decides at startup
        q.notes.append(f"--pp-size {q.args.pp}: sglang {q.version} decides at startup whether pipeline "
                       "parallelism can run with this speculative decoding (the log decides)")
        return None
    return q.refuse(f"--pp-size {q.args.pp}: pipeline parallelism cannot be combined with speculative decoding: "
                    "the server would not start", DFLASH_PP_ERROR if algo == "DFLASH" else q.rng.pp_error,
                    algorithm=algo)


PROFILE = SGLangProfile()

__all__ = ["PROFILE", "SGLangProfile", "LaunchConfig", "Prediction", "Signature", "VersionRange", "Facts",
           "Resolution", "RANGES", "PATH_FILES", "SIBLING_PAIRS", "parse_argv", "parse_dump", "env_flag",
           "READY_LINE"]


@functools.lru_cache(maxsize=256)
def _predicted(profile: "SGLangProfile", version: Optional[str], argv: tuple, env: tuple) -> Prediction:
    """SGLangProfile.predict's memo; callers only read the Prediction it returns."""
    return profile._predict(version, LaunchConfig(argv=list(argv), env=dict(env)))
