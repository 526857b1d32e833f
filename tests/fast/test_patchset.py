"""patchset: manifests, revision choice, path safety, the sibling and marker rules."""
from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from fleetpatch.errors import UsageError
from fleetpatch.patchset import (
    Marker,
    NoRevisionFits,
    Patch,
    PatchError,
    Revision,
    load_patch,
    parse_ref,
    search_dirs,
    shipped_dir,
)
from support.paths import FIXTURE_PATCHES

V1 = "sglang/srt/speculative/eagle_worker.py"
V2 = "sglang/srt/speculative/eagle_worker_v2.py"
ML1 = "sglang/srt/speculative/multi_layer_eagle_worker.py"
ML2 = "sglang/srt/speculative/multi_layer_eagle_worker_v2.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SERVER_ARGS = "sglang/srt/server_args.py"


class FakeProfile:
    """The two things load_patch needs from an engine profile."""

    kind = "sglang"
    package = "sglang"
    sibling_pairs = [(V1, V2), (ML1, ML2)]
    _paths = {
        V1: ["EAGLEWorker"],
        V2: ["EAGLEWorkerV2"],
        ML1: ["MultiLayerEagleWorker"],
        ML2: ["MultiLayerEagleWorkerV2"],
        SPEC_INFO: ["EAGLEWorker", "EAGLEWorkerV2"],  # a file that bears both paths
    }

    def paths_of_file(self, path):
        return list(self._paths.get(path, []))


PROFILE = FakeProfile()


def hunk_diff(path: str, prefix: str = "a/", line: str = "x = 1") -> str:
    b = "b/" if prefix == "a/" else prefix
    return (f"--- {prefix}{path}\n+++ {b}{path}\n"
            f"@@ -10,3 +10,4 @@\n ctx1\n ctx2\n+{line}\n ctx3\n")


BOTH = hunk_diff(V1) + hunk_diff(V2)

MANIFEST = """\
name: {name}
summary: Skip EAGLE draft+verify while the running batch is larger than a threshold.
engine: sglang
revisions:
  - rev: 1
    diff: sglang-0.5.9.r1.diff
    engine_versions: "==0.5.9"
markers:
  EAGLEWorker: "Dynamic speculation disable enabled"
  EAGLEWorkerV2: {{regex: "Dynamic speculation disable enabled .*V2"}}
expect: []
forbid: ["Traceback (most recent call last)"]
"""


