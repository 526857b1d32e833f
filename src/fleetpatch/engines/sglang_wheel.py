"""Read one SGLang release's facts out of its PyPI wheel, without importing it.

The maintainer command `invoke engine-facts --version X` (tasks.py) downloads
the wheel (`pip download --no-deps --only-binary :all: sglang==X`), and this
module reads it with `zipfile` and `ast` only: nothing of SGLang runs.  It
writes `engines/sglang_releases/X.json`:

* ``extracted``: everything read from the wheel (worker classes and their
  files, sibling pairs, the `create_worker` branches, the algorithms, the
  routing log lines, where each recognised line is, the ready line(s), the
  ServerArgs dump's shape, the environment variables);
* ``reviewed``: what needs a maintainer's judgement (the routing policy, the
  worker families, which lines mean what).  It is kept across regenerations;
  a new release starts from the previous release's, marked pending review.

The files are JSON with sorted keys, so regenerating a release from the same
wheel is byte for byte what is shipped (tests/test_release_facts.py checks it).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..cacheroot import cache_root

FACTS_DIR = Path(__file__).resolve().parent / "sglang_releases"
CATALOG = FACTS_DIR / "signatures.json"
SPEC = "sglang/srt/speculative/"
SERVER_ARGS = "sglang/srt/server_args.py"
ENVIRON = "sglang/srt/environ.py"
SPEC_INFO = SPEC + "spec_info.py"
SPEC_REGISTRY = SPEC + "spec_registry.py"
SPEC_HOOK = "sglang/srt/arg_groups/speculative_hook.py"
ENGINE = "sglang/srt/entrypoints/engine.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
READY_TEXT = "The server is fired up and ready to roll!"
ROUTING_WORDS = ("spec v1", "spec v2", "overlap schedul", "non-overlap")
INFO_FIELDS = ("speculative_algorithm", "enable_multi_layer_eagle", "disable_overlap_schedule",
               "speculative_eagle_topk")
_WORKER = re.compile(r"[A-Za-z0-9]+Worker(V2)?")
_ABI = re.compile(r"\.cpython-[^/]*\.so$")


class Wheel:
    """The files of one wheel, parsed on demand."""

    def __init__(self, path: Path):
        self.zf = zipfile.ZipFile(path)
        self.names = set(self.zf.namelist())
        self._trees: Dict[str, ast.Module] = {}

    def text(self, path: str) -> str:
        return self.zf.read(path).decode("utf-8")

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self.text(path))
        return self._trees[path]

    def metadata(self) -> str:
        meta = sorted(n for n in self.names if n.endswith(".dist-info/METADATA"))
        return self.text(meta[0]) if meta else ""


def render(node: ast.AST) -> Optional[str]:
    """A string literal's text; an f-string's holes are NUL; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)
    return None


def string_lines(w: Wheel, path: str, literal: str) -> List[int]:
    """The lines where a string literal of `path` containing `literal` starts."""
    if path not in w.names:
        return []
    return sorted({n.lineno for n in ast.walk(w.tree(path))
                   if isinstance(n, (ast.Constant, ast.JoinedStr)) and literal in (render(n) or "")})


def is_worker(name: str) -> bool:
    return bool(_WORKER.fullmatch(name)) and "Draft" not in name and not name.startswith("Base")


# ----------------------------------------------------------------- workers
def worker_classes(w: Wheel) -> Tuple[Dict[str, str], Dict[str, str]]:
    """{worker class: its file} and {worker class: the worker class it derives from}."""
    files, bases = {}, {}
    for path in sorted(w.names):
        if path.startswith(SPEC) and path.endswith(".py") and "worker" in path.rsplit("/", 1)[1]:
            for node in w.tree(path).body:
                if isinstance(node, ast.ClassDef) and is_worker(node.name):
                    files[node.name] = path
                    bases[node.name] = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
    return files, {c: b for c, bs in bases.items() for b in bs if b in files}


def _imports(node: ast.AST) -> Dict[str, str]:
    return {a.asname or a.name: n.module.replace(".", "/") + ".py"
            for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.")
            for a in n.names}


