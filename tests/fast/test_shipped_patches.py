"""The shipped patches and the test-fixture patches, against the real SGLang wheel files.

For every revision that should apply:

* the manifest has exactly the documented keys and names its diff;
* the diff applies to a pristine copy of the PyPI wheel tree with
  ``patch -p1 -F0`` (no fuzz, and no offset either) and ``git apply --check``;
* the patched files byte-compile;
* fleetpatch's own ``diffapply`` agrees (skipped while it cannot be imported).

The fixtures that must be refused are refused by ``patch``/``git apply`` and by
``diffapply.parse_diff``; the manifest rules (sibling rule, marker rule) are
checked with ``patchset.load_patch`` when it can be imported.

With the stand-in server (``fleetpatch_demo/standins/``) the patched tree is
started on the spec-v1 path (no SGLANG_ENABLE_SPEC_V2, topk 4) and on the
spec-v2 path (SGLANG_ENABLE_SPEC_V2=True, topk 1): the stand-in constructs the
worker that SGLang's own routing picks, so the marker of that path must appear
and the other path's must not.

The torch-free decision functions that dynamic-spec-disable adds to
server_args.py are unit-tested by extracting them from the patched file.
Nothing here runs a GPU or a forward pass.
"""
from __future__ import annotations

import __future__
import ast
import os
import py_compile
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from fleetpatch_demo.standinsite import install_sglang_standin
from fleetpatch_demo.wheels import sglang_tree
from support.paths import REPO
from support.ports import free_port

SHIPPED = REPO / "src" / "fleetpatch" / "patches"
FIXTURES = REPO / "tests" / "fixtures" / "patches"

WHEEL_VERSIONS = ("0.5.8", "0.5.8.post1", "0.5.9")
V1 = "sglang/srt/speculative/eagle_worker.py"
V2 = "sglang/srt/speculative/eagle_worker_v2.py"
SERVER_ARGS = "sglang/srt/server_args.py"
READY = "The server is fired up and ready to roll!"

TOP_KEYS = {"name", "summary", "engine", "revisions", "markers", "expect", "forbid", "allow_single_path", "smoke_expect",
            "superseded", "executed", "unported"}
REQUIRED_KEYS = {"name", "summary", "engine", "revisions", "markers", "expect", "forbid"}
REV_KEYS = {"rev", "diff", "engine_versions"}

SHIPPED_NAMES = ("spec-path-beacon", "dynamic-spec-disable")
APPLYING_FIXTURES = ("v2-only-beacon", "v1-only-no-allow", "no-marker", "crash-in-init", "multi-rev")
REFUSED_DIFF_FIXTURES = ("traversal", "absolute", "binary", "malformed")
FIXTURE_NAMES = APPLYING_FIXTURES + REFUSED_DIFF_FIXTURES


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def manifest(folder: Path) -> dict:
    return yaml.safe_load((folder / "patch.yaml").read_text())


def revisions_of(folder: Path):
    """(folder, rev dict, wheel version) for every revision, the version being the
    wheel this repo tests it against (the one its engine_versions admits)."""
    out = []
    for rev in manifest(folder)["revisions"]:
        spec = SpecifierSet(rev["engine_versions"])
        versions = [v for v in WHEEL_VERSIONS if v in spec]
        assert versions, f"{folder.name} r{rev['rev']}: no tested wheel version in {rev['engine_versions']}"
        for v in versions:
            out.append((folder, rev, v))
    return out


def applying_cases():
    cases = []
    for name in SHIPPED_NAMES:
        cases += revisions_of(SHIPPED / name)
    for name in APPLYING_FIXTURES:
        cases += revisions_of(FIXTURES / name)
    return [pytest.param(f, r, v, id=f"{f.name}@{r['rev']}-{v}") for f, r, v in cases]