def make_patch(root: Path, name: str = "dynamic-spec-disable", manifest: str | None = None,
               diffs: dict | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    text = MANIFEST.format(name=name) if manifest is None else textwrap.dedent(manifest).format(name=name)
    (folder / "patch.yaml").write_text(text)
    for fname, body in (diffs if diffs is not None else {"sglang-0.5.9.r1.diff": BOTH}).items():
        (folder / fname).write_bytes(body.encode() if isinstance(body, str) else body)
    return folder


def load(root: Path, ref: str = "dynamic-spec-disable", profile=PROFILE):
    return load_patch(ref, [root], profile)


def error(root: Path, ref: str = "dynamic-spec-disable", profile=PROFILE) -> PatchError:
    with pytest.raises(PatchError) as ei:
        load(root, ref, profile)
    assert isinstance(ei.value, UsageError)
    return ei.value


def manifest_with(replace: str, by: str, name: str = "dynamic-spec-disable") -> str:
    text = MANIFEST.format(name=name)
    assert replace in text, replace
    return text.replace(replace, by).replace("{", "{{").replace("}", "}}")


MIXED = """\
name: {name}
summary: mixed fleet
engine: sglang
revisions:
  - rev: 1
    diff: r1.diff
    engine_versions: "==0.5.9"
  - rev: 2
    diff: r2.diff
    engine_versions: "==0.5.8"
  - rev: 3
    diff: r3.diff
    engine_versions: ">=0.5.9,<0.5.11"
markers:
  EAGLEWorker: "m1"
  EAGLEWorkerV2: "m2"
"""


@pytest.fixture
def mixed(tmp_path):
    make_patch(tmp_path, "mixed", MIXED, {"r1.diff": BOTH, "r2.diff": BOTH, "r3.diff": BOTH})
    return load(tmp_path, "mixed")[0]


# ------------------------------------------------------------------ loading


def test_contract_example_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = make_patch(tmp_path / "patches")
    patch, rev = load_patch("dynamic-spec-disable", search_dirs(None, tmp_path), PROFILE)
    assert rev is None
    assert isinstance(patch, Patch)
    assert patch.name == "dynamic-spec-disable"
    assert patch.summary.startswith("Skip EAGLE")
    assert patch.engine == "sglang"
    assert patch.source_dir == folder
    assert patch.allow_single_path is None
    assert patch.expect == [] and patch.forbid == ["Traceback (most recent call last)"]
    assert set(patch.markers) == {"EAGLEWorker", "EAGLEWorkerV2"}
    assert patch.markers["EAGLEWorker"] == Marker("EAGLEWorker", literal="Dynamic speculation disable enabled")
    assert patch.markers["EAGLEWorkerV2"].regex == "Dynamic speculation disable enabled .*V2"
    [r] = patch.revisions
    assert isinstance(r, Revision)
    assert r.rev == 1
    assert r.diff_file == folder / "sglang-0.5.9.r1.diff"
    assert r.diff_text == BOTH
    assert r.diff_sha256 == hashlib.sha256(BOTH.encode()).hexdigest()
    assert str(r.engine_versions) == "==0.5.9"
    assert [f.path for f in r.files] == [V1, V2]
    assert patch.label(1) == "dynamic-spec-disable@1" and patch.label(r) == "dynamic-spec-disable@1"


def test_ref_with_revision(tmp_path):
    make_patch(tmp_path)
    patch, rev = load(tmp_path, "dynamic-spec-disable@1")
    assert rev == 1


def test_diff_text_keeps_bytes(tmp_path):
    # a diff of CRLF files: content lines end in CRLF, the diff's own header lines in LF
    crlf = "".join(ln if ln[:3] in ("---", "+++", "@@ ") else ln.replace("\n", "\r\n")
                   for ln in BOTH.splitlines(True)).encode()
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": crlf})
    r = load(tmp_path)[0].revisions[0]
    assert r.diff_text.encode() == crlf
    assert r.diff_sha256 == hashlib.sha256(crlf).hexdigest()
    assert r.files[0].hunks[0].target_lines[2] == "x = 1\r\n"


def test_python_root_paths_normalized(tmp_path):
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": hunk_diff("python/" + V1) + hunk_diff("python/" + V2)})
    assert load(tmp_path)[0].revisions[0].paths == [V1, V2]


def test_revisions_sorted_and_all_validated(tmp_path, mixed):
    assert [r.rev for r in mixed.revisions] == [1, 2, 3]
    # a broken later revision fails the whole patch, even if never chosen
    make_patch(tmp_path, "broken", MIXED.replace("mixed", "broken"),
               {"r1.diff": BOTH, "r2.diff": BOTH, "r3.diff": hunk_diff("/etc/passwd", prefix="")})
    e = error(tmp_path, "broken")
    assert "r3.diff: line 2:" in str(e) and "absolute" in str(e)


def test_first_directory_wins(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    make_patch(first, manifest=MANIFEST.replace("summary: Skip", "summary: FIRST Skip"))
    make_patch(second)
    patch, _ = load_patch("dynamic-spec-disable", [first, second], PROFILE)
    assert patch.summary.startswith("FIRST")
    patch, _ = load_patch("dynamic-spec-disable", [tmp_path / "missing", second], PROFILE)
    assert patch.source_dir == second / "dynamic-spec-disable"


# ------------------------------------------------------------------ lookup errors


def test_unknown_patch_lists_available(tmp_path):
    make_patch(tmp_path, "alpha", MANIFEST)
    make_patch(tmp_path / "more", "beta", MANIFEST)
    (tmp_path / "not-a-patch").mkdir()
    with pytest.raises(PatchError) as ei:
        load_patch("gamma", [tmp_path, tmp_path / "more"], PROFILE)
    msg = str(ei.value)
    assert "unknown patch 'gamma'" in msg and "available: alpha, beta" in msg
    assert "not-a-patch" not in msg


def test_unknown_revision_lists_revisions(tmp_path, mixed):
    e = error(tmp_path, "mixed@7")
    assert "mixed has no revision 7" in str(e)
    assert "revisions: 1, 2, 3" in str(e)
    assert "patch.yaml" in str(e)


@pytest.mark.parametrize("ref,expected", [
    ("name", ("name", None)),
    ("name@3", ("name", 3)),
    ("name@r2", ("name", 2)),
    (" dyn-spec.v2_x@12 ", ("dyn-spec.v2_x", 12)),
])
def test_parse_ref(ref, expected):
    assert parse_ref(ref) == expected


@pytest.mark.parametrize("ref", ["", "@1", "name@", "name@x", "name@0", "../etc@1", "a/b", "name@1@2", ".hidden"])
def test_parse_ref_errors(ref):
    with pytest.raises(PatchError):
        parse_ref(ref)


def test_search_dirs(tmp_path):
    shipped = shipped_dir()
    assert shipped.name == "patches" and shipped.parent.name == "fleetpatch"
    assert search_dirs(None, tmp_path) == [shipped]
    (tmp_path / "patches").mkdir()
    assert search_dirs(None, tmp_path) == [tmp_path / "patches", shipped]
    (tmp_path / "mine").mkdir()
    assert search_dirs("mine", tmp_path) == [tmp_path / "mine", tmp_path / "patches", shipped]
    assert search_dirs(str(tmp_path / "mine"), tmp_path)[0] == tmp_path / "mine"
    # the same folder twice is listed once
    assert search_dirs("patches", tmp_path) == [tmp_path / "patches", shipped]
    with pytest.raises(PatchError, match="not a directory"):
        search_dirs("nope", tmp_path)


# ------------------------------------------------------------------ manifest errors

P = "dynamic-spec-disable/patch.yaml"


@pytest.mark.parametrize("replace,by,key,reason", [
    ("expect: []", "expect: []\nextra: 1", "extra", "unknown key"),
    ("name: dynamic-spec-disable", "name: other", "name", "must equal the folder name 'dynamic-spec-disable'"),
    ("name: dynamic-spec-disable", "name: 5", "name", "expected a string, got 5"),
    ("engine: sglang", "engine: vllm", "engine", "the engine profile is 'sglang'"),
    ("engine: sglang", "engine: [sglang]", "engine", "expected a string, got a list"),
    ("summary: Skip EAGLE draft+verify while the running batch is larger than a threshold.", "summary: [a]",
     "summary", "expected a string"),
    ("expect: []", "expect: oops", "expect", "expected a list of strings"),
    ("expect: []", "expect: [1]", "expect[0]", "expected a string, got 1"),
    ('forbid: ["Traceback (most recent call last)"]', "forbid: [x, '']", "forbid[1]", "must not be empty"),
    ("expect: []", "expect: []\nallow_single_path: ''", "allow_single_path", "non-empty reason"),
    ("expect: []", "expect: []\nallow_single_path: true", "allow_single_path", "non-empty reason"),
    ("    engine_versions: \"==0.5.9\"", "    engine_versions: \"=0.5.9\"", "revisions[0].engine_versions",
     "not a PEP 440 version specifier"),
    ("    engine_versions: \"==0.5.9\"", "    engine_versions: 0.5", "revisions[0].engine_versions",
     "expected a PEP 440 specifier string"),
    ("    engine_versions: \"==0.5.9\"", "    engine_versions: \"\"", "revisions[0].engine_versions",
     "must not be empty"),
    ("    engine_versions: \"==0.5.9\"", "    engine_versions: \"==0.5.9\"\n    extra: 1", "revisions[0].extra",
     "unknown key"),
    ("    engine_versions: \"==0.5.9\"", "", "revisions[0].engine_versions", "required but missing"),
    ("  - rev: 1", "  - rev: one", "revisions[0].rev", "expected a positive integer, got 'one'"),
    ("  - rev: 1", "  - rev: 0", "revisions[0].rev", "expected a positive integer, got 0"),
    ("  - rev: 1", "  - rev: true", "revisions[0].rev", "expected a positive integer, got true"),
    ("    diff: sglang-0.5.9.r1.diff", "    diff: missing.diff", "revisions[0].diff", "no such file"),
    ("    diff: sglang-0.5.9.r1.diff", "    diff: ../x.diff", "revisions[0].diff", "no directories"),
    ("    diff: sglang-0.5.9.r1.diff", "    diff: 7", "revisions[0].diff", "expected a string, got 7"),
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: \"\"", "markers.EAGLEWorker",
     "must not be empty"),
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: 3", "markers.EAGLEWorker",
     "expected a literal string or"),
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: {regex: \"(unclosed\"}",
     "markers.EAGLEWorker.regex", "invalid regular expression"),
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: {regex: \".*\"}",
     "markers.EAGLEWorker.regex", "matches an empty line"),
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: {regexp: \"x\"}",
     "markers.EAGLEWorker.regexp", "unknown key"),
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: {}",
     "markers.EAGLEWorker.regex", "required"),
    # crashes found by tests/fast/test_input_fuzz.py: OverflowError, ValueError (embedded null byte), ValueError (date)
    ("  EAGLEWorker: \"Dynamic speculation disable enabled\"", "  EAGLEWorker: {regex: \"a{4294967296}\"}",
     "markers.EAGLEWorker.regex", "invalid regular expression 'a{4294967296}': the repetition number is too large"),
    ("    diff: sglang-0.5.9.r1.diff", "    diff: \"r1\\0.diff\"", "revisions[0].diff",
     "'r1\\x00.diff' contains a control character"),
    ("expect: []", "expect: []\n'': 1", "''", "unknown key"),
])
def test_manifest_errors_name_file_and_key(tmp_path, replace, by, key, reason):
    make_patch(tmp_path, manifest=manifest_with(replace, by))
    msg = str(error(tmp_path))
    assert f"{P}: {key}: " in msg, msg
    assert reason in msg, msg


