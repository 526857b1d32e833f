"""The SGLang engine profile, checked against the real PyPI wheels.

Every string, file, class, base class, line number and routing rule the profile
stores is read back out of the wheel of each version it claims to know.  The
routing test goes further: it *runs* the wheel's own
`ServerArgs._handle_speculative_decoding` (0.5.7 - 0.5.12) or
`arg_groups/speculative_hook.handle_speculative_decoding` (0.5.13+) and
`SpeculativeAlgorithm.create_worker` on a stub ServerArgs, over a grid of launch
settings, and compares with `predict()` and with what `log_facts()` reads from
the warnings that real code printed.

Wheels come from `fleetpatch_demo.wheels.wheel_path` (cached under
~/.cache/fleetpatch/wheels, downloaded with pip otherwise); a version whose
wheel cannot be had is skipped, never faked.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.abc
import importlib.machinery
import itertools
import logging
import os
import sys
import textwrap
import types
import warnings
import zipfile
from functools import lru_cache
from types import SimpleNamespace

import pytest
from packaging.version import Version

from fleetpatch import engines
from fleetpatch_demo.wheels import sglang_tree, wheel_path
from fleetpatch.engines import sglang as sg
from fleetpatch.engines.sglang import PROFILE, LaunchConfig, Prediction

ALL_VERSIONS = [v for r in sg.RANGES for v in r.verified]
CORE_VERSIONS = ["0.5.7", "0.5.8", "0.5.9", "0.5.10", "0.5.15"]   # the ones the brief caches
# The wheel's own routing code is replayed with every other sglang module faked. From 0.5.19 the
# hook resolves the algorithm's alias (NEXTN) and reads the model's config through views of the
# arguments that the fakes do not reproduce yet: those releases are checked by the stand-in only.
REPLAYED_VERSIONS = [v for v in ALL_VERSIONS if Version(v) < Version("0.5.19")]


def one_process_per_wheel(versions):
    """Each version's tests in one xdist process (with `--dist loadgroup`), so that a wheel's big
    files are parsed once, not once in every process that its tests were spread over."""
    return [pytest.param(v, marks=pytest.mark.xdist_group(f"sglang-{v}")) for v in versions]


# ----------------------------------------------------------------- wheel access
@lru_cache(maxsize=None)
def _wheel(version: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel_path(version))
    except Exception as e:  # no network and no cache: skip, do not fake
        pytest.skip(f"sglang {version} wheel not available: {e}")


def names(version):
    return set(_wheel(version).namelist())


@lru_cache(maxsize=None)
def text(version, path):
    return _wheel(version).read(path).decode()


@lru_cache(maxsize=None)
def tree_of(version, path):
    return ast.parse(text(version, path))


def _render(node) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)


@lru_cache(maxsize=None)
def strings(version, path):
    """(line, text) of every string literal in a wheel file; implicit concatenation
    is one literal; f-string holes are NUL."""
    out = []
    for n in ast.walk(tree_of(version, path)):
        if isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str)):
            out.append((n.lineno, _render(n)))
    return out


def class_defs(version, path):
    return {n.name: n for n in ast.walk(tree_of(version, path)) if isinstance(n, ast.ClassDef)}


@pytest.fixture(scope="module", autouse=True)
def _drop_the_parsed_wheels():
    """The parsed files of every wheel are millions of objects: kept past this module, every
    full collection of the test process walks them (pytest's last ones took 8 s)."""
    yield
    for cached in (strings, tree_of, text):
        cached.cache_clear()


# ----------------------------------------------------------------- basics
def test_get_returns_the_profile_and_rejects_unknown_kinds():
    assert engines.get("sglang") is PROFILE
    assert engines.get("SGLang") is PROFILE
    with pytest.raises(engines.UnknownEngine) as e:
        engines.get("tgi")
    assert "tgi" in str(e.value) and "sglang, vllm" in str(e.value)
    from fleetpatch.errors import UsageError
    assert isinstance(e.value, UsageError)


def test_interface_attributes():
    assert PROFILE.kind == "sglang" and PROFILE.package == "sglang"
    assert PROFILE.ready_line == "The server is fired up and ready to roll!"
    assert ("sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py") in PROFILE.sibling_pairs
    assert {tuple(sorted(p)) for p in PROFILE.sibling_pairs} == {
        ("sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py"),
        ("sglang/srt/speculative/multi_layer_eagle_worker.py", "sglang/srt/speculative/multi_layer_eagle_worker_v2.py"),
        ("sglang/srt/speculative/standalone_worker.py", "sglang/srt/speculative/standalone_worker_v2.py")}


def test_paths_of_file_and_file_of_path():
    assert PROFILE.paths_of_file("sglang/srt/speculative/eagle_worker.py") == ["EAGLEWorker"]
    assert PROFILE.paths_of_file("python/sglang/srt/speculative/eagle_worker_v2.py") == ["EAGLEWorkerV2"]
    assert PROFILE.paths_of_file("sglang/srt/speculative/standalone_worker_v2.py") == ["StandaloneWorkerV2"]
    assert PROFILE.paths_of_file("sglang/srt/speculative/ngram_worker.py") == ["NGRAMWorker"]
    for plain in ("sglang/srt/server_args.py", "sglang/srt/speculative/spec_info.py",
                  "sglang/srt/speculative/eagle_utils.py", "sglang/srt/managers/scheduler.py"):
        assert PROFILE.paths_of_file(plain) == []
    assert PROFILE.file_of_path("EAGLEWorker", "0.5.9") == "sglang/srt/speculative/eagle_worker.py"
    assert PROFILE.file_of_path("EAGLEWorker", "0.5.15") is None        # v1 removed
    assert PROFILE.file_of_path("StandaloneWorkerV2", "0.5.7") is None   # no v2 standalone yet
    assert PROFILE.file_of_path("EAGLEWorkerV2", "0.5.23") == "sglang/srt/speculative/eagle_worker_v2.py"
    assert PROFILE.file_of_path("NoSuchWorker", "0.5.9") is None
    for name in ["EAGLEWorker", "EAGLEWorkerV2", "MultiLayerEagleWorker", "MultiLayerEagleWorkerV2",
                 "StandaloneWorker", "StandaloneWorkerV2", "NGRAMWorker"]:
        assert PROFILE.paths_of_file(sg.PATH_FILES[name]) == [name]


@pytest.mark.parametrize("version,known", [
    ("0.5.7", True), ("0.5.9", True), ("0.5.8.post1", True), ("0.5.10", True), ("0.5.11", True),
    ("0.5.13", True), ("0.5.15", True), ("0.5.16", True), ("0.5.23", True), ("0.5.23+cu128", True),
    ("0.5.9.post1", False),   # no such release on PyPI: never guessed from its neighbours
    ("0.5.6", False), ("0.5.24", False), ("0.5.24.dev3", False), ("0.5.23rc1", False),
    ("0.5.11.dev0", False), ("1.0.0", False), ("", False), (None, False), ("garbage", False)])
def test_knows(version, known):
    assert PROFILE.knows(version) is known


@pytest.mark.parametrize("version,status,start", [
    ("0.5.24", "newer", "SGLang 0.5.24 is newer than the profile (0.5.7 \u2013 0.5.23): "),
    ("0.5.6", "older", "SGLang 0.5.6 is older than the profile (0.5.7 \u2013 0.5.23): "),
    ("0.5.24.dev3", "pre-release", "SGLang 0.5.24.dev3 is a pre-release or dev build"),
    (None, "missing", "the host does not say which SGLang it runs"),
    ("", "missing", "the host does not say which SGLang it runs"),
    ("0.5.9.post1", "unreleased", "SGLang 0.5.9.post1 is not a release the profile knows"),
    ("garbage", "invalid", "SGLang version 'garbage' is not a PEP 440 version")])
def test_a_release_the_profile_does_not_know_is_named_never_guessed(version, status, start):
    assert PROFILE.version_status(version) == status
    note = PROFILE.version_note(version)
    assert note.startswith(start), note
    assert note.endswith("the path will be judged by what runs (the probe) and the markers.")
    assert "None" not in note
    assert PROFILE.add_release_command(version).startswith("invoke engine-facts --version ")


def test_a_local_build_tag_is_its_release():
    assert PROFILE.release_of("0.5.23+cu128") == "0.5.23" and PROFILE.version_note("0.5.23+cu128") is None
    assert PROFILE.range_for("0.5.23+cu128") is PROFILE.range_for("0.5.23")
    assert PROFILE.known_versions() == "0.5.7 \u2013 0.5.23"


def test_ranges_do_not_overlap_and_cover_their_verified_versions():
    for v in ALL_VERSIONS:
        assert [r.name for r in sg.RANGES if r.contains(v)] == [PROFILE.range_for(v).name]
        assert v in PROFILE.range_for(v).verified


def test_unknown_version_prediction_says_so():
    for v in ("0.5.24", "0.5.6", "nonsense"):
        p = PROFILE.predict(v, LaunchConfig(["python", "-m", "sglang.launch_server", "--speculative-algorithm",
                                             "EAGLE3"], {}, "inventory"))
        assert p.known_version is False and p.path is None and p.file is None
        assert "not in fleetpatch's engine profile" in p.cause and "not guessed" in p.cause
        assert PROFILE.fetch_files(v) == PROFILE.fetch_files(None)


# ----------------------------------------------------------------- files
@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_fetch_files_exist_in_that_version(version):
    files = PROFILE.fetch_files(version)
    have = names(version)
    for must in ("sglang/srt/server_args.py", "sglang/srt/speculative/eagle_worker_v2.py",
                 "sglang/srt/speculative/spec_info.py"):
        assert must in files
    missing = [f for f in files if f not in have]
    assert not missing, f"{version}: listed but not in the wheel: {missing}"
    # every code-path file the wheel has is fetched
    for name, f in sg.PATH_FILES.items():
        assert (f in have) == (f in files), f"{version}: {f}"
    # and the speculative/server_args ones are in the cached source tree too
    tree = sglang_tree(version) if version in CORE_VERSIONS else None
    if tree is not None:
        for f in files:
            if f.startswith("sglang/srt/speculative/") or f == "sglang/srt/server_args.py":
                assert (tree / f).is_file(), f


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_v1_worker_exists_exactly_until_0_5_12(version):
    has_v1 = "sglang/srt/speculative/eagle_worker.py" in names(version)
    from packaging.version import Version
    assert has_v1 == (Version(version) < Version("0.5.13"))
    assert ("sglang/srt/speculative/eagle_worker.py" in PROFILE.fetch_files(version)) == has_v1
    pairs = PROFILE.siblings(version)
    assert (("sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py") in pairs) == has_v1


def test_0_5_15_has_no_v1_worker_in_tree():
    tree = sglang_tree("0.5.15")
    assert not (tree / "sglang/srt/speculative/eagle_worker.py").exists()
    assert (tree / "sglang/srt/speculative/eagle_worker_v2.py").exists()
    assert PROFILE.file_of_path("EAGLEWorker", "0.5.15") is None
    assert "EAGLEWorker" not in PROFILE.range_for("0.5.15").path_names


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_each_code_path_class_lives_in_its_file(version):
    rng = PROFILE.range_for(version)
    for name in rng.path_names:
        assert name in class_defs(version, sg.PATH_FILES[name]), f"{version}: class {name} not in its file"


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_recorded_inheritance_is_complete(version):
    rng = PROFILE.range_for(version)
    found = set()
    for name in rng.path_names:
        node = class_defs(version, sg.PATH_FILES[name])[name]
        for b in node.bases:
            base = b.id if isinstance(b, ast.Name) else getattr(b, "attr", None)
            if base in sg.PATH_FILES:
                found.add((name, base))
    assert found == set(rng.bases)
    if ("StandaloneWorker", "EAGLEWorker") in found:
        assert PROFILE.ancestors("StandaloneWorker", version) == ["EAGLEWorker"]


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_workers_are_the_classes_create_worker_imports(version):
    """Every worker class spec_info.py (and, in 0.5.7, scheduler.py) imports is in the
    range's worker table, and nothing else is."""
    rng = PROFILE.range_for(version)
    imported = set()
    files = [sg.SPEC_INFO] + ([sg.SCHEDULER] if version == "0.5.7" else [])
    for f in files:
        for n in ast.walk(tree_of(version, f)):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.speculative."):
                for a in n.names:
                    if a.name in sg.PATH_FILES:
                        imported.add(a.name)
                        assert n.module.replace(".", "/") + ".py" == sg.PATH_FILES[a.name]
    table = {w for pair in rng.worker_map.values() for w in pair if w}
    assert imported == table


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_builtin_algorithms_and_cli_choices(version):
    rng = PROFILE.range_for(version)
    info = tree_of(version, sg.SPEC_INFO)
    members = set()
    for n in ast.walk(info):
        if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm":
            for s in n.body:
                if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) \
                        and not s.targets[0].id.startswith("_"):
                    members.add(s.targets[0].id)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("register_speculative_algorithm",):
            members.add(n.args[0].value)
    members.discard("NONE")
    assert members == set(rng.algorithms)
    choices = None
    for n in ast.walk(tree_of(version, sg.SERVER_ARGS)):
        if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant) \
                and n.args[0].value == "--speculative-algorithm":
            for kw in n.keywords:
                if kw.arg == "choices":
                    choices = tuple(e.value for e in kw.value.elts)
    assert choices == rng.algorithm_choices


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_env_flag_default_and_parsing(version):
    rng = PROFILE.range_for(version)
    default = "missing"
    env_bool = None
    for n in ast.walk(tree_of(version, sg.ENVIRON)):
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "SGLANG_ENABLE_SPEC_V2":
            default = n.value.args[0].value
        if isinstance(n, ast.ClassDef) and n.name == "EnvBool":
            env_bool = n
    assert default == ("missing" if rng.env_default is None else rng.env_default)
    lists = [tuple(e.value for e in c.comparators[0].elts) for c in ast.walk(env_bool)
             if isinstance(c, ast.Compare) and isinstance(c.comparators[0], ast.List)]
    assert lists == [sg.ENV_TRUE, sg.ENV_FALSE]