def changed_paths(diff_text: str):
    return sorted({m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", diff_text, re.M)})


def pristine_copy(version: str, dest: Path) -> Path:
    """A writable copy of the cached wheel tree (the cache itself is never touched)."""
    shutil.copytree(sglang_tree(version), dest)
    for p in dest.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
    return dest


def run(cmd, cwd, stdin_path=None):
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as stdin:
        return subprocess.run(cmd, cwd=cwd, stdin=stdin, capture_output=True, text=True)


@pytest.fixture(scope="module")
def patched_trees(tmp_path_factory):
    """(patch folder name, rev, version) -> a copy of the wheel tree with that revision applied by `patch`."""
    cache = {}

    def get(folder: Path, rev: dict, version: str) -> Path:
        key = (str(folder), rev["rev"], version)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{folder.name}-r{rev['rev']}-{version}")
            tree = pristine_copy(version, root / "tree")
            proc = run(["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(folder / rev["diff"])], tree)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            cache[key] = tree
        return cache[key]

    return get


# ---------------------------------------------------------------------------
# manifests
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("folder", [SHIPPED / n for n in SHIPPED_NAMES] + [FIXTURES / n for n in FIXTURE_NAMES],
                         ids=lambda p: p.name)
def test_manifest_shape(folder):
    doc = manifest(folder)
    assert set(doc) <= TOP_KEYS, f"unknown keys: {set(doc) - TOP_KEYS}"
    assert REQUIRED_KEYS <= set(doc), f"missing keys: {REQUIRED_KEYS - set(doc)}"
    assert doc["name"] == folder.name
    assert doc["engine"] == "sglang"
    assert isinstance(doc["summary"], str) and doc["summary"].strip()
    assert doc["forbid"] == ["Traceback (most recent call last)"]
    assert isinstance(doc["expect"], list)
    revs = doc["revisions"]
    assert [r["rev"] for r in revs] == sorted({r["rev"] for r in revs})
    for r in revs:
        assert set(r) == REV_KEYS
        assert (folder / r["diff"]).is_file()
        SpecifierSet(r["engine_versions"])  # a valid PEP 440 specifier
    assert sorted(p.name for p in folder.glob("*.diff")) == sorted(r["diff"] for r in revs)
    for path, marker in doc["markers"].items():
        assert path in ("EAGLEWorker", "EAGLEWorkerV2")
        if isinstance(marker, dict):
            assert set(marker) == {"regex"}
            re.compile(marker["regex"])
        else:
            assert isinstance(marker, str) and marker
    if "allow_single_path" in doc:
        assert isinstance(doc["allow_single_path"], str) and doc["allow_single_path"].strip()


def test_shipped_revisions_cover_their_versions():
    beacon = manifest(SHIPPED / "spec-path-beacon")
    assert {r["engine_versions"] for r in beacon["revisions"]} == {"==0.5.9", "==0.5.8"}
    dsd = manifest(SHIPPED / "dynamic-spec-disable")
    assert [r["engine_versions"] for r in dsd["revisions"]] == ["==0.5.9", ">=0.5.8,<=0.5.8.post1"]
    assert dsd["superseded"] == {"engine_versions": ">=0.5.23", "use": "--speculative-adaptive"}


def _wheel_file(version: str, path: str):
    from fleetpatch_demo.wheels import wheel_path
    with zipfile.ZipFile(wheel_path(version)) as zf:
        return zf.read(path) if path in zf.namelist() else None


def _release_names():
    from fleetpatch.engines.sglang_facts import RELEASES
    return [r.name for r in RELEASES]


@pytest.mark.pypi
@pytest.mark.parametrize("version", _release_names())
def test_dynamic_spec_disable_fits_every_release_or_says_why(version):
    """Every release the profile knows: a revision applies to its real files at zero
    offset, or upstream supersedes the patch, or r1 genuinely conflicts there (and
    the loader says no revision fits, naming the ones that exist)."""
    from fleetpatch import diffapply, patchset
    from fleetpatch.engines.sglang import PROFILE
    folder = SHIPPED / "dynamic-spec-disable"
    patch, _ = patchset.load_patch("dynamic-spec-disable", [SHIPPED], PROFILE)
    fitting = [r for r in manifest(folder)["revisions"] if version in SpecifierSet(r["engine_versions"])]
    if fitting:
        (rev,) = fitting
        assert patch.choose(None, version).rev == rev["rev"]
        for fd in diffapply.parse_diff((folder / rev["diff"]).read_text(), rev["diff"]):
            res = diffapply.apply_file(fd, _wheel_file(version, fd.path))
            assert res.state == "applies" and set(res.offsets) == {0}, (fd.path, res.detail)
        return
    with pytest.raises(patchset.NoRevisionFits) as err:
        patch.choose(None, version)
    assert "r1 ==0.5.9" in str(err.value)
    r1 = diffapply.parse_diff((folder / "sglang-0.5.9.r1.diff").read_text(), "r1")
    states = {fd.path: diffapply.apply_file(fd, _wheel_file(version, fd.path)).state for fd in r1}
    assert "conflict" in states.values(), states
    assert patch.superseded.admits(version) == (Version(version) >= Version("0.5.23"))
    # check-patch says why no revision fits (the error is its message): the port nobody wrote, not a bare "no"
    unported = Version("0.5.10") <= Version(version) < Version("0.5.23")
    assert ("changed the code its diff touches" in str(err.value)) == unported, str(err.value)


# ---------------------------------------------------------------------------
# applying: patch -F0, git apply --check, py_compile, diffapply
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("folder,rev,version", applying_cases())
def test_applies_without_fuzz_or_offset(folder, rev, version, tmp_path):
    diff = folder / rev["diff"]
    tree = pristine_copy(version, tmp_path / "tree")
    dry = run(["patch", "-p1", "-F0", "--dry-run", "-i", str(diff)], tree)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "offset" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout
    if shutil.which("git"):
        chk = run(["git", "apply", "--check", "-p1", str(diff)], tree)
        assert chk.returncode == 0, chk.stdout + chk.stderr
    # the cached wheel tree itself is untouched
    for path in changed_paths(diff.read_text()):
        assert (sglang_tree(version) / path).read_bytes() == (tree / path).read_bytes()


@pytest.mark.parametrize("folder,rev,version", applying_cases())
def test_patched_files_compile(folder, rev, version, patched_trees, tmp_path):
    tree = patched_trees(folder, rev, version)
    paths = changed_paths((folder / rev["diff"]).read_text())
    assert paths
    for path in paths:
        py_compile.compile(str(tree / path), cfile=str(tmp_path / "x.pyc"), doraise=True)


@pytest.mark.parametrize("folder,rev,version", applying_cases())
def test_diffapply_agrees(folder, rev, version, patched_trees):
    diffapply = pytest.importorskip("fleetpatch.diffapply")
    diff = folder / rev["diff"]
    fds = diffapply.parse_diff(diff.read_text(), str(diff))
    assert sorted(fd.path for fd in fds) == changed_paths(diff.read_text())
    tree = patched_trees(folder, rev, version)
    for fd in fds:
        res = diffapply.apply_file(fd, (sglang_tree(version) / fd.path).read_bytes())
        assert res.state == "applies", res.detail
        assert all(o == 0 for o in res.offsets), res.offsets
        assert res.new == (tree / fd.path).read_bytes()
        again = diffapply.apply_file(fd, res.new)
        assert again.state == "already-applied", again.detail


@pytest.mark.parametrize("name", REFUSED_DIFF_FIXTURES)
def test_refused_diffs_are_refused(name, tmp_path):
    folder = FIXTURES / name
    (rev,) = manifest(folder)["revisions"]
    diff = folder / rev["diff"]
    tree = pristine_copy("0.5.9", tmp_path / "tree")
    if shutil.which("git"):
        assert run(["git", "apply", "--check", "-p1", str(diff)], tree).returncode != 0
    try:
        diffapply = __import__("fleetpatch.diffapply", fromlist=["parse_diff"])
    except ImportError:
        return
    with pytest.raises(diffapply.DiffError):
        diffapply.parse_diff(diff.read_text(), str(diff))


def test_single_path_fixtures_touch_what_they_say():
    only_v2 = FIXTURES / "v2-only-beacon"
    only_v1 = FIXTURES / "v1-only-no-allow"
    both = FIXTURES / "no-marker"
    assert changed_paths((only_v2 / "sglang-0.5.9.r1.diff").read_text()) == [V2]
    assert manifest(only_v2)["allow_single_path"] == "reproduces the motivating failure"
    assert changed_paths((only_v1 / "sglang-0.5.9.r1.diff").read_text()) == [V1]
    assert "allow_single_path" not in manifest(only_v1)
    assert changed_paths((both / "sglang-0.5.9.r1.diff").read_text()) == [V1, V2]
    assert set(manifest(both)["markers"]) == {"EAGLEWorker"}


# ---------------------------------------------------------------------------
# manifest rules through fleetpatch's loader (when it is importable)
# ---------------------------------------------------------------------------

class _ContractProfile:
    """The part of the SGLang engine profile that load_patch uses, as the contract states it
    (used only while fleetpatch.engines.sglang cannot be imported)."""

    kind = "sglang"
    package = "sglang"
    sibling_pairs = [(V1, V2)]

    def paths_of_file(self, path):
        return {V1: ["EAGLEWorker"], V2: ["EAGLEWorkerV2"]}.get(path, [])


def _profile():
    try:
        from fleetpatch.engines.sglang import PROFILE
        return PROFILE
    except ImportError:
        return _ContractProfile()


@pytest.mark.parametrize("name,where,ok", [
    *[(n, "shipped", True) for n in SHIPPED_NAMES],
    ("v2-only-beacon", "fixtures", True),
    ("crash-in-init", "fixtures", True),
    ("multi-rev", "fixtures", True),
    ("both-quiet", "fixtures", True),      # no markers: the probe judges execution (the default)
    ("v2-only-quiet", "fixtures", True),
    ("v1-only-no-allow", "fixtures", False),
    ("no-marker", "fixtures", False),
    *[(n, "fixtures", False) for n in REFUSED_DIFF_FIXTURES],
])
def test_loader_accepts_or_refuses(name, where, ok):
    patchset = pytest.importorskip("fleetpatch.patchset")
    dirs = [SHIPPED if where == "shipped" else FIXTURES]
    if ok:
        patch, _ = patchset.load_patch(name, dirs, _profile())
        assert patch.name == name
    else:
        with pytest.raises(patchset.PatchError) as exc:
            patchset.load_patch(name, dirs, _profile())
        text = str(exc.value)
        if name == "v1-only-no-allow":
            assert "eagle_worker_v2.py" in text
        if name == "no-marker":
            assert "EAGLEWorkerV2" in text


def test_loader_picks_revision_per_version():
    patchset = pytest.importorskip("fleetpatch.patchset")
    for name, where in (("spec-path-beacon", SHIPPED), ("multi-rev", FIXTURES)):
        patch, _ = patchset.load_patch(name, [where], _profile())
        by_version = {v: patch.choose(None, v) for v in ("0.5.8", "0.5.9")}
        assert {v: by_version[v].diff_file.name.split(".r")[0] for v in ("0.5.8", "0.5.9")} == {
            "0.5.8": "sglang-0.5.8", "0.5.9": "sglang-0.5.9"}


# ---------------------------------------------------------------------------
# dynamic-spec-disable: the torch-free decisions in the patched server_args.py
# ---------------------------------------------------------------------------

DSD_FUNCS = ("DYNAMIC_SPEC_DISABLE_LOG_PREFIX", "resolve_speculative_disable_batch_threshold",
             "speculative_disable_skip_decision")


@pytest.fixture(scope="module")
def dsd(patched_trees):
    folder = SHIPPED / "dynamic-spec-disable"
    rev = _rev_for(folder, "0.5.9")
    src = (patched_trees(folder, rev, "0.5.9") / SERVER_ARGS).read_text()
    tree = ast.parse(src)
    body = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name in DSD_FUNCS)
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in DSD_FUNCS for t in n.targets))]
    assert len(body) == len(DSD_FUNCS)
    ns: dict = {}
    code = compile(ast.Module(body=body, type_ignores=[]), SERVER_ARGS, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    return SimpleNamespace(**{k: ns[k] for k in DSD_FUNCS})


def _markers(name):
    out = {}
    for path, m in manifest(SHIPPED / name)["markers"].items():
        if isinstance(m, dict):
            out[path] = (lambda rx: lambda line: re.search(rx, line) is not None)(m["regex"])
        else:
            out[path] = (lambda lit: lambda line: lit in line)(m)
    return out


NON_HYBRID = SimpleNamespace(hybrid_gdn_config=None, mamba2_config=None, hybrid_lightning_config=None)


@pytest.mark.parametrize("worker", ["EAGLEWorker", "EAGLEWorkerV2"])
@pytest.mark.parametrize("threshold,dp,runner,want,warn", [
    (None, False, NON_HYBRID, None, False),
    (None, True, NON_HYBRID, None, False),
    (16, False, NON_HYBRID, 16, False),
    (16, False, None, 16, False),
    (16, True, NON_HYBRID, None, True),
    (16, False, SimpleNamespace(hybrid_gdn_config=object(), mamba2_config=None, hybrid_lightning_config=None),
     None, True),
])
def test_startup_line_always_carries_the_marker(dsd, worker, threshold, dp, runner, want, warn):
    sa = SimpleNamespace(speculative_disable_batch_threshold=threshold, enable_dp_attention=dp)
    got, line, is_warning = dsd.resolve_speculative_disable_batch_threshold(sa, worker, runner)
    assert (got, is_warning) == (want, warn)
    assert line.startswith(f"Dynamic speculation disable loaded in {worker}: threshold=")
    assert f"threshold={want if want is not None else 'off'} " in line
    markers = _markers("dynamic-spec-disable")
    other = "EAGLEWorkerV2" if worker == "EAGLEWorker" else "EAGLEWorker"
    assert markers[worker](line)
    assert not markers[other](line)


def test_startup_line_without_the_field(dsd):
    """A ServerArgs without the new field (never the case inside one revision) reads as off."""
    got, line, warn = dsd.resolve_speculative_disable_batch_threshold(
        SimpleNamespace(enable_dp_attention=False), "EAGLEWorker")
    assert (got, warn) == (None, False) and "threshold=off" in line


@pytest.mark.parametrize("kwargs,want", [
    (dict(threshold=None, batch_size=500, is_decode=True), (False, None)),
    (dict(threshold=8, batch_size=8, is_decode=True), (False, None)),
    (dict(threshold=8, batch_size=9, is_decode=True), (True, None)),
    (dict(threshold=1, batch_size=2, is_decode=True), (True, None)),
    (dict(threshold=8, batch_size=100, is_decode=False), (False, None)),
    (dict(threshold=8, batch_size=1, is_decode=True, has_grammar=True), (False, None)),
])
def test_skip_decision(dsd, kwargs, want):
    assert dsd.speculative_disable_skip_decision(**kwargs) == want


@pytest.mark.parametrize("flag", ["has_grammar", "return_logprob", "return_hidden_states", "has_penalties"])
def test_skip_decision_keeps_unsupported_features_speculative(dsd, flag):
    skip, why = dsd.speculative_disable_skip_decision(threshold=8, batch_size=9, is_decode=True, **{flag: True})
    assert skip is False and why
    # below the threshold there is nothing to explain
    assert dsd.speculative_disable_skip_decision(threshold=8, batch_size=8, is_decode=True, **{flag: True}) == (
        False, None)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.8", "0.5.8.post1"])
def test_both_workers_call_the_decision(patched_trees, version):
    """Both forward_batch_generation implementations consult the decision first,
    and the skip path never replays the target CUDA graph."""
    folder = SHIPPED / "dynamic-spec-disable"
    tree = patched_trees(folder, _rev_for(folder, version), version)
    for path, cls in ((V1, "EAGLEWorker"), (V2, "EAGLEWorkerV2")):
        mod = ast.parse((tree / path).read_text())
        klass = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == cls)
        methods = {n.name: n for n in klass.body if isinstance(n, ast.FunctionDef)}
        fbg = methods["forward_batch_generation"]
        first = next(n for n in fbg.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)))
        assert isinstance(first, ast.If) and "spec_disable_should_skip" in ast.unparse(first.test)
        skip_src = ast.unparse(methods["forward_decode_without_speculation"])
        assert "target_runner.graph_runner = None" in skip_src
        assert "target_runner.graph_runner = graph_runner" in skip_src  # restored in finally
        assert "_draft_extend" in skip_src  # the draft model is kept current
        init_src = ast.unparse(methods["__init__"])
        assert "resolve_speculative_disable_batch_threshold" in init_src


