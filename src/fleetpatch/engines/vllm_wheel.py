"""Read one vLLM release's facts out of its PyPI wheel, without importing it.

The maintainer command `invoke engine-facts --engine vllm --version X`
(tasks.py) fetches only the members it needs (vllm_members.py: the zip's
central directory and a few MB of Python files, by HTTP range) and reads them
with `ast`: nothing of vLLM runs.  It writes `engines/vllm_releases/X.json`:

* ``extracted``: everything read from the wheel: the files fleetpatch fetches,
  the model runners (V0, V1, V2), the V1 drafters and the V2 speculators with
  the branches that build them, the sibling sets per speculative method, the
  environment variables that choose the engine and the runner, every line
  that shows the choice (file, line, level, text), the ready line, the
  speculative methods;
* ``reviewed``: what needs a maintainer's judgement (how the runner is
  chosen); kept across regenerations, a new release starts from the previous
  release's, pending review.

Sorted-key JSON: regenerating a release from the same members is byte for
byte what is shipped (tests/fast/test_vllm_facts.py, tests/e2e/test_vllm_release_facts.py).
"""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import sglang_wheel, vllm_members

FACTS_DIR = Path(__file__).resolve().parent / "vllm_releases"
ENVS = "vllm/envs.py"
VERSION_FILE = "vllm/_version.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
CONFIGS = ("vllm/config/vllm.py", "vllm/config/__init__.py", "vllm/config.py")
SPEC_CONFIG = ("vllm/config/speculative.py", "vllm/config/__init__.py", "vllm/config.py")
GPU_WORKER = "vllm/v1/worker/gpu_worker.py"
RUNNERS = {"v0": "vllm/worker/model_runner.py", "v1": "vllm/v1/worker/gpu_model_runner.py",
           "v2": "vllm/v1/worker/gpu/model_runner.py"}
ENGINES = {"v0": "vllm/engine/llm_engine.py", "v1": "vllm/v1/engine/core.py"}
V0_SPEC = "vllm/spec_decode/"
V1_SPEC = "vllm/v1/spec_decode/"
V2_SPEC = "vllm/v1/worker/gpu/spec_decode/"
V2_DISPATCH = V2_SPEC + "__init__.py"
PLATFORM = "vllm/platforms/interface.py"
ENV_KEYS = ("VLLM_USE_V1", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_ENABLE_V1_MULTIPROCESSING",
            "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_DISABLE_LOG_LOGO")
# the words of a line that shows which engine or runner was chosen
CHOICE_WORDS = ("V2 Model Runner", "Model Runner V2", "V1 model runner", "Model Runner V1", "Falling back to V0",
                "LLM engine (v", "VLLM_USE_V2_MODEL_RUNNER")
BANNERS = ("vLLM API server version", "vLLM server version")
UVICORN_READY = "Application startup complete."
_SELECTION_FILES = (ENVS, ARG_UTILS, *CONFIGS, GPU_WORKER, ENGINES["v0"], ENGINES["v1"], PLATFORM,
                    "vllm/platforms/cuda.py")
_MEMBER = re.compile(
    r"vllm/(__init__|envs|_version|logger|version)\.py$|vllm/engine/(arg_utils|llm_engine|async_llm_engine)\.py$"
    r"|vllm/config/|vllm/config\.py$|vllm/v1/worker/|vllm/v1/spec_decode/|vllm/spec_decode/"
    r"|vllm/entrypoints/((openai|cli|serve|common|serve/utils)/)?[^/]*\.py$|vllm/platforms/(cuda|interface)\.py$|vllm/v1/engine/(core|llm_engine|async_llm)\.py$"
    r"|vllm/worker/")


_METADATA = re.compile(r"vllm-[^/]+\.dist-info/METADATA$")


def wanted(name: str) -> bool:
    """The wheel members the facts are read from (a few MB of a 240-440 MB wheel), and the
    dist-info's METADATA (what a host's install says its version is)."""
    return (name.endswith(".py") and bool(_MEMBER.match(name))) or bool(_METADATA.match(name))