def _declared_fields(version):
    """ServerArgs' fields: the dataclass's, or (0.5.20+, msgspec) the arg_groups field structs'."""
    if "ServerArgs" in class_defs(version, sg.SERVER_ARGS):
        cls = class_defs(version, sg.SERVER_ARGS)["ServerArgs"]
        found = {s.target.id: s for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        if "speculative_algorithm" in found:
            return found, cls
    found = {}
    for p in sorted(names(version)):
        if p.startswith("sglang/srt/arg_groups/fields/") and p.endswith(".py"):
            for n in ast.walk(tree_of(version, p)):
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    found.setdefault(n.target.id, n)
    return found, None


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_dump_fields_are_dataclass_fields_in_repr(version):
    fields, cls = _declared_fields(version)
    shape = PROFILE.range_for(version).dump_shape
    assert shape == ("ServerArgs(...)" if Version(version) < Version("0.5.19") else "{...}")
    if cls is None:   # msgspec structs, dumped as resolved_dict(): every field by name
        for f in ("speculative_algorithm", "enable_multi_layer_eagle", "disable_overlap_schedule"):
            assert f in fields, f
        return
    for f in ("speculative_algorithm", "enable_multi_layer_eagle", "disable_overlap_schedule", "speculative_eagle_topk"):
        assert f in fields, f
        val = fields[f].value
        if isinstance(val, ast.Call):  # dataclasses.field(...)
            assert not any(k.arg == "repr" for k in val.keywords)
    assert not any(isinstance(s, ast.FunctionDef) and s.name == "__repr__" for s in cls.body)


# ----------------------------------------------------------------- signatures
def _all_signatures(version):
    rng = PROFILE.range_for(version)
    return list(rng.signatures) + list(rng.failures) + [sg.DUMP, sg.READY]


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_every_signature_is_in_that_wheel_at_the_recorded_line(version):
    checked = 0
    for sig in _all_signatures(version):
        if sig.source.startswith("<"):
            continue
        line = sig.line_in(version)
        if line is None:
            # e.g. "Rank N scheduler is dead." is only up to 0.5.9 in its range
            assert sig.key in ("SCHEDULER_DEAD", "SCHEDULER_DIED"), (version, sig.key)
            assert not any(sig.literal in s for _, s in strings(version, sig.source))
            continue
        hits = [ln for ln, s in strings(version, sig.source) if sig.literal in s]
        assert line in hits, f"{version} {sig.key}: {sig.literal!r} at {hits}, recorded {line}"
        if sig.regex is None and sig.probe is None:
            assert any(sig.text in s for ln, s in strings(version, sig.source) if ln == line)
        checked += 1
    assert checked >= 8


def routing_signature(version, key):
    """The routing line `key` that log_facts looks for in a `version` log (None: it looks for none)."""
    return next((s for s in PROFILE.range_for(version).signatures if s.key == key), None)


def test_signatures_named_in_the_brief():
    for v in ("0.5.7", "0.5.9", "0.5.10"):
        assert routing_signature(v, "W1").text.startswith("Overlap scheduler is disabled when spec v2 is off")
        assert routing_signature(v, "W2").text.startswith("Spec v2 is enabled for eagle/eagle3")
        assert routing_signature(v, "W3").text.startswith("The overlap scheduler and mixed chunked prefill")
    assert routing_signature("0.5.9", "W1").line_in("0.5.9") == 2386
    assert routing_signature("0.5.9", "W2").line_in("0.5.9") == 2374
    assert routing_signature("0.5.15", "W2") is None        # 0.5.14+ prints nothing when overlap is on
    assert sg.DUMP.text == sg.DUMP_PREFIX == "server_args=ServerArgs("
    # and the warning alone is what log_facts reads the overlap setting from
    assert PROFILE.log_facts("0.5.9", [routing_signature("0.5.9", "W1").text]).values == {"overlap": False}


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_no_routing_warning_of_that_version_is_missing(version):
    """Every warning about spec v1/v2 or the overlap scheduler in the routing code of
    a version is one the profile recognises (or deliberately ignores)."""
    rng = PROFILE.range_for(version)
    src = sg.SPEC_HOOK if sg.SPEC_HOOK in names(version) else sg.SERVER_ARGS
    known = [s.literal for s in rng.signatures + rng.failures]
    ignored = ("radix cache", "Pipeline parallelism is incompatible with overlap schedule",
               "mamba", "sparse head", "decode offload", "Spec v2 is enabled for EAGLE speculative decoding.",
               "help", "Disable the overlap", "dllm", "diffusion", "does not support overlap",
               "PD-Multiplexing")   # an assertion: a failed start, caught as a Traceback
    w1_reasons = ("spec v2 currently only supports topk = 1", "overlap schedule is disabled")  # W1's %s, 0.5.11/12
    for _, s in strings(version, src):
        low = s.lower()
        if not any(k in low for k in ("spec v1", "spec v2", "overlap schedul")):
            continue
        if any(i.lower() in low for i in ignored) or len(s) > 400 or s in w1_reasons:
            continue
        if not any(k in s for k in known):
            pytest.fail(f"{version}: {src} has a routing message the profile does not know: {s!r}")


@pytest.mark.parametrize("version", one_process_per_wheel(ALL_VERSIONS))
def test_pp_error_is_the_wheels_assertion(version):
    rng = PROFILE.range_for(version)
    files = [sg.SERVER_ARGS] + sorted(p for p in names(version) if p.startswith("sglang/srt/arg_groups/")
                                      and p.endswith(".py") and p.count("/") == 3)
    msgs = [_render(n.msg) for f in files for n in ast.walk(tree_of(version, f))
            if isinstance(n, ast.Assert) and n.msg is not None
            and _render(n.msg).startswith("Pipeline parallelism is not compatible")]
    if rng.pp_error is None:   # 0.5.21+: only overlap scheduling is refused; EAGLE may run under PP
        assert msgs == ["Pipeline parallelism is not compatible with overlap schedule"]
    elif Version(version) == Version("0.5.20"):   # the NPU branch's, then everyone else's
        assert msgs == ["Pipeline parallelism is not compatible with overlap schedule", rng.pp_error]
    else:
        assert msgs == [rng.pp_error]


# ----------------------------------------------------------------- predict
def L(*flags, env=None, argv0="/opt/sglang venv/bin/python", module="sglang.launch_server"):
    argv = [argv0, "-m", module, "--model-path", "/models/kimi", *flags]
    return LaunchConfig(argv=argv, env=dict(env or {}), source="process")


def P(version, *flags, env=None, **kw) -> Prediction:
    return PROFILE.predict(version, L(*flags, env=env, **kw))


def test_motivating_configuration():
    p = P("0.5.9", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4")
    assert (p.path, p.file, p.starts, p.known_version) == (
        "EAGLEWorker", "sglang/srt/speculative/eagle_worker.py", True, True)
    assert p.cause == "SGLANG_ENABLE_SPEC_V2 is not set (and --speculative-eagle-topk 4 needs the v1 path)"
    assert p.overlap is False and p.algorithm == "EAGLE3" and p.version == "0.5.9"


def test_spec_v2_with_topk_4_does_not_start():
    for v in ("0.5.7", "0.5.9", "0.5.10"):
        p = P(v, "--speculative-algorithm=EAGLE3", "--speculative-eagle-topk=4", env={"SGLANG_ENABLE_SPEC_V2": "True"})
        assert p.starts is False and p.path is None
        assert p.error == "Spec v2 currently only supports topk = 1 for speculative decoding."
        assert p.cause == "--speculative-eagle-topk 4 cannot run on spec v2: the server would not start"
    # 0.5.11+ falls back to v1 instead, 0.5.13+ runs topk 4 on the V2 worker
    p = P("0.5.11", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4",
          env={"SGLANG_ENABLE_SPEC_V2": "True"})
    assert p.starts and p.path == "EAGLEWorker" and "fall back to spec v1" in p.cause
    p = P("0.5.15", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4")
    assert p.starts and p.path == "EAGLEWorkerV2"


@pytest.mark.parametrize("version,flags,env,path,cause", [
    ("0.5.9", ["--speculative-algorithm", "EAGLE"], {"SGLANG_ENABLE_SPEC_V2": "True"}, "EAGLEWorkerV2",
     "SGLANG_ENABLE_SPEC_V2=True: spec v2 with overlap scheduling"),
    ("0.5.9", ["--speculative-algorithm", "EAGLE", "--disable-overlap-schedule"], {"SGLANG_ENABLE_SPEC_V2": "1"},
     "EAGLEWorkerV2", "SGLANG_ENABLE_SPEC_V2=1: spec v2 with overlap scheduling (spec v2 overrides "
     "--disable-overlap-schedule)"),
    ("0.5.9", ["--speculative-algorithm", "EAGLE"], {"SGLANG_ENABLE_SPEC_V2": "maybe"}, "EAGLEWorker",
     "SGLANG_ENABLE_SPEC_V2='maybe' is not a boolean (sglang reads it as its default, False): spec v1, the "
     "overlap scheduler is disabled"),
    ("0.5.9", ["--speculative-algorithm", "NEXTN"], {"SGLANG_ENABLE_SPEC_V2": "yes"}, "EAGLEWorkerV2", None),
    ("0.5.9", ["--speculative-algorithm", "STANDALONE"], {"SGLANG_ENABLE_SPEC_V2": "True"}, "StandaloneWorkerV2", None),
    ("0.5.7", ["--speculative-algorithm", "STANDALONE"], {"SGLANG_ENABLE_SPEC_V2": "True"}, "StandaloneWorker",
     "sglang 0.5.7 has no spec v2 for STANDALONE: it runs the v1 worker even with SGLANG_ENABLE_SPEC_V2=True"),
    ("0.5.7", ["--speculative-algorithm", "EAGLE", "--enable-multi-layer-eagle"], {"SGLANG_ENABLE_SPEC_V2": "y"},
     "MultiLayerEagleWorkerV2", None),
    ("0.5.10", ["--speculative-algorithm", "EAGLE3", "--enable-multi-layer-eagle"], {}, "MultiLayerEagleWorker", None),
    ("0.5.10", ["--speculative-algorithm", "NGRAM"], {"SGLANG_ENABLE_SPEC_V2": "True"}, "NGRAMWorker", None),
    ("0.5.11", ["--speculative-algorithm", "EAGLE"], {}, "EAGLEWorkerV2",
     "spec v2 is the default in sglang 0.5.11 (SGLANG_ENABLE_SPEC_V2 is not set): overlap scheduling"),
    ("0.5.12", ["--speculative-algorithm", "eagle3"], {"SGLANG_ENABLE_SPEC_V2": "0"}, "EAGLEWorker",
     "SGLANG_ENABLE_SPEC_V2=0 turns spec v2 off: spec v1, the overlap scheduler is disabled"),
    ("0.5.12", ["--speculative-algorithm", "EAGLE3", "--disable-overlap-schedule"], {}, "EAGLEWorker",
     "--disable-overlap-schedule selects spec v1"),
    ("0.5.12", ["--speculative-algorithm", "EAGLE"], {"SGLANG_ENABLE_SPEC_V2": "maybe"}, "EAGLEWorkerV2", None),
    ("0.5.13", ["--speculative-algorithm", "EAGLE"], {"SGLANG_ENABLE_SPEC_V2": "false"}, "EAGLEWorkerV2",
     "sglang 0.5.13 has only the spec v2 workers; SGLANG_ENABLE_SPEC_V2=false selects non-overlap (synchronous) "
     "scheduling"),
    ("0.5.15", ["--speculative-algorithm", "EAGLE3"], {"SGLANG_ENABLE_SPEC_V2": "False"}, "EAGLEWorkerV2",
     "sglang 0.5.15 has only the spec v2 workers (SGLANG_ENABLE_SPEC_V2 is ignored: it was removed in 0.5.14), "
     "with overlap scheduling"),
    ("0.5.15", ["--speculative-algorithm", "STANDALONE"], {}, "StandaloneWorkerV2", None),
    ("0.5.15", ["--speculative-algorithm", "NEXTN", "--enable-multi-layer-eagle"], {}, "MultiLayerEagleWorkerV2", None),
])
def test_routing_table(version, flags, env, path, cause):
    p = P(version, *flags, env=env)
    assert p.starts and p.known_version
    assert p.path == path
    assert p.file == sg.PATH_FILES[path]
    if cause is not None:
        assert p.cause == cause


def test_no_speculative_algorithm_means_no_path():
    for v in ("0.5.7", "0.5.9", "0.5.15"):
        p = P(v, "--speculative-eagle-topk", "4", env={"SGLANG_ENABLE_SPEC_V2": "True"})
        assert p.path is None and p.starts and p.known_version
        assert "--speculative-algorithm is not set" in p.cause


def test_pipeline_parallelism_does_not_start():
    p = P("0.5.9", "--speculative-algorithm", "EAGLE", "--pp-size", "2")
    assert not p.starts and p.error == sg.PP_ERROR_OLD and "--pp-size 2" in p.cause
    p = P("0.5.15", "--speculative-algorithm", "EAGLE", "--pipeline-parallel-size=2")
    assert not p.starts and p.error == sg.PP_ERROR_NEW
    assert P("0.5.9", "--pp-size", "2").starts  # no speculative decoding: fine


def test_invalid_command_lines():
    p = P("0.5.9", "--speculative-algorithm", "eagle")           # argparse choices are exact before 0.5.12
    assert not p.starts and "invalid choice: 'eagle'" in p.error
    assert P("0.5.12", "--speculative-algorithm", "eagle").path == "EAGLEWorkerV2"
    p = P("0.5.9", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "four")
    assert not p.starts and "invalid int value" in p.error
    p = P("0.5.12", "--speculative-algorithm", "MY_PLUGIN")
    assert p.starts and p.path is None and "plugin" in p.cause


def test_argv_forms():
    flags = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"]
    env = {"SGLANG_ENABLE_SPEC_V2": "True"}
    for argv0, module in [("/opt/my venv/bin/python3.11", "sglang.launch_server"),
                          ("/usr/bin/python3", "sglang_standin"), ("python", "sglang.launch_server")]:
        assert P("0.5.9", *flags, env=env, argv0=argv0, module=module).path == "EAGLEWorkerV2"
    script = LaunchConfig(["/srv/run server.py", "--speculative-algorithm=EAGLE"], env, "inventory")
    assert PROFILE.predict("0.5.9", script).path == "EAGLEWorkerV2"
    wrapped = LaunchConfig(["env", "SGLANG_ENABLE_SPEC_V2=True", "python", "-m", "sglang.launch_server",
                            "--speculative-algorithm", "EAGLE"], {}, "inventory")
    assert PROFILE.predict("0.5.9", wrapped).path == "EAGLEWorkerV2"
    shell = LaunchConfig(["/bin/sh", "-c", "exec python -m sglang.launch_server --speculative-algorithm EAGLE3"],
                         {}, "inventory")
    assert PROFILE.predict("0.5.9", shell).path == "EAGLEWorker"
    last_wins = P("0.5.9", "--speculative-algorithm", "NGRAM", "--speculative-algorithm", "EAGLE", env=env)
    assert last_wins.path == "EAGLEWorkerV2"
    cfg = P("0.5.10", "--config", "/etc/sglang.yaml", "--speculative-algorithm", "EAGLE")
    assert any("--config" in n for n in cfg.notes)


def log_path(version, lines, first_line_no=1, fill=None):
    """The path the log window shows, as evidence.judge combines it: the log's facts
    over `fill` (the launch's); None when the log states nothing or the path is open."""
    facts = PROFILE.log_facts(version, lines, first_line_no)
    if not facts.values:
        return None
    res = PROFILE.resolve(version, {**(fill or {}), **facts.values})
    return res.path if res.determined else None


def server_info_path(version, info):
    facts = PROFILE.server_info_facts(version, info)
    if facts is None:
        return None, None
    res = PROFILE.resolve(version, facts.values)
    return (res.path if res.determined else None), next(iter(facts.evidence.values()))


def test_server_info_facts_resolve_to_the_worker():
    info = {"speculative_algorithm": "EAGLE3", "disable_overlap_schedule": True, "enable_multi_layer_eagle": False,
            "version": "0.5.9"}
    path, ev = server_info_path("0.5.9", info)
    assert path == "EAGLEWorker" and ev.source == "server_info" and "disable_overlap_schedule=True" in ev.text
    assert server_info_path("0.5.9", {**info, "disable_overlap_schedule": False})[0] == "EAGLEWorkerV2"
    assert server_info_path("0.5.15", {**info, "disable_overlap_schedule": True})[0] == "EAGLEWorkerV2"
    assert server_info_path("0.5.9", {**info, "speculative_algorithm": None})[0] is None
    assert server_info_path("0.5.24", info)[0] is None
    assert server_info_path("0.5.23", {**info, "disable_overlap_schedule": True})[0] == "EAGLEWorkerV2"
    assert server_info_path("0.5.9", {"version": "0.5.9"}) == (None, None)


# ----------------------------------------------------------------- the wheel's own routing code
class _FakeModule(types.ModuleType):
    """`from <module> import Name` gives a class that remembers the module it came from."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__module__": self.__name__, "__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


class _FakeFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any other sglang module (0.5.16+ spec_info imports a dozen: ragged_verify, runtime_context,
    the DFlash/DSpark/Uno workers...) is a _FakeModule: the routing code only names their classes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith(("torch.", "sglang.")):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _FakeModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        return None


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))


class StubArgs:
    """Just enough of ServerArgs for the speculative-decoding handlers (model: Qwen2)."""

    def __init__(self, algorithm, topk, disable_overlap, multi_layer):
        self.__dict__.update(dict(
            speculative_algorithm=algorithm, speculative_eagle_topk=topk,
            speculative_num_steps=None if topk is None else 3,
            speculative_num_draft_tokens=None if topk is None else (4 if topk == 1 else 8),
            disable_overlap_schedule=disable_overlap, enable_multi_layer_eagle=multi_layer,
            enable_dp_attention=False, max_running_requests=None, enable_mixed_chunk=False,
            moe_runner_backend="auto", speculative_moe_runner_backend=None, attention_backend="fa3",
            decode_attention_backend=None, prefill_attention_backend=None, page_size=1, device="cuda",
            speculative_ngram_max_bfs_breadth=10, speculative_ngram_max_match_window_size=12,
            speculative_ngram_external_corpus_path=None, json_model_override_args="{}", trust_remote_code=False,
            model_path="/models/m", revision=None, speculative_draft_model_path=None,
            speculative_draft_model_revision=None, speculative_skip_dp_mlp_sync=False, speculative_adaptive=False,
            speculative_draft_window_size=None, decrypted_draft_config_file=None,
            speculative_use_rejection_sampling=False, speculative_accept_threshold_single=1.0,
            speculative_accept_threshold_acc=1.0, enable_deterministic_inference=False,
            speculative_dflash_block_size=None, speculative_dflash_draft_window_size=None, pp_size=1))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def get_model_config(self):
        return SimpleNamespace(hf_config=SimpleNamespace(architectures=["Qwen2ForCausalLM"]))


class RealRouting:
    """Loads the wheel's environ.py, spec_registry.py, spec_info.py and
    speculative_hook.py (real code) plus ServerArgs._handle_speculative_decoding,
    with every other sglang module faked (worker modules hand out marker classes)."""

    def __init__(self, version):
        self.version = version
        self.zf = _wheel(version)
        self.names = set(self.zf.namelist())
        self.code = {}
        for path in (sg.ENVIRON, sg.SPEC_REGISTRY, sg.SPEC_INFO, sg.SPEC_HOOK):
            if path in self.names:
                self.code[path] = compile(text(version, path), path, "exec")
        future = ast.parse("from __future__ import annotations").body
        src = text(version, sg.SERVER_ARGS)
        self.module_funcs = []
        self.method = None
        for n in tree_of(version, sg.SERVER_ARGS).body:
            if isinstance(n, ast.FunctionDef) and n.name in ("auto_choose_speculative_params",
                                                             "_resolve_speculative_algorithm_alias"):
                self.module_funcs.append(compile(ast.Module(future + [n], []), sg.SERVER_ARGS, "exec"))
            if isinstance(n, ast.ClassDef) and n.name == "ServerArgs":
                for f in n.body:
                    if isinstance(f, ast.FunctionDef) and f.name == "_handle_speculative_decoding":
                        body = "from __future__ import annotations\n" + textwrap.dedent(ast.get_source_segment(src, f))
                        self.method = compile(body, sg.SERVER_ARGS, "exec")

    def _load(self, name, path=None):
        if path is None:
            mod = _FakeModule(name)
        else:
            mod = types.ModuleType(name)
            mod.__file__ = path
        sys.modules[name] = mod
        if path is not None:
            exec(self.code[path], mod.__dict__)
        return mod

    @contextlib.contextmanager
    def installed(self):
        saved = {k: sys.modules.pop(k) for k in list(sys.modules)
                 if k in ("sglang", "torch") or k.startswith("sglang.")}
        finder = _FakeFinder()
        sys.meta_path.insert(0, finder)
        try:
            for pkg in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe",
                        "sglang.srt.speculative", "sglang.srt.arg_groups", "sglang.srt.debug_utils",
                        "sglang.srt.managers", "sglang.srt.utils"):
                self._load(pkg).__path__ = []
            for fake in ("torch", "sglang.srt.debug_utils.cuda_coredump", "sglang.srt.managers.schedule_batch",
                         "sglang.srt.managers.overlap_utils", "sglang.srt.utils.hf_transformers_utils"):
                self._load(fake)
            self._load("sglang.srt.layers.moe.utils").MoeRunnerBackend = \
                lambda v: SimpleNamespace(is_flashinfer_trtllm=lambda: False)
            ov = self._load("sglang.srt.arg_groups.overrides")
            ov.resolved_view = lambda sa: sa
            ov.attention_backends_of = lambda c: (c.prefill_attention_backend or c.attention_backend,
                                                  c.decode_attention_backend or c.attention_backend)
            ov.run_post_process_pass = lambda sa, fn: None
            # 0.5.20+: the hook reads and writes the arguments through views of them; here, the arguments
            ov.resolving_view = ov.model_config_of = lambda sa, *a, **k: sa
            ov.declare_resolution = ov.record_foreign_defaults = lambda *a, **k: None
            platform = SimpleNamespace(is_xpu=False, is_hip=False, is_out_of_tree=lambda: False,
                                       supports_speculative_algorithm=lambda algorithm: True)
            self._load("sglang.srt.platforms").current_platform = platform
            rc = self._load("sglang.srt.runtime_context")
            rc.get_platform = lambda: platform
            rc.attn_dp_enabled_of = lambda sa: sa.enable_dp_attention
            ov._speculative_moe_runner_default = None
            environ = self._load("sglang.srt.environ", sg.ENVIRON)
            for p in sorted(self.names):
                if p.startswith(sg.SPEC) and p.count("/") == 3 and "worker" in p and p.endswith(".py"):
                    self._load(p[:-3].replace("/", "."))
            if sg.SPEC_REGISTRY in self.code:
                self._load("sglang.srt.speculative.spec_registry", sg.SPEC_REGISTRY)
            self.spec_info = self._load("sglang.srt.speculative.spec_info", sg.SPEC_INFO)
            sa_mod = self._load("sglang.srt.server_args")
            ns = {"logger": logging.getLogger("sglang.srt.server_args"), "json": __import__("json"),
                  "envs": getattr(environ, "envs", None)}
            for c in self.module_funcs:
                exec(c, ns)
            for k in ("auto_choose_speculative_params", "_resolve_speculative_algorithm_alias"):
                if k in ns:
                    setattr(sa_mod, k, ns[k])
            if sg.SPEC_HOOK in self.code:
                self.handle = self._load("sglang.srt.arg_groups.speculative_hook", sg.SPEC_HOOK).handle_speculative_decoding
            else:
                exec(self.method, ns)
                self.handle = ns["_handle_speculative_decoding"]
            yield self
        finally:
            sys.meta_path.remove(finder)
            for k in [k for k in sys.modules if k in ("sglang", "torch") or k.startswith(("sglang.", "torch."))]:
                del sys.modules[k]
            sys.modules.update(saved)

    def run(self, algorithm, topk=None, env=None, disable_overlap=False, multi_layer=False):
        old = os.environ.pop(sg.ENV_SPEC_V2, None)
        cap = _Capture()
        root = logging.getLogger()
        level = root.level
        root.addHandler(cap)
        root.setLevel(logging.DEBUG)
        try:
            if env is not None:
                os.environ[sg.ENV_SPEC_V2] = env
            sa = StubArgs(algorithm, topk, disable_overlap, multi_layer)
            error = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    self.handle(sa)
                except (ValueError, AssertionError) as e:
                    error = e
            # what reaches the log before logging is configured: warnings, bare
            lines = [f"/venv/lib/python3.11/site-packages/sglang/srt/environ.py:70: {w.category.__name__}: {w.message}"
                     for w in caught]
            lines += [m for lvl, m in cap.records if lvl >= logging.WARNING]
            worker = self.create_worker(sa) if error is None and sa.speculative_algorithm else None
            return SimpleNamespace(args=sa, error=error, lines=lines, worker=worker)
        finally:
            root.removeHandler(cap)
            root.setLevel(level)
            os.environ.pop(sg.ENV_SPEC_V2, None)
            if old is not None:
                os.environ[sg.ENV_SPEC_V2] = old

    def create_worker(self, sa):
        algo = self.spec_info.SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
        if hasattr(algo, "create_worker"):
            cls = algo.create_worker(sa)
        else:
            # 0.5.7: Scheduler.__init__ (managers/scheduler.py:505-538) checks
            # enable_multi_layer_eagle first, else asks the registry, passing
            # enable_overlap to EAGLE-family factories (checked in
            # test_0_5_7_scheduler_dispatch_is_as_replayed).
            overlap = not sa.disable_overlap_schedule
            if sa.enable_multi_layer_eagle:
                name = "MultiLayerEagleWorkerV2" if overlap else "MultiLayerEagleWorker"
                cls = getattr(sys.modules[sg.PATH_FILES[name][:-3].replace("/", ".")], name)
            else:
                kw = {"enable_overlap": overlap} if algo.is_eagle() else {}
                cls = type(algo.create_draft_worker(**kw))
        return cls.__name__, cls.__module__.replace(".", "/") + ".py"


def test_0_5_7_scheduler_dispatch_is_as_replayed():
    src = text("0.5.7", sg.SCHEDULER)
    a = src.index("if self.server_args.enable_multi_layer_eagle:")
    b = src.index("self.draft_worker = self.spec_algorithm.create_draft_worker(")
    c = src.index('draft_worker_kwargs["enable_overlap"] = self.enable_overlap')
    assert c < a < b
    assert "if self.spec_algorithm.is_eagle():" in src[c - 200:c]


def _dump_line(sa) -> str:
    return ("[2026-01-05 10:11:12] server_args=ServerArgs(model_path='/models/m', tp_size=1, "
            f"speculative_algorithm={sa.speculative_algorithm!r}, speculative_eagle_topk={sa.speculative_eagle_topk}, "
            f"enable_multi_layer_eagle={sa.enable_multi_layer_eagle}, "
            f"disable_overlap_schedule={sa.disable_overlap_schedule}, enable_mixed_chunk=False)")


GRID = list(itertools.product(
    ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"], [None, 1, 4],
    [None, "True", "1", "yes", "Y", "false", "0", "no", "maybe", ""], [False, True], [False, True]))


@pytest.mark.parametrize("version", one_process_per_wheel(REPLAYED_VERSIONS))
def test_predict_and_log_agree_with_the_wheels_own_routing(version):
    rr = RealRouting(version)
    mismatches = []
    with rr.installed():
        for algo, topk, env, disable, ml in GRID:
            real = rr.run(algo, topk, env, disable, ml)
            flags = ["--speculative-algorithm", algo]
            if topk is not None:
                flags += ["--speculative-eagle-topk", str(topk)]
            if disable:
                flags.append("--disable-overlap-schedule")
            if ml:
                flags.append("--enable-multi-layer-eagle")
            pred = P(version, *flags, env=None if env is None else {sg.ENV_SPEC_V2: env})
            case = (algo, topk, env, disable, ml)
            if real.error is not None:
                if pred.starts or pred.error != str(real.error):
                    mismatches.append((case, "real raised", str(real.error), pred))
                continue
            name, module_file = real.worker
            assert module_file in rr.names, f"{version}: create_worker imports a missing {module_file}"
            if not pred.starts or pred.path != name or pred.file != module_file:
                mismatches.append((case, "real worker", name, pred))
                continue
            if pred.overlap is not None and pred.overlap != (not real.args.disable_overlap_schedule):
                mismatches.append((case, "overlap", not real.args.disable_overlap_schedule, pred))
            # the log: the warnings that code printed, then the ServerArgs dump
            window = real.lines + [_dump_line(real.args), "[2026-01-05 10:12:00] " + sg.READY_LINE]
            path = log_path(version, window, 100)
            if path != name:
                mismatches.append((case, "log with dump", name, path, window))
            # warnings alone (no dump: e.g. --log-level warning), the rest from the launch
            facts = PROFILE.log_facts(version, real.lines, 1)
            if "overlap" in facts.values and facts.values["overlap"] != (not real.args.disable_overlap_schedule):
                mismatches.append((case, "warning says overlap", facts.values, real.lines))
            fill = {"algorithm": pred.algorithm, "multi_layer": pred.multi_layer, "overlap": pred.overlap}
            expected = name if facts.values else None   # a log that says nothing shows nothing (0.5.14+ v2)
            if log_path(version, real.lines, 1, fill=fill) != expected:
                mismatches.append((case, "log warnings + launch", expected, real.lines))
    assert not mismatches, "\n".join(map(str, mismatches[:10]))


def test_real_warnings_match_the_stored_signatures_exactly():
    """A spot check of what the log really contains, per version family."""
    expect = {
        "0.5.7": ("EAGLE3", 4, None, "W1"), "0.5.9": ("EAGLE", None, "True", "W2"),
        "0.5.11": ("EAGLE3", 4, None, "W1"), "0.5.12": ("EAGLE", None, None, "W2"),
        "0.5.13": ("EAGLE", None, "0", "W1"), "0.5.15": ("EAGLE", None, None, None),
    }
    for version, (algo, topk, env, key) in expect.items():
        rr = RealRouting(version)
        with rr.installed():
            real = rr.run(algo, topk, env)
        routing = [l for l in real.lines if "Max running requests" not in l]
        if key is None:
            assert routing == []           # 0.5.14+: overlap on prints nothing
            continue
        sig = routing_signature(version, key)
        assert any(sig.matches(l) for l in routing), (version, routing)