def test_yaml_values_that_cannot_be_built(tmp_path):
    make_patch(tmp_path, manifest=manifest_with("expect: []", "expect: [2001-02-30]"))
    msg = str(error(tmp_path))
    assert "patch.yaml: not valid YAML at line" in msg and "'2001-02-30' is not a valid timestamp" in msg, msg


def test_manifest_structure_errors(tmp_path):
    cases = [
        ("", "empty"),
        ("- a\n", "expected a mapping at the top, got a list"),
        ("name: {name}\nengine: sglang\n", "revisions: required but missing"),
        ("engine: sglang\nrevisions: []\n", "name: required but missing"),
        ("name: {name}\nrevisions: []\n", "engine: required but missing"),
        ("name: {name}\nengine: sglang\nrevisions: []\n", "revisions: no revisions listed"),
        ("name: {name}\nengine: sglang\nrevisions: r1.diff\n", "revisions: expected a list"),
        ("name: {name}\nengine: sglang\nrevisions: [r1.diff]\n", "revisions[0]: expected a mapping"),
        ("name: {name}\nengine: sglang\nrevisions: []\nmarkers: [a]\n", "markers: expected a mapping"),
        ("name: {name}\nengine: sglang\nrevisions: [\n", "not valid YAML at line"),
        ("name: {name}\nname: {name}\nengine: sglang\nrevisions: []\n", "duplicate key 'name'"),
    ]
    for text, needle in cases:
        make_patch(tmp_path, manifest=text)
        msg = str(error(tmp_path))
        assert msg.startswith(P) or f"/{P}" in msg.split(":")[0], msg
        assert needle in msg, (text, msg)