class Source:
    """The fetched members of one wheel, parsed on demand."""

    def __init__(self, members: vllm_members.Members):
        self.members = members
        self.names = members.names
        self._trees: Dict[str, ast.Module] = {}

    def has(self, path: str) -> bool:
        return path in self.names and self.members.has(path)

    def text(self, path: str) -> str:
        return self.members.text(path)

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self.text(path))
        return self._trees[path]

    def first(self, paths) -> Optional[str]:
        return next((p for p in paths if self.has(p)), None)

    def under(self, prefix: str) -> List[str]:
        return sorted(p for p in self.names if p.startswith(prefix) and p.endswith(".py") and self.has(p))


render = sglang_wheel.render


# ----------------------------------------------------------------- classes and who builds them
def classes_in(src: Source, files: List[str], suffixes: Tuple[str, ...]) -> Dict[str, str]:
    """{class: its file} for the top-level classes of `files` named with one of `suffixes`."""
    out: Dict[str, str] = {}
    for path in files:
        for node in src.tree(path).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith(suffixes) and not node.name.startswith("_"):
                out.setdefault(node.name, path)
    return out


def class_bases(src: Source, known: Dict[str, str]) -> Dict[str, List[str]]:
    """{class: [its direct bases that are known classes too]} (EagleProposer(SpecDecodeBaseProposer)):
    a fix to a base runs in every class built on it."""
    out: Dict[str, List[str]] = {}
    for name, path in sorted(known.items()):
        node = next((n for n in src.tree(path).body if isinstance(n, ast.ClassDef) and n.name == name), None)
        bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in (node.bases if node is not None else [])]
        found = [b for b in bases if b in known and b != name]
        if found:
            out[name] = found
    return out


def _built(st: ast.stmt, known: Dict[str, str]) -> Optional[str]:
    """The class a statement builds: `return X(...)` or `self.drafter = X(...)`."""
    value = st.value if isinstance(st, (ast.Return, ast.Assign)) else None
    if isinstance(st, ast.Assign) and not any(ast.unparse(t) == "self.drafter" for t in st.targets):
        return None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in known:
        return value.func.id
    return None


def _branches(body: List[ast.stmt], when: List[str], out: List[dict], known: Dict[str, str]) -> None:
    for st in body:
        if isinstance(st, ast.If):
            cond = ast.unparse(st.test)
            _branches(st.body, when + [cond], out, known)
            _branches(st.orelse, when + [f"not ({cond})"], out, known)
            if st.body and isinstance(st.body[-1], (ast.Return, ast.Raise)):
                when = when + [f"not ({cond})"]
            continue
        if isinstance(st, (ast.For, ast.While, ast.With, ast.Try)):
            _branches(getattr(st, "body", []), when, out, known)
            continue
        cls = _built(st, known)
        if cls:
            out.append({"when": list(when), "class": cls, "file": known[cls], "line": st.lineno})


def dispatch(src: Source, path: Optional[str], func: str, known: Dict[str, str]) -> List[dict]:
    """The branches of `func` in `path` that build one of `known`, with their conditions."""
    if not path or not src.has(path):
        return []
    out: List[dict] = []
    for n in ast.walk(src.tree(path)):
        if isinstance(n, ast.FunctionDef) and n.name == func:
            _branches(n.body, [], out, known)
    return out


def speculator_configs(src: Source, known: Dict[str, str]) -> List[dict]:
    """0.34+: each method's SpeculatorConfig names its speculator by qualname (`base_method`,
    `speculator_class`, inherited by subclasses); one branch per method, like the dispatch's."""
    found: Dict[str, Tuple[List[str], Dict[str, object], str, int]] = {}
    for path in src.under(V2_SPEC):
        for node in src.tree(path).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("SpeculatorConfig"):
                attrs = {t.id: st.value.value for st in node.body if isinstance(st, (ast.Assign, ast.AnnAssign))
                         for t in ([st.target] if isinstance(st, ast.AnnAssign) else st.targets)
                         if isinstance(t, ast.Name) and isinstance(getattr(st, "value", None), ast.Constant)}
                found[node.name] = ([ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases], attrs, path, node.lineno)

    def attr(name: str, key: str, seen=()) -> object:
        bases, attrs, _, _ = found[name]
        if key in attrs:
            return attrs[key]
        return next((v for b in bases if b in found and b not in seen
                     for v in [attr(b, key, seen + (name,))] if v is not None), None)

    out = []
    for name in sorted(found):
        method, qualname = attr(name, "base_method"), attr(name, "speculator_class")
        cls = str(qualname).rsplit(".", 1)[-1] if qualname else None
        if method and cls in known:
            out.append({"when": [f"method == '{method}'"], "class": cls, "file": known[cls],
                        "line": found[name][3], "config": f"{found[name][2]}:{name}"})
    return out