# ---------------------------------------------------------------------------
# the stand-in server: the routed worker's real __init__ logs the marker
# ---------------------------------------------------------------------------

V1_LAUNCH = (["--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
              "--speculative-num-draft-tokens", "8"], {})
V2_LAUNCH = (["--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
              "--speculative-num-draft-tokens", "4"], {"SGLANG_ENABLE_SPEC_V2": "True"})


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("standin")
    install_sglang_standin(d)
    return d


def run_standin(tree: Path, standin_dir: Path, launch, extra=(), timeout=30.0):
    """Start the stand-in on `tree`; return (exit code or None if it became ready, log text).
    A server that becomes ready is stopped with SIGTERM."""
    args, env_extra = launch
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_ENABLE_SPEC_V2" and not k.startswith("FLEETPATCH_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(standin_dir)])
    env["FLEETPATCH_STANDIN_STARTUP_DELAY"] = "0"
    cmd = [sys.executable, "-m", "sglang_standin", "--model-path", "/models/x",
           "--speculative-algorithm", "EAGLE3", *args, *extra, "--port", str(free_port())]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(standin_dir))
    lines = []
    ready = threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if READY in line:
                ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.time() + timeout
    while time.time() < deadline and not ready.is_set() and proc.poll() is None:
        time.sleep(0.02)
    rc = proc.poll()
    if ready.is_set() and rc is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        t.join(5)
        return None, "".join(lines)
    if rc is None:
        proc.kill()
        proc.wait()
        t.join(5)
        pytest.fail(f"stand-in neither ready nor exited in {timeout}s:\n{''.join(lines)}")
    t.join(5)
    return rc, "".join(lines)


