"""The vLLM engine profile: what fleetpatch knows of each vLLM release, read from
the facts generated from its wheel (engines/vllm_releases/<release>.json, see
vllm_wheel.py), and the path a `vllm serve` launch selects.

Which speculative code runs is two choices: the engine (V0 or V1, up to 0.10)
and the model runner (V1 or V2, from 0.12): each runner builds its own drafter
(V1: `v1/spec_decode/*`) or speculator (V2: `v1/worker/gpu/spec_decode/<method>/`),
and they share no code.  Where the choice depends on something the launch
can't show (the model's architecture, on the releases that default to V2 for
a list of architectures), the prediction says so and leaves the verdict to
the probe.  A release the facts do not hold is never guessed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from .base import EngineProfile, Evidence, Facts, LaunchConfig, Prediction, Resolution, Signature
from .vllm_wheel import FACTS_DIR, V2_SPEC, branches_for

READY_LINE = "Application startup complete."   # uvicorn's, once vLLM's API server listens
SMOKE_REQUEST = ("POST", "/v1/completions")
POLICIES = ("v0-v1", "v1-only", "v2-opt-in", "v2-by-architecture", "v2-default", "v2-only")
# vLLM's own prefix: "(EngineCore_DP0 pid=7) INFO 12-06 02:33:52 [core.py:71] " (colour codes before 0.20).
# The process name may hold spaces: "(VllmWorker rank=0 pid=7)" (0.10.0: multiproc_executor.py's
# _add_prefix(sys.stdout, f"VllmWorker rank={rank}", pid)), "(VllmWorker TP0 pid=7)" (0.10.1:
# decorate_logs(f"{process_name} {suffix}")); "(Worker_TP0 pid=7)" from 0.10.2.
LOG_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)*(?:\([^()\n]+? pid=\d+\)(?:\x1b\[[0-9;]*m)* )?"
                        r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ")
# What vLLM logs when it loads compiled code from its torch.compile cache instead of tracing the
# source (then no Python line of the compiled region runs), quoted from the wheels:
COMPILED_CACHE_LINES = (
    # vllm/compilation/backends.py: 0.10.2 :162 ("for dynamic shape") and :166 ("for shape %s");
    # 0.20.2 :291 and 0.33.0 :311, 0.34.0 :315 ("%sDirectly load ... for compile range %s from the cache")
    Signature("compiled-graph-from-cache", "Directly load the compiled graph(s)", "vllm/compilation/backends.py",
              (("0.10.2", 162), ("0.20.2", 291), ("0.33.0", 311), ("0.34.0", 315)),
              means="the compiled graph(s) came from the torch.compile cache: the traced source did not run",
              regex=r"Directly load the compiled graph\(s\) for .* from the cache"),
    # vllm/compilation/decorators.py (AOT compile): 0.20.2 :306, 0.33.0 and 0.34.0 :327
    Signature("aot-compilation-from-cache", "Directly load AOT compilation from path",
              "vllm/compilation/decorators.py", (("0.20.2", 306), ("0.33.0", 327), ("0.34.0", 327)),
              means="the AOT-compiled model came from the cache: the traced source did not run"),
)
# the code torch.compile traces in vLLM: the model's forward and the layers it calls
COMPILED_PREFIXES = ("vllm/model_executor/models/", "vllm/model_executor/layers/")
FAILURES = ("EngineCore failed to start.", "Engine core initialization failed.", "Traceback (most recent call last):")


@dataclass(frozen=True)
class Release:
    """One vLLM release as its facts file states it."""

    name: str
    policy: str
    doc: dict

    @property
    def x(self) -> dict:
        return self.doc["extracted"]

    @property
    def files(self) -> List[str]:
        return list(self.x["files"])

    @property
    def classes(self) -> Dict[str, str]:
        return {**self.x["v0_spec_decode"], **self.x["drafters"], **self.x["speculators"]}

    def runner_of(self, cls: str) -> Optional[str]:
        return "v1" if cls in self.x["drafters"] else "v2" if cls in self.x["speculators"] else (
            "v0" if cls in self.x["v0_spec_decode"] else None)

    def choice_line(self, needle: str) -> Optional[dict]:
        return next((c for c in self.x["choice_lines"] if needle in c["text"]), None)


def load(facts_dir: Path = FACTS_DIR) -> Dict[str, Release]:
    out = {}
    for p in sorted(facts_dir.glob("*.json")):
        doc = json.loads(p.read_text())
        if doc["reviewed"].get("status") == "reviewed" and doc["reviewed"].get("policy") in POLICIES:
            out[doc["release"]] = Release(doc["release"], doc["reviewed"]["policy"], doc)
    return out


def parse_serve(argv: Sequence[str]) -> Tuple[Dict[str, str], List[str], List[str]]:
    """`vllm serve MODEL --flag v ...` (or `-m vllm.entrypoints.openai.api_server --model M`):
    {flag: value} with `--a-b` and `--a_b` the same, the bare flags, and notes on what is not read."""
    values: Dict[str, str] = {}
    bare: List[str] = []
    notes: List[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            name, eq, val = tok[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                values[name] = val
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values[name] = argv[i + 1]
                i += 1
            else:
                bare.append(name)
        i += 1
    if "config" in values:
        notes.append(f"--config {values['config']} is a file on the host: its settings were not read")
    return values, bare, notes


def served_model(argv: Sequence[str]) -> Optional[str]:
    """The model name a request to this server names: the first `--served-model-name`, else the
    model it serves (`vllm serve MODEL`, or `--model M`). None: the argv does not say."""
    values, _bare, _notes = parse_serve(argv)
    names = values.get("served-model-name")
    if names:
        return names.split()[0]
    if values.get("model"):
        return values["model"]
    args = [str(a) for a in argv]
    at = args.index("serve") if "serve" in args else -1
    if 0 <= at < len(args) - 1 and not args[at + 1].startswith("-"):
        return args[at + 1]
    return None


def speculative_method(values: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """The method of --speculative-config (JSON), or (None, error)."""
    raw = values.get("speculative-config")
    if raw is None:
        return None, None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        return None, f"--speculative-config is not JSON ({e.msg} at column {e.colno})"
    if not isinstance(doc, dict):
        return None, "--speculative-config is not a JSON object"
    method = doc.get("method")
    if method is None and doc.get("model"):
        return None, "--speculative-config names a draft model but no method: vLLM infers it from the model"
    return (str(method) if method is not None else None), None


def env_bool_int(raw: Optional[str]) -> Tuple[Optional[bool], Optional[str]]:
    """vLLM's `bool(int(os.getenv(...)))`: (value, error)."""
    if raw is None:
        return None, None
    try:
        return bool(int(raw)), None
    except ValueError:
        return None, f"invalid literal for int() with base 10: {raw!r}"