def literal_strings(src: Source, path: str, name: str) -> List[str]:
    """The strings of a `Name = Literal[...]` alias, nested aliases expanded."""
    aliases: Dict[str, ast.AST] = {}
    for n in src.tree(path).body:
        target = n.target if isinstance(n, ast.AnnAssign) else (n.targets[0] if isinstance(n, ast.Assign) else None)
        if isinstance(target, ast.Name) and getattr(n, "value", None) is not None:
            aliases[target.id] = n.value

    def expand(node: ast.AST, seen: Tuple[str, ...]) -> List[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and node.id in aliases and node.id not in seen:
            return expand(aliases[node.id], seen + (node.id,))
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [s for e in elts for s in expand(e, seen)]
        if isinstance(node, ast.BinOp):
            return expand(node.left, seen) + expand(node.right, seen)
        return []

    return expand(aliases[name], ()) if name in aliases else []


def methods(src: Source) -> Dict[str, List[str]]:
    """The speculative methods `SpeculativeMethod` admits, and those `use_eagle()` counts as EAGLE."""
    path = src.first(p for p in SPEC_CONFIG if src.has(p) and "SpeculativeMethod" in src.text(p))
    if path is None:
        return {"source": None, "all": [], "eagle": []}
    return {"source": path, "all": sorted(set(literal_strings(src, path, "SpeculativeMethod"))),
            "eagle": sorted(set(literal_strings(src, path, "EagleModelTypes")))}


def predicates(src: Source, path: Optional[str]) -> Dict[str, List[str]]:
    """SpeculativeConfig's one-line tests of `self.method` (`use_eagle()`, `use_dflash()`...):
    {name: the methods it is true for}."""
    if not path:
        return {}
    out: Dict[str, List[str]] = {}
    for cls in ast.walk(src.tree(path)):
        if not (isinstance(cls, ast.ClassDef) and cls.name == "SpeculativeConfig"):
            continue
        for f in cls.body:
            rets = [n for n in f.body if isinstance(n, ast.Return)] if isinstance(f, ast.FunctionDef) else []
            if len(rets) != 1 or rets[0].value is None or "self.method" not in ast.unparse(rets[0].value) \
                    or any(isinstance(n, (ast.UnaryOp, ast.BoolOp)) for n in ast.walk(rets[0].value)):
                continue
            found: List[str] = []
            for n in ast.walk(rets[0].value):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    found.append(n.value)
                elif isinstance(n, ast.Name):
                    found += literal_strings(src, path, n.id)
            if found:
                out[f.name] = sorted(set(found))
    return out


_METHOD_IS = re.compile(r"\bmethod == '([^']+)'$")
_PREDICATE = re.compile(r"\.(\w+)\(\)$")


def _picks(cond: str, preds: Dict[str, List[str]]) -> Optional[List[str]]:
    """The methods a condition is true for; None when it does not test the method."""
    m = _METHOD_IS.search(cond)
    if m:
        return [m.group(1)]
    p = _PREDICATE.search(cond)
    return preds.get(p.group(1)) if p else None


def branches_for(branches: List[dict], method: str, preds: Dict[str, List[str]]) -> List[dict]:
    """The branches that build the drafter (speculator) of `method`: a condition names it (or a
    method test true for it), and no condition excludes it; a branch that also tests something else
    (the model's architecture) is one of the set."""
    out = []
    for b in branches:
        ok, tested = True, False
        for c in b["when"]:
            neg = c.startswith("not (") and c.endswith(")")
            picks = _picks(c[5:-1] if neg else c, preds)
            if picks is None:
                continue
            tested = tested or not neg
            ok = ok and ((method not in picks) if neg else (method in picks))
        if ok and tested:
            out.append(b)
    return out


def sibling_sets(v1: List[dict], v2: List[dict], meth: Dict[str, List[str]], preds: Dict[str, List[str]]) -> List[dict]:
    """Per method, the files the V1 runner builds its drafter from and the files the V2 runner
    builds its speculator from (where both exist: a fix to one never runs on the other)."""
    out = []
    for m in meth["all"]:
        a, b = branches_for(v1, m, preds), branches_for(v2, m, preds)
        if a and b:
            out.append({"method": m, "v1": sorted({x["file"] for x in a}), "v1_classes": sorted({x["class"] for x in a}),
                        "v2": sorted({x["file"] for x in b}), "v2_classes": sorted({x["class"] for x in b})})
    return out


# ----------------------------------------------------------------- how the engine and runner are chosen
def env_vars(src: Source) -> Dict[str, dict]:
    """Where envs.py reads each variable that picks the engine or the runner, and how."""
    out: Dict[str, dict] = {}
    for n in ast.walk(src.tree(ENVS)):
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and k.value in ENV_KEYS:
                    out[k.value] = {"source": ENVS, "line": k.lineno, "reads": ast.unparse(v)}
    return out


def _parents(tree: ast.AST) -> Dict[int, ast.AST]:
    return {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def _used_by(node: ast.AST, parents: Dict[int, ast.AST]) -> str:
    """What a string is given to: `logger.warning`, `raise ValueError`, `assignment`..."""
    p = parents.get(id(node))
    while p is not None:
        if isinstance(p, ast.Call):
            return ast.unparse(p.func)
        if isinstance(p, ast.Raise):
            return "raise"
        if isinstance(p, (ast.Assign, ast.AugAssign)):
            return "assignment"
        if isinstance(p, ast.stmt):
            return type(p).__name__.lower()
        p = parents.get(id(p))
    return ""


def strings_with(src: Source, paths, words) -> List[dict]:
    """Every string literal of `paths` containing one of `words`: file, line, text, what it is given to."""
    out = []
    for path in sorted(set(p for p in paths if p and src.has(p))):
        tree = src.tree(path)
        parents = _parents(tree)
        for n in ast.walk(tree):
            if isinstance(n, (ast.Constant, ast.JoinedStr)) and not isinstance(parents.get(id(n)), ast.JoinedStr):
                text = render(n)
                if text and any(w in text for w in words) and len(text) < 400:
                    out.append({"source": path, "line": n.lineno, "text": text, "used_by": _used_by(n, parents)})
    return sorted(out, key=lambda d: (d["source"], d["line"], d["text"]))


def v2_decision(src: Source) -> Optional[dict]:
    """Where the V2 runner is decided: the `use_v2_model_runner` property of VllmConfig, or the
    worker's attribute set from the environment variable."""
    for path in (*CONFIGS, GPU_WORKER):
        if not src.has(path):
            continue
        for n in ast.walk(src.tree(path)):
            if isinstance(n, ast.FunctionDef) and n.name == "use_v2_model_runner":
                calls = sorted({c.func.attr for c in ast.walk(n) if isinstance(c, ast.Call)
                                and isinstance(c.func, ast.Attribute) and "default_v2" in c.func.attr})
                return {"source": path, "line": n.lineno, "kind": "VllmConfig.use_v2_model_runner",
                        "architecture_check": calls}
            if isinstance(n, ast.Assign) and any(ast.unparse(t) == "self.use_v2_model_runner" for t in n.targets):
                return {"source": path, "line": n.lineno, "kind": ast.unparse(n)}
    return None


def architecture_lists(src: Source) -> List[dict]:
    """Literal sets of model architectures in the files that choose the runner (a whitelist)."""
    out = []
    for path in (*CONFIGS, GPU_WORKER, RUNNERS["v2"], V2_DISPATCH):
        if not src.has(path):
            continue
        for n in ast.walk(src.tree(path)):
            if isinstance(n, (ast.Set, ast.List, ast.Tuple)) and len(n.elts) >= 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str)
                    and e.value.endswith(("ForCausalLM", "ForConditionalGeneration")) for e in n.elts):
                out.append({"source": path, "line": n.lineno, "architectures": sorted(e.value for e in n.elts)})
    return out