def _branches(body: List[ast.stmt], when: List[str], out: List[dict], imported: Dict[str, str]) -> None:
    """Each worker class the statements import or return, under the conditions that lead there."""
    negated: List[str] = []
    for st in body:
        if isinstance(st, ast.If):
            cond = ast.unparse(st.test)
            _branches(st.body, when + negated + [cond], out, imported)
            _branches(st.orelse, when + negated + [f"not ({cond})"], out, imported)
            if st.body and isinstance(st.body[-1], (ast.Return, ast.Raise)):
                negated.append(f"not ({cond})")
            continue
        if isinstance(st, (ast.For, ast.While, ast.With, ast.Try)):
            _branches(getattr(st, "body", []), when + negated, out, imported)
            continue
        if isinstance(st, ast.ImportFrom):
            for a in st.names:
                if is_worker(a.asname or a.name) and imported[a.asname or a.name].startswith(SPEC):
                    out.append({"when": when + negated, "worker": a.name, "file": imported[a.asname or a.name]})
        elif isinstance(st, ast.Return) and isinstance(st.value, ast.Name) and st.value.id not in imported:
            out.append({"when": when + negated, "worker": st.value.id, "file": None})


def dispatch(w: Wheel) -> Tuple[List[str], List[dict]]:
    """Where the worker is chosen, and its branches: `create_worker` (0.5.8+), or
    0.5.7's registry factories plus the scheduler's multi-layer check."""
    funcs = [n for n in ast.walk(w.tree(SPEC_INFO)) if isinstance(n, ast.FunctionDef)
             and (n.name == "create_worker" or n.name.startswith("_create_"))]
    sources = [SPEC_INFO]
    if not any(f.name == "create_worker" for f in funcs) and SCHEDULER in w.names:
        sources.append(SCHEDULER)
        funcs += [n for n in ast.walk(w.tree(SCHEDULER)) if isinstance(n, ast.FunctionDef) and any(
            isinstance(i, ast.ImportFrom) and any(is_worker(a.name) for a in i.names) for i in ast.walk(n))]
    out: List[dict] = []
    for f in funcs:
        _branches(f.body, [f.name], out, _imports(f))
    return sources, out


# ----------------------------------------------------------------- settings
def algorithms(w: Wheel) -> List[str]:
    members = set()
    for n in ast.walk(w.tree(SPEC_INFO)):
        if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm":
            members |= {s.targets[0].id for s in n.body if isinstance(s, ast.Assign)
                        and isinstance(s.targets[0], ast.Name) and not s.targets[0].id.startswith("_")}
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register_speculative_algorithm":
            members.add(n.args[0].value)
    members.discard("NONE")
    return sorted(members)


def algorithm_choices(w: Wheel) -> Optional[List[str]]:
    """argparse's choices for --speculative-algorithm (None: free text)."""
    for n in ast.walk(w.tree(SERVER_ARGS)):
        if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant) \
                and n.args[0].value == "--speculative-algorithm":
            for kw in n.keywords:
                if kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple)):
                    return [e.value for e in kw.value.elts]
    return None


def env_vars(w: Wheel) -> Dict[str, object]:
    """The routing-related variables sglang.srt.environ declares, with their defaults,
    and the spellings its EnvBool reads as true and false."""
    out: Dict[str, object] = {}
    for n in ast.walk(w.tree(ENVIRON)):
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) \
                and n.targets[0].id in ("SGLANG_ENABLE_SPEC_V2", "SGLANG_RUST_SERVER") \
                and isinstance(n.value, ast.Call) and n.value.args:
            out[n.targets[0].id] = {"type": ast.unparse(n.value.func), "default": n.value.args[0].value}
        if isinstance(n, ast.ClassDef) and n.name == "EnvBool":
            lists = [[e.value for e in c.comparators[0].elts] for c in ast.walk(n)
                     if isinstance(c, ast.Compare) and isinstance(c.comparators[0], ast.List)]
            if len(lists) == 2:
                out["EnvBool"] = {"true": lists[0], "false": lists[1]}
    return out