def marker_matchers(folder: Path):
    out = {}
    for path, m in manifest(folder)["markers"].items():
        if isinstance(m, dict):
            out[path] = (lambda rx: lambda text: re.search(rx, text) is not None)(m["regex"])
        else:
            out[path] = (lambda lit: lambda text: lit in text)(m)
    return out


STANDIN_CASES = [
    (SHIPPED / "spec-path-beacon", "0.5.9"),
    (SHIPPED / "spec-path-beacon", "0.5.8"),
    (SHIPPED / "dynamic-spec-disable", "0.5.9"),
    (SHIPPED / "dynamic-spec-disable", "0.5.8"),
    (SHIPPED / "dynamic-spec-disable", "0.5.8.post1"),
    (FIXTURES / "multi-rev", "0.5.8"),
    (FIXTURES / "multi-rev", "0.5.9"),
]


def _rev_for(folder: Path, version: str) -> dict:
    return next(r for f, r, v in revisions_of(folder) if v == version)


@pytest.mark.parametrize("folder,version", STANDIN_CASES, ids=lambda x: getattr(x, "name", x))
@pytest.mark.parametrize("path,launch", [("EAGLEWorker", V1_LAUNCH), ("EAGLEWorkerV2", V2_LAUNCH)],
                         ids=["v1", "v2"])