# ----------------------------------------------------------------- one release
def version_of(src: Source) -> Optional[str]:
    if not src.has(VERSION_FILE):
        return None
    for n in src.tree(VERSION_FILE).body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and any(
                getattr(t, "id", "") == "__version__" for t in n.targets):
            return n.value.value
    return None


def extract(src: Source) -> dict:
    """Every fact the wheel states, as plain data."""
    drafters = classes_in(src, src.under(V1_SPEC), ("Proposer",))
    speculators = classes_in(src, [p for p in src.under(V2_SPEC) if p.endswith("speculator.py")], ("Speculator",))
    v0 = classes_in(src, src.under(V0_SPEC), ("Worker", "Proposer"))
    v1 = dispatch(src, RUNNERS["v1"], "__init__", drafters)
    v2 = dispatch(src, V2_DISPATCH, "init_speculator", speculators) or speculator_configs(src, speculators)
    meth = methods(src)
    preds = predicates(src, meth["source"])
    runners = {k: p for k, p in RUNNERS.items() if src.has(p)}
    engines = {k: p for k, p in ENGINES.items() if src.has(p) and "LLM engine (v" in src.text(p)}
    config = src.first(CONFIGS)
    files = [p for p in (VERSION_FILE, ENVS, ARG_UTILS, config, meth["source"], PLATFORM, GPU_WORKER, V2_DISPATCH)
             if p and src.has(p)]
    files += sorted(set(runners.values()) | set(drafters.values()) | set(speculators.values()) | set(v0.values()))
    return {
        "version": version_of(src),
        "version_file": VERSION_FILE,
        "files": list(dict.fromkeys(files)),
        "runners": runners,
        # the model runners side by side: V0 against V1 (0.10.x), V1 against V2 (0.12-0.33)
        "runner_pairs": [[runners[a], runners[b]] for a, b in (("v0", "v1"), ("v1", "v2")) if a in runners and b in runners],
        "engines": engines,
        "v0_spec_decode": v0,
        "drafters": drafters,
        "speculators": speculators,
        "bases": class_bases(src, {**v0, **drafters, **speculators}),
        "drafter_branches": v1,
        "speculator_branches": v2,
        "method_tests": preds,
        "siblings": sibling_sets(v1, v2, meth, preds),
        "methods": meth,
        "env": env_vars(src),
        "v2_decided_in": v2_decision(src),
        "architecture_lists": architecture_lists(src),
        "choice_lines": strings_with(src, _SELECTION_FILES, CHOICE_WORDS),
        "banner": strings_with(src, [p for p in src.under("vllm/entrypoints/")], BANNERS),
        "ready": {"line": UVICORN_READY, "source": "uvicorn (not in the vLLM wheel)"},
    }