def test_duplicate_revision(tmp_path):
    text = MANIFEST.replace('    engine_versions: "==0.5.9"\n',
                            '    engine_versions: "==0.5.9"\n  - rev: 1\n    diff: sglang-0.5.9.r1.diff\n'
                            '    engine_versions: "==0.5.8"\n')
    make_patch(tmp_path, manifest=text)
    msg = str(error(tmp_path))
    assert f"{P}: revisions[1].rev: revision 1 is listed twice" in msg


def test_diff_errors_name_the_diff_file_and_line(tmp_path):
    for body, needle in [
        (hunk_diff("../../etc/passwd"), "'..'"),
        (hunk_diff("torch/x.py"), "outside the sglang/ package"),
        ("Binary files a/sglang/x.so and b/sglang/x.so differ\n", "binary"),
        ("not a diff\n", "no file changes found"),
        ("", "empty"),
        (f"--- /dev/null\n+++ b/sglang/srt/__pycache__/x.pyc\n@@ -0,0 +1 @@\n+x\n", "__pycache__"),
        (BOTH.replace("\n", "\r\n"), "Windows (CRLF"),
    ]:
        make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": body})
        e = error(tmp_path)
        assert "dynamic-spec-disable/sglang-0.5.9.r1.diff" in str(e), str(e)
        assert needle in str(e), str(e)
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": hunk_diff("/abs/sglang/x.py", prefix="")})
    assert "sglang-0.5.9.r1.diff: line 2:" in str(error(tmp_path))