def env_maybe_bool(raw: Optional[str]) -> Tuple[Optional[bool], Optional[str]]:
    """vLLM's `maybe_convert_bool`: unset or empty is None, else bool(int(x))."""
    return (None, None) if raw in (None, "") else env_bool_int(raw)


class VllmProfile(EngineProfile):
    kind = "vllm"
    package = "vllm"
    ready_line = READY_LINE
    log_prefix = LOG_PREFIX
    launch_env_prefixes = ("VLLM_",)
    # `args.api_key or [envs.VLLM_API_KEY]` (entrypoints/openai/api_server.py, 0.10-0.28;
    # entrypoints/serve/middleware/register.py, 0.29+): the flag first
    api_key_env = "VLLM_API_KEY"
    fact_keys = ("engine", "runner")
    path_noun = "speculative drafter or speculator"
    path_noun_short = "drafter"
    version_file = "vllm/_version.py"
    server_info_path = None      # vLLM has no /server_info: the log and the launch say what runs
    smoke_path = SMOKE_REQUEST[1]
    smoke_answer = "choices"
    compiled_cache_lines = COMPILED_CACHE_LINES
    compiled_prefixes = COMPILED_PREFIXES
    compiled_cache_advice = ("to see its lines run, restart with --enforce-eager (no torch.compile), or clear the "
                             "compile cache (the torch_compile_cache folder under $VLLM_CACHE_ROOT, default "
                             "~/.cache/vllm) and restart: the next start traces the patched source")

    def __init__(self, facts_dir: Path = FACTS_DIR) -> None:
        self.releases = load(facts_dir)

    # ------------------------------------------------------------ releases
    def release_of(self, version: Optional[str]) -> Optional[str]:
        try:
            v = Version(str(version).strip())
        except (InvalidVersion, TypeError):
            return None
        if v.is_prerelease or v.is_devrelease:
            return None
        return v.public if v.public in self.releases else None

    def release(self, version: Optional[str]) -> Optional[Release]:
        name = self.release_of(version)
        return self.releases.get(name) if name else None

    def knows(self, version: Optional[str]) -> bool:
        return self.release(version) is not None

    def known_versions(self) -> str:
        names = sorted(self.releases, key=Version)
        return f"{names[0]} - {names[-1]}" if names else "none"

    def fetch_files(self, version: Optional[str]) -> List[str]:
        """Files `fetch` copies: a known release's (all exist in it); for None or a release the
        profile does not know, the union over every release (a host may lack some)."""
        rel = self.release(version)
        if rel is not None:
            return rel.files
        out: Dict[str, None] = {}
        for name in sorted(self.releases, key=Version):
            out.update(dict.fromkeys(self.releases[name].files))
        return list(out)

    def process_model(self, version: Optional[str]) -> Dict[str, object]:
        """The processes a server of `version` runs, and the defaults (from its envs.py) that shape them:
        the API server, EngineCore (in the API server's process with VLLM_ENABLE_V1_MULTIPROCESSING=0)
        and one worker per rank, forked unless VLLM_WORKER_MULTIPROC_METHOD says spawn."""
        rel = self.release(version)
        if rel is None:
            return {}
        env = rel.x["env"]
        return {"processes": ["API server", "EngineCore", "Worker_TP<rank>"],
                "VLLM_WORKER_MULTIPROC_METHOD": _default(env.get("VLLM_WORKER_MULTIPROC_METHOD")),
                "VLLM_ENABLE_V1_MULTIPROCESSING": _default(env.get("VLLM_ENABLE_V1_MULTIPROCESSING"))}

    # ------------------------------------------------------------ a running server
    def smoke_body(self, prompt: str, max_new_tokens: int, model: Optional[str] = None) -> dict:
        """OpenAI's completions request; without `model` the agent asks GET /v1/models first."""
        body = {"prompt": prompt, "max_tokens": int(max_new_tokens), "temperature": 0}
        if model:
            body["model"] = model
        return body

    def served_model(self, launch: Optional[LaunchConfig]) -> Optional[str]:
        """`--served-model-name N ...` (the first name), else `vllm serve MODEL` or `--model M`."""
        return served_model(launch.argv) if launch is not None else None

    def in_compiled_region(self, path: str) -> bool:
        """The model's code (model_executor) and the drafters' and speculators' files: vLLM compiles
        the draft model with torch.compile and captures the propose steps in CUDA graphs."""
        return super().in_compiled_region(path) or bool(self.paths_of_file(path))

    def process_role(self, name: Optional[str]) -> Optional[str]:
        """API server, EngineCore or Worker, from the multiprocessing name: vLLM names EngineCore's
        process `EngineCore_DP<r>` (or `EngineCore`) and its workers `VllmWorker-<r>` / `Worker_TP<r>`;
        with VLLM_ENABLE_V1_MULTIPROCESSING=0 EngineCore runs in the API server's MainProcess."""
        if not name:
            return None
        if name == "MainProcess":
            return "API server"
        if name.startswith("EngineCore"):
            return "EngineCore"
        return "Worker" if "Worker" in name else None

    # ------------------------------------------------------------ files and paths
    def siblings(self, version: Optional[str]) -> List[Tuple[str, str]]:
        """The sibling rule's pairs: the model runners side by side (V0/V1, V1/V2), and a method's own
        V1 drafter file (`v1/spec_decode/<method>*.py`) with its own V2 speculator
        (`.../spec_decode/<method>/speculator.py`) where the facts have both for it."""
        rel = self.release(version)
        if rel is None:
            return []
        out = {(a, b) for a, b in rel.x["runner_pairs"]}
        for s in rel.x["siblings"]:
            own = f"{V2_SPEC}{s['method']}/speculator.py"
            for a in s["v1"]:
                if own in s["v2"] and a.rsplit("/", 1)[1].startswith(s["method"]):
                    out.add((a, own))
        return sorted(out)

    def siblings_for(self, specifier) -> List[Tuple[str, str]]:
        out: List[Tuple[str, str]] = []
        for name in sorted(self.releases, key=Version):
            if specifier is None or specifier.contains(Version(name), prereleases=True):
                out += [p for p in self.siblings(name) if p not in out]
        return out

    def _all_classes(self) -> Dict[str, str]:
        out: Dict[str, str] = {}
        for name in sorted(self.releases, key=Version):
            for cls, f in self.releases[name].classes.items():
                out.setdefault(cls, f)
        return out

    def paths_of_file(self, path: str, version: Optional[str] = None) -> List[str]:
        """The drafter and speculator classes `path` defines: in `version` where the facts know it
        (SpecDecodeBaseProposer moved out of eagle.py), else in any release."""
        path = path.replace("\\", "/").lstrip("./")
        rel = self.release(version) if version else None
        releases = [rel] if rel is not None else list(self.releases.values())
        return sorted({cls for r in releases for cls, f in r.classes.items() if f == path})

    def path_names(self) -> List[str]:
        return sorted(self._all_classes())

    def ancestors(self, path_name: Optional[str], version: Optional[str]) -> List[str]:
        """The drafter's or speculator's base classes, nearest first, as the release's wheel defines
        them (EagleProposer -> SpecDecodeBaseProposer): a change to a base runs in the class."""
        rel = self.release(version)
        bases = (rel.x.get("bases") or {}) if rel is not None else {}
        out: List[str] = []
        todo = list(bases.get(path_name or "", []))
        while todo:
            name = todo.pop(0)
            if name not in out and name != path_name:
                out.append(name)
                todo += bases.get(name, [])
        return out

    def file_of_path(self, path_name: Optional[str], version: Optional[str] = None) -> Optional[str]:
        if not path_name:
            return None
        rel = self.release(version)
        return (rel.classes if rel else self._all_classes()).get(path_name)

    # ------------------------------------------------------------ the log
    def failure_signatures(self, version: Optional[str]) -> List[Signature]:
        return [Signature(f"FAIL{i}", t, "<vllm>", (), means="the server failed to start") for i, t in enumerate(FAILURES)]

    def find_failures(self, version: Optional[str], lines: Sequence[str]) -> List[Tuple[int, Signature]]:
        sigs = self.failure_signatures(version)
        return [(i, s) for i, line in enumerate(lines) for s in sigs if s.matches(self.strip_prefix(line))]

    def log_facts(self, version: Optional[str], lines: Sequence[str], first_line_no: int = 1) -> Facts:
        """What the log says of the engine and the runner: each line quoted from the wheel."""
        facts = Facts("log")
        for i, raw in enumerate(lines):
            text = self.strip_prefix(raw)
            found = _log_fact(text)
            if found:
                key, value = found
                ev = Evidence("log", first_line_no + i, text)
                facts.values[key] = value
                facts.evidence[key] = ev
                facts.notes.append(ev)
        return facts

    def launch_facts(self, prediction: Optional[Prediction], launch: Optional[LaunchConfig]) -> Optional[Facts]:
        """The method (--speculative-config) and the engine and runner the launch selects, where it
        shows them; the log's lines ("Using V2 Model Runner", a V1 fallback, "Falling back to V0")
        come later and win."""
        if prediction is None or not prediction.known_version or not prediction.starts or launch is None:
            return None
        rel = self.release(prediction.version)
        method, err = speculative_method(parse_serve(launch.argv)[0])
        if rel is None or err:
            return None
        ev = Evidence("launch", None, f"{launch.source} launch configuration: {prediction.inputs}")
        facts = Facts("launch")
        runner, _why, error = choose_runner(rel, launch.env, method)
        found = {"method": method} if method else {}
        if runner == "v0":
            found["engine"] = "v0"
        elif runner in ("v1", "v2") and not error:
            found["runner"] = runner
        for key, value in found.items():
            facts.values[key], facts.evidence[key] = value, ev
        return facts

    def resolve(self, version: Optional[str], values: Dict[str, object]) -> Resolution:
        rel = self.release(version)
        if rel is None:
            return Resolution(None, False, f"vllm {version} is not a release the profile knows")
        method = values.get("method")
        if values.get("engine") == "v0":
            return Resolution(None, True, "the V0 engine runs: no V1 drafter or V2 speculator")
        runner = values.get("runner")
        if not method or runner not in ("v1", "v2"):
            return Resolution(None, False, "the log does not say which model runner runs")
        return _pick(rel, str(method), str(runner))

    # ------------------------------------------------------------ prediction
    def predict(self, version: str, launch: LaunchConfig) -> Prediction:
        rel = self.release(version)
        values, bare, notes = parse_serve(launch.argv)
        inputs = _inputs(values, bare, launch.env)
        if rel is None:
            return Prediction(None, None, True, f"vllm {version} is not a release the profile knows "
                              f"({self.known_versions()}): nothing is predicted", None, False, version,
                              inputs=inputs, notes=notes)
        method, err = speculative_method(values)
        if err:
            return Prediction(None, None, False, err, err, True, version, inputs=inputs, notes=notes)
        if "enforce-eager" in bare:
            notes.append("--enforce-eager: no CUDA graphs and no torch.compile, every step runs Python")
        runner, why, error = choose_runner(rel, launch.env, method)
        if error:
            return Prediction(None, None, False, why, error, True, version, inputs=inputs, notes=notes)
        if method is None:
            return Prediction(None, None, True, f"no --speculative-config: no drafter runs ({why})", None, True,
                              version, inputs=inputs, notes=notes)
        if runner is None:
            return Prediction(None, None, True, why, None, True, version, algorithm=method, inputs=inputs, notes=notes)
        if runner == "v0":
            return Prediction(None, None, True, f"{why}: no V1 drafter runs (this release ships no V0 "
                              "speculative decoding)" if not rel.x["v0_spec_decode"] else why, None, True, version,
                              algorithm=method, inputs=inputs, notes=notes)
        picked = _pick(rel, method, runner)
        cause = f"{why}; {picked.reason}"
        return Prediction(picked.path, rel.classes.get(picked.path or ""), True, cause, None, True, version,
                          algorithm=method, inputs=inputs, notes=notes)