def release_doc(src: Source, version: str, reviewed: dict) -> dict:
    return {"release": version, "wheel": src.members.wheel, "reviewed": reviewed, "extracted": extract(src)}


to_text = sglang_wheel.to_text
version_key = sglang_wheel.version_key


def shipped_releases(facts_dir: Path = FACTS_DIR) -> List[str]:
    return sglang_wheel.shipped_releases(facts_dir)


def reviewed_for(version: str, facts_dir: Path = FACTS_DIR) -> dict:
    own = facts_dir / f"{version}.json"
    if own.exists():
        return json.loads(own.read_text())["reviewed"]
    prev = sglang_wheel.previous_release(version, facts_dir)
    if prev is None:
        return {"policy": "unreviewed", "status": "pending review (no earlier release)"}
    reviewed = dict(json.loads((facts_dir / f"{prev}.json").read_text())["reviewed"])
    reviewed["status"] = f"pending review (copied from {prev})"
    return reviewed


def regenerate(version: str, members: vllm_members.Members, facts_dir: Path = FACTS_DIR) -> str:
    """The facts file of `version` as its members and the kept reviewed section give it."""
    return to_text(release_doc(Source(members), version, reviewed_for(version, facts_dir)))


def cache_root() -> Path:
    return sglang_wheel.cache_dir()