# ------------------------------------------------------------------ CRLF, created and deleted files


def test_crlf_diff_is_refused_at_load_naming_file_line_and_endings(tmp_path):
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": BOTH.replace("\n", "\r\n")})
    e = error(tmp_path)
    assert str(e).startswith(str(tmp_path / "dynamic-spec-disable" / "sglang-0.5.9.r1.diff") + ": line 3: ")
    assert "Windows (CRLF, \\r\\n) line endings" in str(e) and "LF" in str(e)
    assert e.file == str(tmp_path / "dynamic-spec-disable" / "sglang-0.5.9.r1.diff")
    # a diff of CRLF files (LF headers, CRLF content) is not the same thing and loads
    crlf_content = hunk_diff(V1).replace(" ctx1\n", " ctx1\r\n") + hunk_diff(V2)
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": crlf_content})
    assert load(tmp_path)[0].revisions[0].files[0].hunks[0].source_lines[0] == "ctx1\r\n"


NEW_FILE = "sglang/srt/speculative/dynamic_disable.py"
OLD_FILE = "sglang/srt/speculative/old_helper.py"
CREATE = f"--- /dev/null\n+++ b/{NEW_FILE}\n@@ -0,0 +1,2 @@\n+def enabled():\n+    return True\n"
DELETE = f"--- a/{OLD_FILE}\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n"


def test_revision_with_created_and_deleted_files_loads(tmp_path):
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": BOTH + CREATE + DELETE})
    rev = load(tmp_path)[0].revisions[0]
    assert [(f.path, f.op) for f in rev.files] == [(V1, "modify"), (V2, "modify"), (NEW_FILE, "create"),
                                                   (OLD_FILE, "delete")]
    assert rev.files[2].content == b"def enabled():\n    return True\n"


def test_sibling_and_marker_rules_for_created_and_deleted_files(tmp_path):
    no_v2_marker = manifest_with('  EAGLEWorkerV2: {regex: "Dynamic speculation disable enabled .*V2"}\n', "")
    # deleting a path-bearing file needs no marker for it (its code runs nowhere) ...
    delete_v2 = f"--- a/{V2}\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n"
    make_patch(tmp_path, manifest=no_v2_marker, diffs={"sglang-0.5.9.r1.diff": hunk_diff(V1) + delete_v2})
    assert [f.op for f in load(tmp_path)[0].revisions[0].files] == ["modify", "delete"]
    # ... but deleting one sibling alone is still one-sided
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": delete_v2})
    assert f"revision 1 changes {V2} but not its sibling {V1}" in str(error(tmp_path))
    # creating a path-bearing file needs its marker, and says "creates"
    create_v2 = f"--- /dev/null\n+++ b/{V2}\n@@ -0,0 +1 @@\n+x = 1\n"
    make_patch(tmp_path, manifest=no_v2_marker + "executed: off\n", diffs={"sglang-0.5.9.r1.diff": hunk_diff(V1) + create_v2})
    assert f"revision 1 creates {V2} (code path EAGLEWorkerV2) but" in str(error(tmp_path))


