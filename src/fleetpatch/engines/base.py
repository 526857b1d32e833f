"""The interface every engine profile implements, and the records it trades in.

An engine profile is everything fleetpatch knows about one serving engine
(SGLang today): which files and code paths it has per version, how a launch
picks a code path, and how its log says which path runs.  The rest of
fleetpatch (evidence, steps, patchset, the host agent's requests) knows only
this interface, so a second engine is one new module in this package that sets
`PROFILE = <its EngineProfile>` (see `engines.get`).

The records here are plain data shared by both sides of that boundary:
`LaunchConfig` (how a server was started), `Prediction` (what a launch selects),
`Facts` (what one source says about the settings that pick the path),
`Resolution` (the path those settings select), `Evidence` (a line that says so)
and `Signature` (a line the engine prints that fleetpatch recognises).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass
class LaunchConfig:
    """How the server was (or will be) started."""

    argv: List[str]            # the server's argv (from /proc/<pid>/cmdline, or shlex.split of start)
    env: Dict[str, str]        # its environment (from /proc/<pid>/environ, or restart.env)
    source: str = "inventory"  # "process" | "inventory"


@dataclass
class Prediction:
    """Which code path a launch configuration selects on one engine version.

    The six first fields are the documented interface (docs/internals.md);
    the rest are extras with defaults.
    """

    path: Optional[str]          # "EAGLEWorker", "EAGLEWorkerV2", ... or None (no patchable path / unknown)
    file: Optional[str]          # "sglang/srt/speculative/eagle_worker.py"
    starts: bool                 # False when the launch fails at startup (e.g. spec v2 + topk > 1)
    cause: str                   # human reason for the path (or for not starting)
    error: Optional[str]         # the startup error text when starts is False
    known_version: bool          # False: the profile does not know this engine version; nothing is guessed
    version: str = ""            # the engine version predicted for
    algorithm: Optional[str] = None   # SGLang: speculative algorithm as ServerArgs ends up with it
    multi_layer: bool = False         # SGLang: --enable-multi-layer-eagle
    overlap: Optional[bool] = None    # SGLang: overlap scheduling on (None: unknown / not applicable)
    range: Optional[str] = None       # the profile's version range, e.g. "0.5.8-0.5.10"
    inputs: str = ""                  # the launch settings the prediction used, for messages
    notes: List[str] = field(default_factory=list)  # caveats (e.g. --config file not read)


@dataclass
class Evidence:
    """One line or record that says something about which path runs."""

    source: str                    # "log" | "server_info" | "launch"
    line_no: Optional[int]
    text: str


@dataclass
class Facts:
    """What one source says about the settings that pick the code path.

    The keys of `values` are the profile's `fact_keys`; a key is present only
    when the source states it.
    """

    source: str                                          # "log" | "server_info" | "launch"
    values: Dict[str, object] = field(default_factory=dict)
    evidence: Dict[str, Evidence] = field(default_factory=dict)   # key -> the line/record that said it
    notes: List[Evidence] = field(default_factory=list)          # every routing line seen (supporting)

    def all_evidence(self) -> List[Evidence]:
        seen, out = set(), []
        for ev in list(self.evidence.values()) + list(self.notes):
            k = (ev.source, ev.line_no, ev.text)
            if k not in seen:
                seen.add(k)
                out.append(ev)
        return sorted(out, key=lambda e: (e.line_no is None, e.line_no or 0))


@dataclass
class Resolution:
    path: Optional[str]      # the code path, or None (determined: none of the patchable paths runs)
    determined: bool         # False: the facts do not say which path runs (see reason)
    reason: str = ""


@dataclass(frozen=True)
class Signature:
    """One line the engine prints, as fleetpatch recognises it in a log.

    `text` is the fixed part as it appears in the log (matched as a substring,
    or by `regex` when set).  `probe` is the part that is a literal in `source`
    (defaults to `text`); `lines` records where that literal starts, per
    verified version.
    """

    key: str
    text: str
    source: str
    lines: Tuple[Tuple[str, int], ...]
    sets: Tuple[Tuple[str, object], ...] = ()   # facts the line establishes
    means: str = ""
    regex: Optional[str] = None
    probe: Optional[str] = None

    def matches(self, line: str) -> bool:
        if self.regex is not None:
            return re.search(self.regex, line) is not None
        return self.text in line

    @property
    def literal(self) -> str:
        return self.probe if self.probe is not None else self.text

    def line_in(self, version: str) -> Optional[int]:
        return dict(self.lines).get(version)


# A Python exception line ("ValueError: ...", "torch.OutOfMemoryError: ..."): the
# error a failure message quotes after the engine's own failure line.
PYTHON_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::|$)")


class EngineProfile:
    """The interface of an engine profile: a subclass sets the attributes below
    and implements the methods that raise NotImplementedError; the others have
    engine-neutral defaults it may keep."""

    kind: str = ""                      # the inventory's engine.kind, e.g. "sglang"
    package: str = ""                   # the import package whose files patches change
    ready_line: str = ""                # the log line that says the server accepts requests
    # what a rank above 0 of a multi-node server logs once its schedulers are up ('' : the engine has none)
    node_ready_line: str = ""
    log_prefix: Optional[re.Pattern] = None   # what the engine puts before each message
    launch_env_prefixes: Tuple[str, ...] = ()   # environment variables read from /proc (the rest may be secret)
    # the variable that gives a server its API key where no --api-key does ('' : only the flag): the agent
    # reads it from the server's /proc/PID/environ to send the key on its own requests to that server
    api_key_env: str = ""
    fact_keys: Tuple[str, ...] = ()     # the settings that pick the path, in the order messages name them
    path_noun: str = "code path"        # what a code path is, for "the server runs no <path_noun>"
    path_noun_short: str = ""           # the same, shorter ("no <path_noun_short> runs"); path_noun if empty
    whole_evidence: Tuple[str, ...] = ()  # log evidence starting so is a summary fleetpatch wrote: never cut
    exception_line: re.Pattern = PYTHON_EXCEPTION_LINE
    sibling_pairs: Sequence[Tuple[str, str]] = ()   # files that serve one role on two paths
    # the file inside the package directory that states the version (`__version__ = "X"`): the agent
    # reads it when the install has no dist-info that says (a source tree on sys.path)
    version_file: str = ""
    # the GET endpoint whose JSON states the running settings (SGLang's /server_info); None: the
    # engine has none, and the facts come from the log and the launch (argv and env from /proc)
    server_info_path: Optional[str] = "/server_info"
    # the smoke request: POST `smoke_path`, its answer's text read as `smoke_answer` says
    # ("text": a JSON object's string `text`; "choices": OpenAI's choices[0].text)
    smoke_path: str = "/generate"
    smoke_answer: str = "text"
    # log lines that say the engine loaded compiled code from its cache (no Python line of the
    # compiled region runs then): kept for the verdict, which names them (Signature.text substrings)
    compiled_cache_lines: Tuple["Signature", ...] = ()
    # files (prefixes, inside the package dir) whose code runs compiled (torch.compile): an added line
    # there may never run as Python after a start that loaded the compiled graph from the cache
    compiled_prefixes: Tuple[str, ...] = ()
    compiled_cache_advice: str = ""   # what to do to see such lines run (a verdict's last line)

    # ---------------------------------------------------------- the log
    def strip_prefix(self, line: str) -> str:
        """A log line without the engine's own prefix (time, ranks)."""
        line = line.rstrip("\r\n")
        return self.log_prefix.sub("", line, count=1) if self.log_prefix is not None else line

    def same_fact(self, key: str, a: object, b: object) -> bool:
        """Whether two sources state the same value for fact `key`."""
        return a == b

    def facts_text(self, values: Mapping[str, object]) -> str:
        """Facts as a user reads them in a cause line ("name=value, ...")."""
        return ", ".join(f"{k}={values[k]!r}" for k in self.fact_keys if k in values)

    def short_noun(self) -> str:
        return self.path_noun_short or self.path_noun

    # ---------------------------------------------------------- a running server
    def smoke_body(self, prompt: str, max_new_tokens: int, model: Optional[str] = None) -> dict:
        """The JSON body of one smoke request (POST `smoke_path`); `model`: the served model's
        name where the engine's API needs one (None: the agent asks the server)."""
        return {"text": prompt, "sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": 0}}

    def smoke_request(self, prompt: str, max_new_tokens: int, launch: Optional[LaunchConfig] = None) -> dict:
        """The fields of a smoke request as the host's agent sends it: `path`, `body`, `answer` (how its
        text is read) and, where the body must name the served model and the launch does not say
        which, `model_from` (the GET that lists it)."""
        model = self.served_model(launch)
        out = {"path": self.smoke_path, "body": self.smoke_body(prompt, max_new_tokens, model),
               "answer": self.smoke_answer}
        if self.smoke_answer == "choices" and not model:
            out["model_from"] = "/v1/models"
        return out

    def smoke_text(self, doc: object) -> Optional[str]:
        """The generated text of a smoke answer's JSON (None: the answer holds none), as `smoke_answer` reads it."""
        return answer_text(doc, self.smoke_answer)

    def served_model(self, launch: Optional[LaunchConfig]) -> Optional[str]:
        """The model name requests must name, from how the server was launched (None: not needed, or unknown)."""
        return None

    def compiled_from_cache(self, lines: Sequence[str], line_nos: Optional[Sequence[int]] = None
                            ) -> List["Evidence"]:
        """The log lines (since the restart) that say compiled code came from the cache."""
        out = []
        for i, raw in enumerate(lines):
            text = self.strip_prefix(raw)
            if any(sig.matches(text) for sig in self.compiled_cache_lines):
                out.append(Evidence("log", line_nos[i] if line_nos else i + 1, text))
        return out

    def in_compiled_region(self, path: str) -> bool:
        return any(path.startswith(p) for p in self.compiled_prefixes)

    def process_role(self, name: Optional[str]) -> Optional[str]:
        """What a process of the server is, from its multiprocessing name as the probe recorded it
        (None: the engine does not say)."""
        return None

    # ---------------------------------------------------------- what a subclass implements
    def knows(self, version: str) -> bool:
        raise NotImplementedError

    def fetch_files(self, version: Optional[str]) -> List[str]:
        raise NotImplementedError

    def siblings_for(self, specifier) -> List[Tuple[str, str]]:
        return list(self.sibling_pairs)

    def paths_of_file(self, path: str, version: Optional[str] = None) -> List[str]:
        """The code path names `path` defines, in `version` where the profile tells versions apart."""
        raise NotImplementedError

    def path_names(self) -> List[str]:
        """Every code path name the profile knows, in any version (the keys a patch's
        markers may use); empty when the profile does not say, and then no marker
        name is refused."""
        return []

    def line_ending(self, path: str) -> Optional[str]:
        """The line ending every line of `path` has in every version the profile knows
        ("\\n"), or None when the profile does not know the file: a diff whose
        lines end otherwise could never match it."""
        return None

    def file_of_path(self, path_name: Optional[str], version: Optional[str] = None) -> Optional[str]:
        raise NotImplementedError

    def ancestors(self, path_name: Optional[str], version: Optional[str]) -> List[str]:
        return []

    def predict(self, version: str, launch: LaunchConfig) -> Prediction:
        raise NotImplementedError

    def find_failures(self, version: Optional[str], lines: Sequence[str]) -> List[Tuple[int, Signature]]:
        raise NotImplementedError

    def log_facts(self, version: Optional[str], lines: Sequence[str], first_line_no: int = 1) -> Facts:
        raise NotImplementedError

    def server_info_facts(self, version: Optional[str], info: Optional[dict]) -> Optional[Facts]:
        return None

    def launch_facts(self, prediction: Optional[Prediction], launch: Optional[LaunchConfig]) -> Optional[Facts]:
        return None

    def resolve(self, version: Optional[str], values: Dict[str, object]) -> Resolution:
        raise NotImplementedError


def answer_text(doc: object, how: str) -> Optional[str]:
    """A smoke answer's text: `how` "text" reads a JSON object's string `text`, "choices" OpenAI's
    choices[0].text (vLLM's /v1/completions). None: not there, or not a string."""
    if not isinstance(doc, dict):
        return None
    if how == "choices":
        choices = doc.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        text = first.get("text") if isinstance(first, dict) else None
    else:
        text = doc.get("text")
    return text if isinstance(text, str) else None


class NodeRankView:
    """A rank above 0 of a multi-node server, as verification reads the profile: it serves no
    HTTP, so its log never has the ready line; its own "up" line (`node_ready_line`) stands in
    for it. Everything else is the profile's."""

    def __init__(self, profile: EngineProfile, rank: int):
        self._profile, self.node_rank = profile, rank

    @property
    def ready_line(self) -> str:
        return self._profile.node_ready_line or self._profile.ready_line

    def __getattr__(self, name: str):
        return getattr(self._profile, name)


def for_node_rank(profile: EngineProfile, rank: Optional[int]):
    """The profile as a rank of a multi-node server reads it (rank 0 and a one-host server: itself)."""
    return NodeRankView(profile, rank) if rank else profile