def choose_runner(rel: Release, env: Mapping[str, str], method: Optional[str]) -> Tuple[Optional[str], str, Optional[str]]:
    """(runner or None when the launch can't show it, why, the start-up error if it can't start)."""
    x, policy = rel.x, rel.policy
    if policy == "v0-v1":
        v1, err = env_bool_int(env.get("VLLM_USE_V1"))
        if err:
            return None, f"VLLM_USE_V1: {err}", err
        if v1 is False:
            return "v0", "VLLM_USE_V1=0 selects the V0 engine", None
        return "v1", "the V1 engine (VLLM_USE_V1 " + ("=1)" if v1 else "unset: V1 unless a feature falls back to V0)"), None
    if policy == "v1-only":
        return "v1", "the V1 model runner (the only one in this release)", None
    raw = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if policy == "v2-only":
        if raw is not None and raw != "1":
            line = rel.choice_line("Model Runner V1 has been remo")
            err = (line["text"].replace("\x00", raw) if line else "Model Runner V1 has been removed")
            return None, f"VLLM_USE_V2_MODEL_RUNNER={raw}: the server refuses to start", err
        return "v2", "the V2 model runner (the only one in this release)", None
    use_v2, err = (env_bool_int if policy == "v2-opt-in" else env_maybe_bool)(raw)
    if err:
        return None, f"VLLM_USE_V2_MODEL_RUNNER: {err}", err
    if use_v2 is not None:
        return ("v2" if use_v2 else "v1"), f"VLLM_USE_V2_MODEL_RUNNER={raw} selects the {'V2' if use_v2 else 'V1'} model runner", None
    if policy == "v2-opt-in":
        return "v1", "the V1 model runner (VLLM_USE_V2_MODEL_RUNNER unset; V2 is opt-in)", None
    where = x.get("v2_decided_in") or {}
    if policy == "v2-by-architecture":
        return None, (f"VLLM_USE_V2_MODEL_RUNNER unset: the runner depends on the model's architecture "
                      f"({where.get('source')}:{where.get('line')}), which the launch configuration can't show; "
                      "the probe decides"), None
    return "v2", ("the V2 model runner by default (VLLM_USE_V2_MODEL_RUNNER unset); a feature it does not support "
                  "falls back to V1 with a warning, which the log shows"), None