# ------------------------------------------------------------------ the sibling and marker rules


def test_sibling_rule_refuses_one_sided_revision(tmp_path):
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": hunk_diff(V2)})
    msg = str(error(tmp_path))
    assert "sglang-0.5.9.r1.diff: revision 1 changes " + V2 + " but not its sibling " + V1 in msg
    assert "allow_single_path" in msg
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": hunk_diff(V1)})
    assert "but not its sibling " + V2 in str(error(tmp_path))


def test_sibling_rule_second_pair_and_unrelated_files(tmp_path):
    text = MANIFEST.replace("expect: []", "  MultiLayerEagleWorker: a\n  MultiLayerEagleWorkerV2: b\nexpect: []")
    make_patch(tmp_path, manifest=text, diffs={"sglang-0.5.9.r1.diff": BOTH + hunk_diff(ML1)})
    assert "but not its sibling " + ML2 in str(error(tmp_path))
    make_patch(tmp_path, manifest=text, diffs={"sglang-0.5.9.r1.diff": BOTH + hunk_diff(ML1) + hunk_diff(ML2)})
    load(tmp_path)
    # a file outside every pair and without code paths needs neither sibling nor marker
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": hunk_diff(SERVER_ARGS)})
    assert load(tmp_path)[0].revisions[0].paths == [SERVER_ARGS]


def test_sibling_rule_checked_for_every_revision(tmp_path):
    make_patch(tmp_path, "mixed", MIXED, {"r1.diff": BOTH, "r2.diff": hunk_diff(V1), "r3.diff": BOTH})
    msg = str(error(tmp_path, "mixed"))
    assert "r2.diff: revision 2 changes " + V1 in msg


def test_allow_single_path_waives_both_rules(tmp_path):
    text = """\
        name: {name}
        engine: sglang
        revisions:
          - {{rev: 1, diff: r1.diff, engine_versions: "==0.5.9"}}
        allow_single_path: "only the v2 worker has the bug"
    """
    make_patch(tmp_path, manifest=text, diffs={"r1.diff": hunk_diff(V2)})
    patch, _ = load(tmp_path)
    assert patch.allow_single_path == "only the v2 worker has the bug"
    assert patch.markers == {} and patch.summary == ""


def test_marker_rule(tmp_path):
    """With `executed: off` markers alone judge execution: a changed path without one is refused."""
    text = manifest_with('  EAGLEWorkerV2: {regex: "Dynamic speculation disable enabled .*V2"}\n', "")
    make_patch(tmp_path, manifest=text + "executed: off\n")
    msg = str(error(tmp_path))
    assert f"revision 1 changes {V2} (code path EAGLEWorkerV2)" in msg
    assert "no marker for EAGLEWorkerV2" in msg
    assert "allow_single_path" in msg
    # no markers at all
    make_patch(tmp_path, manifest=MANIFEST.split("markers:")[0] + "executed: off\n")
    assert f"changes {V1} (code path EAGLEWorker)" in str(error(tmp_path))


def test_markers_are_optional_while_the_probe_judges(tmp_path):
    """The default (`executed: any`): a patch without markers loads; with the probe off
    (--no-probe, engine.probe: false) `require_markers` refuses it, naming what is missing."""
    from fleetpatch.patchset import require_markers
    make_patch(tmp_path, manifest=MANIFEST.split("markers:")[0])
    patch, _ = load(tmp_path)
    assert patch.markers == {} and patch.executed == "any"
    with pytest.raises(PatchError) as e:
        require_markers(patch, PROFILE, "--no-probe")
    msg = str(e.value)
    assert "--no-probe judges by markers alone" in msg and "no marker for EAGLEWorker" in msg
    assert "drop --no-probe" in msg