def cached(version: str, root: Optional[Path] = None) -> Optional[vllm_members.Members]:
    d = (root or cache_root()) / f"vllm-{version}.members"
    return vllm_members.Members(d) if (d / "wheel.json").is_file() else None


def members(version: str, root: Optional[Path] = None) -> vllm_members.Members:
    """vllm==version's members, from the cache or fetched by range from PyPI's file host."""
    found = cached(version, root)
    if found is not None:
        return found
    dest = (root or cache_root()) / f"vllm-{version}.members"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest.with_name(dest.name + ".part"), ignore_errors=True)
    try:
        info = vllm_members.wheel_file(version)
        got, _ = vllm_members.fetch_members(info["url"], info["size"], wanted, dest, info["filename"])
    except OSError as e:
        raise RuntimeError(f"could not fetch vllm=={version}'s wheel members: {e}") from None
    return got


def write_release(version: str, facts_dir: Path = FACTS_DIR) -> Tuple[Path, List[str]]:
    text = regenerate(version, members(version), facts_dir)
    out = facts_dir / f"{version}.json"
    facts_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    prev = sglang_wheel.previous_release(version, facts_dir)
    if prev is None:
        return out, ["(no earlier release to compare with)"]
    old = json.loads((facts_dir / f"{prev}.json").read_text())
    return out, [f"differences from {prev}:"] + (sglang_wheel.differences(old, json.loads(text)) or ["  none"])


POLICY_TEXT = {
    "v0-v1": "V1 engine unless VLLM_USE_V1=0 (V0); some features fall back to V0",
    "v1-only": "V1 engine, V1 model runner only",
    "v2-opt-in": "V1 runner; VLLM_USE_V2_MODEL_RUNNER=1 opts in to V2",
    "v2-by-architecture": "VLLM_USE_V2_MODEL_RUNNER, else V2 for the architectures VllmConfig lists, V1 for the rest",
    "v2-default": "V2 runner by default; unsupported features fall back to V1 (warned)",
    "v2-only": "V2 runner only; VLLM_USE_V2_MODEL_RUNNER other than 1 refused",
}


def proposed_policy(x: dict) -> str:
    """The runner policy the extracted facts point to; a maintainer confirms it in `reviewed`."""
    runners, decided = x["runners"], x.get("v2_decided_in") or {}
    if "v0" in x["engines"]:
        return "v0-v1"
    if "v2" not in runners:
        return "v1-only"
    if "v1" not in runners:
        return "v2-only"
    if decided.get("kind") != "VllmConfig.use_v2_model_runner":
        return "v2-opt-in"
    return "v2-by-architecture" if decided.get("architecture_check") else "v2-default"


def supported_table(facts_dir: Path = FACTS_DIR) -> str:
    """docs/engine-versions.md's table of the vLLM releases the profile knows, from the facts files."""
    rows = ["| release | engine / model runner | V1 drafter / V2 speculator sets | banner from |",
            "| --- | --- | --- | --- |"]
    for v in shipped_releases(facts_dir):
        doc = json.loads((facts_dir / f"{v}.json").read_text())
        x, r = doc["extracted"], doc["reviewed"]
        sets = ", ".join(s["method"] for s in x["siblings"]) or "none"
        banner = ", ".join(sorted({b["source"].rsplit("/", 1)[1] for b in x["banner"]})) or "none"
        status = "" if r.get("status") == "reviewed" else f" ({r.get('status')})"
        rows.append(f"| {v}{status} | {POLICY_TEXT.get(r.get('policy'), r.get('policy'))} | {sets} | {banner} |")
    return "\n".join(rows) + "\n"