def test_standin_logs_the_marker_of_the_routed_path(folder, version, path, launch, patched_trees, standin_dir):
    tree = patched_trees(folder, _rev_for(folder, version), version)
    rc, log = run_standin(tree, standin_dir, launch)
    assert rc is None, f"stand-in exited {rc}:\n{log}"
    assert "Traceback (most recent call last)" not in log, log
    matchers = marker_matchers(folder)
    other = "EAGLEWorkerV2" if path == "EAGLEWorker" else "EAGLEWorker"
    assert matchers[path](log), f"marker for {path} missing:\n{log}"
    assert not matchers[other](log), f"marker for {other} seen although {path} runs:\n{log}"


def test_standin_beacon_line_content(patched_trees, standin_dir):
    folder = SHIPPED / "spec-path-beacon"
    tree = patched_trees(folder, _rev_for(folder, "0.5.9"), "0.5.9")
    _, log1 = run_standin(tree, standin_dir, V1_LAUNCH)
    assert ("fleetpatch spec-path-beacon: EAGLEWorker (sglang/srt/speculative/eagle_worker.py) "
            "topk=4 overlap=False") in log1
    _, log2 = run_standin(tree, standin_dir, V2_LAUNCH)
    assert ("fleetpatch spec-path-beacon: EAGLEWorkerV2 (sglang/srt/speculative/eagle_worker_v2.py) "
            "topk=1 overlap=True") in log2