def test_marker_rule_file_with_several_paths(tmp_path):
    only_v1 = manifest_with('  EAGLEWorkerV2: {regex: "Dynamic speculation disable enabled .*V2"}\n', "")
    make_patch(tmp_path, manifest=only_v1, diffs={"sglang-0.5.9.r1.diff": hunk_diff(SPEC_INFO)})
    load(tmp_path)  # one marker among the file's paths is enough
    make_patch(tmp_path, manifest=MANIFEST.split("markers:")[0] + "executed: off\n",
               diffs={"sglang-0.5.9.r1.diff": hunk_diff(SPEC_INFO)})
    msg = str(error(tmp_path))
    assert "no marker for EAGLEWorker or EAGLEWorkerV2" in msg


def test_profile_without_kind_or_package(tmp_path):
    class Bare:
        sibling_pairs = [(V1, V2)]

        def paths_of_file(self, path):
            return []

    make_patch(tmp_path)
    patch, _ = load(tmp_path, profile=Bare())
    assert patch.revisions[0].paths == [V1, V2]


# ------------------------------------------------------------------ revision choice


def test_choose_newest_fitting_revision(mixed):
    assert mixed.choose(None, "0.5.9").rev == 3      # r1 and r3 admit 0.5.9: newest wins
    assert mixed.choose(None, "0.5.10").rev == 3
    assert mixed.choose(None, "0.5.8").rev == 2
    assert mixed.choose(None, "0.5.9+cu124").rev == 3  # local labels are ignored by ==
    assert mixed.choose(None, "0.5.9.post1").rev == 3


def test_choose_explicit_revision(mixed):
    assert mixed.choose(1, "0.5.9").rev == 1
    assert mixed.choose(2, "0.5.8").rev == 2
    with pytest.raises(NoRevisionFits) as ei:
        mixed.choose(1, "0.5.8")
    msg = str(ei.value)
    assert msg.startswith("mixed@1 does not support sglang 0.5.8: r1 supports ==0.5.9")
    assert "mixed@2" in msg
    with pytest.raises(NoRevisionFits, match="no revision 9"):
        mixed.choose(9, "0.5.9")


def test_no_revision_fits_message(tmp_path):
    make_patch(tmp_path)
    patch, _ = load(tmp_path)
    with pytest.raises(NoRevisionFits) as ei:
        patch.choose(None, "0.5.8")
    assert str(ei.value) == ("dynamic-spec-disable has no revision for sglang 0.5.8; "
                             "revisions support: r1 ==0.5.9")
    assert not isinstance(ei.value, UsageError)  # a per-host failure, not exit 2


def test_no_revision_fits_mixed_and_invalid(mixed):
    with pytest.raises(NoRevisionFits) as ei:
        mixed.choose(None, "0.5.11")
    assert str(ei.value) == ("mixed has no revision for sglang 0.5.11; revisions support: "
                             "r1 ==0.5.9, r2 ==0.5.8, r3 >=0.5.9,<0.5.11")
    with pytest.raises(NoRevisionFits, match="not a PEP 440 version"):
        mixed.choose(None, "banana")


def test_prerelease_inside_a_range_is_admitted(tmp_path):
    text = MANIFEST.replace('"==0.5.9"', '">=0.5.9"')
    make_patch(tmp_path, manifest=text)
    patch, _ = load(tmp_path)
    assert patch.choose(None, "0.6.0rc1").rev == 1


# ------------------------------------------------------------------ markers


def test_marker_matching_and_description():
    lit = Marker("EAGLEWorker", literal="Dynamic speculation disable enabled")
    rx = Marker("EAGLEWorkerV2", regex=r"Dynamic speculation disable enabled .*V2")
    line = "[2026-01-05 10:11:12 TP0] Dynamic speculation disable enabled threshold=8"
    assert lit.matches(line) and not rx.matches(line)
    assert rx.matches(line + " (EAGLEWorkerV2)")
    assert not lit.matches("dynamic speculation disable enabled")
    assert lit.describe() == '"Dynamic speculation disable enabled"'
    assert rx.describe() == "regex /Dynamic speculation disable enabled .*V2/"
    with pytest.raises(Exception):
        lit.path = "x"  # type: ignore[misc]