def routing_lines(w: Wheel) -> Dict[str, object]:
    """Every logger call of the routing code that speaks of spec v1/v2 or overlap scheduling."""
    source = SPEC_HOOK if SPEC_HOOK in w.names else SERVER_ARGS
    out = []
    for n in ast.walk(w.tree(source)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args \
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "logger":
            text = render(n.args[0])
            if text and any(k in text.lower() for k in ROUTING_WORDS):
                out.append({"level": n.func.attr, "line": n.lineno, "text": text})
    return {"source": source, "lines": sorted(out, key=lambda d: d["line"])}


def pp_errors(w: Wheel) -> List[dict]:
    files = [SERVER_ARGS] + sorted(p for p in w.names if p.startswith("sglang/srt/arg_groups/") and p.endswith(".py"))
    out = []
    for path in files:
        for n in ast.walk(w.tree(path)):
            text = render(n.msg) if isinstance(n, ast.Assert) and n.msg is not None else None
            if text and text.startswith("Pipeline parallelism is not compatible"):
                out.append({"source": path, "line": n.lineno, "text": text})
    return out


# ----------------------------------------------------------------- the server's own lines
def dump_shape(w: Wheel) -> Dict[str, object]:
    """How engine.py logs the ServerArgs: the repr (`server_args=ServerArgs(...)`), or a
    dict (`server_args={...}`, 0.5.19+), redacted or not; and what kind of class it is."""
    lines, exprs, shapes = [], set(), set()
    for n in ast.walk(w.tree(ENGINE)):
        if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "info" and n.args \
                and isinstance(n.args[0], ast.JoinedStr) and (render(n.args[0]) or "").startswith("server_args="):
            lines.append(n.lineno)
            exprs.add(ast.unparse(n.args[0]))
            held = [v.value for v in n.args[0].values if isinstance(v, ast.FormattedValue)]
            # the object itself is its repr, ServerArgs(...); a call (resolved_dict()) gives a dict
            shapes.add("ServerArgs(...)" if held and isinstance(held[0], ast.Name) else "{...}")
    src = w.text(ENGINE)
    return {"source": ENGINE, "lines": sorted(lines), "expressions": sorted(exprs),
            "shape": " or ".join(sorted(shapes)),
            "redacted": "redact_watermark_secrets(" in src, "class": _server_args_class(w)}


def _server_args_class(w: Wheel) -> str:
    for n in w.tree(SERVER_ARGS).body:
        if isinstance(n, ast.ClassDef) and n.name == "ServerArgs":
            kinds = [ast.unparse(d) for d in n.decorator_list] + [ast.unparse(b) for b in n.bases]
            if any("dataclass" in k for k in kinds):
                return "dataclass"
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "ServerArgs" for t in n.targets) \
                and "defstruct" in ast.unparse(n.value.func if isinstance(n.value, ast.Call) else n.value):
            return "msgspec.defstruct"
    return "class"


def info_fields(w: Wheel) -> Dict[str, object]:
    """Where /server_info's routing fields are declared (ServerArgs, or the arg_groups field structs)."""
    files = [SERVER_ARGS] + sorted(p for p in w.names if p.startswith("sglang/srt/arg_groups/fields/")
                                   and p.endswith(".py"))
    found: Dict[str, str] = {}
    for path in files:
        for n in ast.walk(w.tree(path)):
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id in INFO_FIELDS:
                found.setdefault(n.target.id, path)
    return {"endpoint": bool(string_lines(w, HTTP_SERVER, "/server_info")), "fields": found}


def ready_lines(w: Wheel) -> List[dict]:
    """Every place that prints the ready line: Python's, and the Rust HTTP server's (0.5.22+)."""
    out = [{"source": p, "lines": string_lines(w, p, READY_TEXT)}
           for p in sorted(w.names) if p.startswith("sglang/srt/entrypoints/") and p.endswith(".py")]
    out = [d for d in out if d["lines"]]
    for p in sorted(w.names):
        if p.endswith(".so") and READY_TEXT.encode() in w.zf.read(p):
            out.append({"source": _ABI.sub(".*.so", p), "lines": []})
    return out


# ----------------------------------------------------------------- one release
def catalog() -> Dict[str, dict]:
    """The recognised lines (reviewed): id -> key, text, source, what the line means."""
    return json.loads(CATALOG.read_text())


def located(w: Wheel, ids: List[str], lines_catalog: Dict[str, dict]) -> Dict[str, List[int]]:
    """Where each recognised line's literal is in this wheel ([] when it is not)."""
    out = {}
    for i in sorted(set(ids)):
        entry = lines_catalog[i]
        out[i] = string_lines(w, entry["source"], entry.get("probe") or entry["text"])
    return out