def _pick(rel: Release, method: str, runner: str) -> Resolution:
    branches = rel.x["drafter_branches"] if runner == "v1" else rel.x["speculator_branches"]
    found = sorted({b["class"] for b in branches_for(branches, method, rel.x.get("method_tests", {}))})
    label = {"v1": "V1 model runner", "v2": "V2 model runner"}[runner]
    if len(found) == 1:
        return Resolution(found[0], True, f"the {label} builds {found[0]} for method {method!r}")
    if not found:
        return Resolution(None, True, f"the {label} of vllm {rel.name} builds no drafter for method {method!r}")
    return Resolution(None, False, f"the {label} builds one of {', '.join(found)} for method {method!r}, "
                                   "by the draft model's architecture; the probe decides")


_LOG_FACTS = (
    ("Using V2 Model Runner", ("runner", "v2")),
    ("using the V1 model runner instead", ("runner", "v1")),
    ("Initializing a V0 LLM engine", ("engine", "v0")),
    ("Falling back to V0", ("engine", "v0")),
    ("Initializing a V1 LLM engine", ("engine", "v1")),
)


def _log_fact(text: str) -> Optional[Tuple[str, str]]:
    return next((kv for needle, kv in _LOG_FACTS if needle in text), None)


def _default(var: Optional[dict]) -> Optional[str]:
    """The default in envs.py's reader: os.getenv('X', 'fork') or env_with_choices('X', 'fork', ...)."""
    m = re.search(r"\('VLLM_\w+', '([^']*)'", (var or {}).get("reads", ""))
    return m.group(1) if m else None


def _inputs(values: Mapping[str, str], bare: Sequence[str], env: Mapping[str, str]) -> str:
    parts = [f"--speculative-config {values['speculative-config']}"] if "speculative-config" in values else []
    parts += ["--enforce-eager"] if "enforce-eager" in bare else []
    parts += [f"{k}={env[k]}" for k in ("VLLM_USE_V1", "VLLM_USE_V2_MODEL_RUNNER") if k in env]
    return ", ".join(parts) or "no speculative or runner settings"


PROFILE = VllmProfile()