# ------------------------------------------------------------------ shipped patches


def test_shipped_patches_load_with_a_profile_like_sglangs():
    names = [p.name for p in shipped_dir().iterdir() if (p / "patch.yaml").is_file()] if shipped_dir().is_dir() else []
    for name in names:
        patch, _ = load_patch(name, [shipped_dir()], PROFILE)
        assert patch.revisions


def test_sibling_rule_uses_the_pairs_of_the_targeted_versions(tmp_path):
    """SGLang 0.5.13+ has no eagle_worker.py: a v2-only revision for it is not one-sided."""
    from fleetpatch.engines.sglang import PROFILE as REAL
    manifest = manifest_with('engine_versions: "==0.5.9"', 'engine_versions: ">=0.5.13,<0.5.16"')
    make_patch(tmp_path, manifest=manifest, diffs={"sglang-0.5.9.r1.diff": hunk_diff(V2)})
    patch, _ = load(tmp_path, profile=REAL)
    assert [f.path for f in patch.revisions[0].files] == [V2]
    # the same diff aimed at 0.5.9, where both files exist, is refused
    make_patch(tmp_path, diffs={"sglang-0.5.9.r1.diff": hunk_diff(V2)})
    assert "but not its sibling" in str(error(tmp_path, profile=REAL))


# ------------------------------------------------------------------ defect 12 through the program

FIXTURES = FIXTURE_PATCHES


def test_crlf_fixture_is_refused_by_load_patch_and_would_load_as_lf(tmp_path):
    from fleetpatch.engines import sglang

    raw = (FIXTURES / "crlf" / "sglang-0.5.9.r1.diff").read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n") > 10  # the fixture is CRLF throughout
    with pytest.raises(PatchError) as ei:
        load_patch("crlf", [FIXTURES], sglang.PROFILE)
    assert "crlf/sglang-0.5.9.r1.diff: line 3: the diff has Windows (CRLF" in str(ei.value)
    # the same diff with LF line endings is a valid patch: CRLF is the only thing wrong with it
    lf = tmp_path / "crlf"
    lf.mkdir()
    (lf / "patch.yaml").write_bytes((FIXTURES / "crlf" / "patch.yaml").read_bytes())
    (lf / "sglang-0.5.9.r1.diff").write_bytes(raw.replace(b"\r\n", b"\n"))
    patch, _ = load_patch("crlf", [tmp_path], sglang.PROFILE)
    assert patch.revisions[0].paths == [V1, V2]


def test_check_patch_refuses_a_crlf_diff_before_contacting_any_host(tmp_path):
    """Defect 12: exit 2 naming the file and the line endings, and no host is ever contacted."""
    import socket
    import subprocess
    import sys

    # The inventory's host is a listening socket: any SSH attempt would show up as a connection.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    (tmp_path / "hosts.yaml").write_text(textwrap.dedent(f"""\
        hosts:
          gpu-a01:
            address: 127.0.0.1
            port: {port}
            user: root
            connect_timeout: 2
            engine: {{python: /usr/bin/python3}}
            server:
              log: /tmp/sglang.log
              restart: {{kind: systemd, unit: sglang.service}}
        """))
    try:
        proc = subprocess.run([sys.executable, "-m", "fleetpatch", "check-patch", "--patch", "crlf",
                               "--patches", str(FIXTURES), "--hosts", "gpu-a01", "--inventory", "hosts.yaml"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**__import__("os").environ, "COLUMNS": "300"})
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert "fleetpatch: error: " in out and "crlf/sglang-0.5.9.r1.diff: line 3:" in out, out
        assert "Windows (CRLF" in out and "dos2unix" in out, out
        assert "conflict" not in out and "gpu-a01" not in out, out
        assert "Traceback" not in out, out
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked
    finally:
        listener.close()