def extract(w: Wheel, reviewed: dict, lines_catalog: Dict[str, dict]) -> dict:
    """Every fact the wheel states, as plain data."""
    classes, bases = worker_classes(w)
    sources, branches = dispatch(w)
    created = sorted({b["worker"] for b in branches if b["file"]})
    files = [f for f in (SERVER_ARGS, ENVIRON, SPEC_INFO, SPEC_REGISTRY, SPEC_HOOK) if f in w.names]
    files += sorted({classes[c] for c in classes})
    created_files = {classes[c] for c in created if c in classes}
    siblings = sorted([f, f[:-3] + "_v2.py"] for f in created_files if f[:-3] + "_v2.py" in created_files)
    meta = w.metadata()
    requires = re.search(r"^Requires-Python: *(.+)$", meta, re.M)
    ids = list(reviewed.get("signatures", [])) + list(reviewed.get("failures", [])) + ["DUMP", "READY"]
    return {
        "files": files,
        "workers": {c: classes[c] for c in sorted(classes)},
        "bases": {c: bases[c] for c in sorted(bases)},
        "created": {c: next(b["file"] for b in branches if b["worker"] == c) for c in created},
        "siblings": siblings,
        "dispatch": {"sources": sources, "branches": branches},
        "algorithms": algorithms(w),
        "algorithm_choices": algorithm_choices(w),
        "env": env_vars(w),
        "routing_log_lines": routing_lines(w),
        "pp_errors": pp_errors(w),
        "server_args_dump": dump_shape(w),
        "server_info": info_fields(w),
        "ready": ready_lines(w),
        "signature_lines": located(w, ids, lines_catalog),
        "requires_python": requires.group(1).strip() if requires else None,
    }


def to_text(doc: dict) -> str:
    """The file's bytes: sorted keys, one-space indent, a final newline."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def release_doc(w: Wheel, version: str, reviewed: dict, lines_catalog: Optional[Dict[str, dict]] = None) -> dict:
    return {"release": version, "reviewed": reviewed,
            "extracted": extract(w, reviewed, lines_catalog if lines_catalog is not None else catalog())}


# ----------------------------------------------------------------- releases on disk
def version_key(v: str):
    from packaging.version import Version
    return Version(v)


def shipped_releases(facts_dir: Path = FACTS_DIR) -> List[str]:
    return sorted((p.stem for p in facts_dir.glob("*.json") if p.stem[:1].isdigit()), key=version_key)


def previous_release(version: str, facts_dir: Path = FACTS_DIR) -> Optional[str]:
    older = [v for v in shipped_releases(facts_dir) if version_key(v) < version_key(version)]
    return older[-1] if older else None


def reviewed_for(version: str, facts_dir: Path = FACTS_DIR) -> dict:
    """The reviewed section kept across regenerations; a new release starts from the
    previous release's, marked pending until a maintainer has reviewed it."""
    own = facts_dir / f"{version}.json"
    if own.exists():
        return json.loads(own.read_text())["reviewed"]
    prev = previous_release(version, facts_dir)
    if prev is None:
        raise SystemExit(f"no reviewed facts to start sglang {version} from in {facts_dir}")
    reviewed = dict(json.loads((facts_dir / f"{prev}.json").read_text())["reviewed"])
    reviewed["status"] = f"pending review (copied from {prev})"
    return reviewed


def regenerate(version: str, wheel: Path, facts_dir: Path = FACTS_DIR) -> str:
    """The facts file of `version` as its wheel and the kept reviewed section give it."""
    return to_text(release_doc(Wheel(wheel), version, reviewed_for(version, facts_dir)))


def cache_dir() -> Path:
    return cache_root() / "wheels"


def download(version: str, dest: Optional[Path] = None) -> Path:
    """sglang==version's wheel, from the cache or PyPI (`pip download --no-deps`)."""
    dest = dest or cache_dir()
    found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    return pip_download(f"sglang=={version}", f"sglang-{version}-*.whl", dest)