def test_standin_motivating_failure(patched_trees, standin_dir):
    """A v2-only patch on a server that runs EAGLEWorker: the server is fine, the marker never shows."""
    folder = FIXTURES / "v2-only-beacon"
    tree = patched_trees(folder, _rev_for(folder, "0.5.9"), "0.5.9")
    match = marker_matchers(folder)["EAGLEWorkerV2"]
    rc, log = run_standin(tree, standin_dir, V1_LAUNCH)
    assert rc is None and READY in log
    assert "Overlap scheduler is disabled when spec v2 is off" in log
    assert not match(log)
    rc, log = run_standin(tree, standin_dir, V2_LAUNCH)
    assert rc is None and match(log)


@pytest.mark.parametrize("path,launch", [("EAGLEWorker", V1_LAUNCH), ("EAGLEWorkerV2", V2_LAUNCH)],
                         ids=["v1", "v2"])
def test_standin_crash_after_marker(path, launch, patched_trees, standin_dir):
    folder = FIXTURES / "crash-in-init"
    tree = patched_trees(folder, _rev_for(folder, "0.5.9"), "0.5.9")
    rc, log = run_standin(tree, standin_dir, launch)
    assert rc not in (None, 0), log
    assert READY not in log
    assert marker_matchers(folder)[path](log)
    assert "fleetpatch test: crash in __init__" in log
    assert "Traceback (most recent call last)" in log