def pip_download(requirement: str, pattern: str, dest: Path) -> Path:
    """One wheel (`pattern`) of `requirement` into `dest`, by `pip download`: into a folder of this
    process's own, then renamed into place. Processes that want the same release at once (test
    workers) each download it, and none reads a wheel that another is still writing: two pips
    copying into one folder made one of them fail (CI, 2026-12-06)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
               "--disable-pip-version-check", "-d", tmp, requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob(pattern))
        if proc.returncode != 0 or not got:
            why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise RuntimeError(f"could not download {requirement}: {why[-1] if why else 'no wheel'}")
        os.replace(got[0], dest / got[0].name)
    return dest / got[0].name


def _flat(prefix: str, value, out: Dict[str, object]) -> None:
    if isinstance(value, list) and value and all(isinstance(v, dict) and "worker" in v for v in value):
        value = {v["worker"]: {"when": " and ".join(v["when"]), "file": v["file"]} for v in value}
    if isinstance(value, dict):
        for k in value:
            _flat(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    else:
        out[prefix] = value


def differences(old: dict, new: dict) -> List[str]:
    """What changed from one release's facts to the next, one line each; moved line
    numbers are counted, not listed."""
    a, b = {}, {}
    _flat("", {k: v for k, v in old.items() if k != "release"}, a)
    _flat("", {k: v for k, v in new.items() if k != "release"}, b)
    out, moved = [], 0
    for k in sorted(set(a) | set(b)):
        if a.get(k) == b.get(k):
            continue
        if k in a and k in b and _only_lines(k, a[k], b[k]):
            moved += 1
        elif k not in a:
            out.append(f"+ {k}: {json.dumps(b[k])}")
        elif k not in b:
            out.append(f"- {k}: {json.dumps(a[k])}")
        else:
            out.append(f"~ {k}: {json.dumps(a[k])} -> {json.dumps(b[k])}")
    if moved:
        out.append(f"  ({moved} line numbers moved)")
    return out


def _only_lines(key: str, a, b) -> bool:
    if (key.endswith(("lines", ".line")) or ".signature_lines." in key) and all(isinstance(x, int) for x in (a if isinstance(a, list) else [a])) \
            and all(isinstance(x, int) for x in (b if isinstance(b, list) else [b])):
        return bool(a) == bool(b)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        strip = lambda xs: [{k: v for k, v in x.items() if k not in ("line", "lines")} if isinstance(x, dict)
                            else x for x in xs]
        return strip(a) == strip(b)
    return False


# ----------------------------------------------------------------- the maintainer's view
def write_release(version: str, facts_dir: Path = FACTS_DIR, wheel: Optional[Path] = None) -> Tuple[Path, List[str]]:
    """Download (or reuse) the wheel, write the release's facts file, and say what
    differs from the previous release's facts."""
    text = regenerate(version, wheel or download(version), facts_dir)
    out = facts_dir / f"{version}.json"
    out.write_text(text)
    prev = previous_release(version, facts_dir)
    if prev is None:
        return out, ["(no earlier release to compare with)"]
    old = json.loads((facts_dir / f"{prev}.json").read_text())
    return out, [f"differences from {prev}:"] + (differences(old, json.loads(text)) or ["  none"])


def supported_table(facts_dir: Path = FACTS_DIR) -> str:
    """The README's table of supported releases, as markdown, from the facts files."""
    rows = ["| release | speculative workers (create_worker) | v1/v2 sibling files | path decided by "
            "| ServerArgs dump | ready line from |", "| --- | --- | --- | --- | --- | --- |"]
    for v in shipped_releases(facts_dir):
        doc = json.loads((facts_dir / f"{v}.json").read_text())
        x, r = doc["extracted"], doc["reviewed"]
        workers = ", ".join(sorted(x["created"]))
        pairs = ", ".join(f"{a.rsplit('/', 1)[1]}/{b.rsplit('/', 1)[1]}" for a, b in x["siblings"]) or "none"
        dump = x["server_args_dump"]
        shape = "`server_args=ServerArgs(...)`" if dump["shape"] == "ServerArgs(...)" else "`server_args={...}`"
        shape += ", redacted" if dump["redacted"] else ""
        ready = " + ".join("Rust server" if s["source"].endswith(".so") else s["source"].rsplit("/", 1)[1]
                           for s in x["ready"])
        status = "" if r.get("status") == "reviewed" else f" ({r.get('status')})"
        rows.append(f"| {v}{status} | {workers} | {pairs} | {_POLICY_TEXT.get(r['policy'], r['policy'])} "
                    f"| {shape} | {ready} |")
    return "\n".join(rows) + "\n"


_POLICY_TEXT = {
    "v2-opt-in": "SGLANG_ENABLE_SPEC_V2 opts in to v2 (topk > 1 refused on v2)",
    "v2-default": "v2 by default; topk > 1, SGLANG_ENABLE_SPEC_V2=false or --disable-overlap-schedule: v1",
    "v2-only-env": "v2 only; SGLANG_ENABLE_SPEC_V2=false or --disable-overlap-schedule: synchronous",
    "v2-only": "v2 only; --disable-overlap-schedule: synchronous",
}