@pytest.mark.parametrize("path,launch", [("EAGLEWorker", V1_LAUNCH), ("EAGLEWorkerV2", V2_LAUNCH)],
                         ids=["v1", "v2"])
def test_standin_dynamic_spec_disable_flag(path, launch, patched_trees, standin_dir):
    folder = SHIPPED / "dynamic-spec-disable"
    tree = patched_trees(folder, _rev_for(folder, "0.5.9"), "0.5.9")
    rc, log = run_standin(tree, standin_dir, launch, ["--speculative-disable-batch-threshold", "16"])
    assert rc is None, log
    assert marker_matchers(folder)[path](log)
    assert "speculative_disable_batch_threshold=16" in log  # the server_args dump
    line = next(l for l in log.splitlines() if f"Dynamic speculation disable loaded in {path}:" in l)
    # threshold=16, unless the stand-in's simulated ModelRunner looks hybrid to the probe
    assert "threshold=16 (" in line or "requested 16, but the target model is a hybrid" in line, line
    # without the flag the marker is still there, saying off
    rc, log = run_standin(tree, standin_dir, launch)
    assert rc is None and f"Dynamic speculation disable loaded in {path}: threshold=off (" in log


@pytest.mark.parametrize("extra,message", [
    (["--speculative-disable-batch-threshold", "0"], "must be >= 1"),
    (["--speculative-disable-batch-threshold", "-3"], "must be >= 1"),
    (["--speculative-disable-batch-threshold", "many"], "invalid int value"),
])
def test_standin_dynamic_spec_disable_validation(extra, message, patched_trees, standin_dir):
    folder = SHIPPED / "dynamic-spec-disable"
    tree = patched_trees(folder, _rev_for(folder, "0.5.9"), "0.5.9")
    rc, log = run_standin(tree, standin_dir, V1_LAUNCH, extra)
    assert rc not in (None, 0) and message in log, log
    assert READY not in log


def test_standin_dynamic_spec_disable_refuses_ngram(patched_trees, standin_dir):
    folder = SHIPPED / "dynamic-spec-disable"
    tree = patched_trees(folder, _rev_for(folder, "0.5.9"), "0.5.9")
    launch = ([a for a in V1_LAUNCH[0]], {})
    rc, log = run_standin(tree, standin_dir, launch,
                          ["--speculative-algorithm", "NGRAM", "--speculative-disable-batch-threshold", "8"])
    assert rc not in (None, 0), log
    assert "requires --speculative-algorithm EAGLE, EAGLE3 or NEXTN, not NGRAM" in log


def test_standin_unpatched_flag_is_unknown(standin_dir, tmp_path):
    """Without the patch the flag does not exist (the stand-in uses the tree's real argparse)."""
    tree = pristine_copy("0.5.9", tmp_path / "tree")
    rc, log = run_standin(tree, standin_dir, V1_LAUNCH, ["--speculative-disable-batch-threshold", "8"])
    assert rc == 2 and "unrecognized arguments" in log, log
