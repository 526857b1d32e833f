"""Patch inputs a new user gets wrong, refused before any host is contacted (exit 2).

- a diff whose hunk lines alone end in CRLF (its headers in LF) for a file that
  SGLang ships with LF endings: it used to load and then conflict on every host;
- a misspelled key anywhere in patch.yaml, a marker for a worker class SGLang
  does not have, or one marker for two paths: named, with the likely word.

All with the real SGLang engine profile and SGLang's own files from the wheel.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from fleetpatch.diffapply import apply_file
from fleetpatch.engines.sglang import PROFILE
from fleetpatch.patchset import PatchError, load_patch
from fleetpatch_demo.wheels import wheel_path

from support.paths import FIXTURE_PATCHES as FIXTURES  # noqa: E402
V1 = "sglang/srt/speculative/eagle_worker.py"
V2 = "sglang/srt/speculative/eagle_worker_v2.py"
APERTUS = "sglang/srt/models/apertus.py"   # one of the few SGLang files with CRLF line endings
HEADERS = (b"--- ", b"+++ ", b"@@ ", b"diff ", b"index ")

MANIFEST = """\
name: {name}
summary: test
engine: sglang
revisions:
  - rev: 1
    diff: r1.diff
    engine_versions: "==0.5.9"
markers:
  EAGLEWorker: "fleetpatch fixture crlf: EAGLEWorker ("
  EAGLEWorkerV2: "fleetpatch fixture crlf: EAGLEWorkerV2 ("
forbid: ["Traceback (most recent call last)"]
"""


def lf_diff() -> bytes:
    """The shipped CRLF fixture's diff (the beacon in both workers) with LF endings: it applies to 0.5.9."""
    return (FIXTURES / "crlf" / "sglang-0.5.9.r1.diff").read_bytes().replace(b"\r\n", b"\n")


def hunk_lines_crlf(diff: bytes) -> bytes:
    """`diff` with CRLF on its hunk lines only: what a copy and paste out of a Windows editor leaves."""
    return b"".join(ln if ln.startswith(HEADERS) else ln.replace(b"\n", b"\r\n")
                    for ln in diff.splitlines(keepends=True))


def write_patch(root: Path, name: str = "p", manifest: str = MANIFEST, diff: bytes | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "patch.yaml").write_text(manifest.replace("{name}", name))
    (folder / "r1.diff").write_bytes(lf_diff() if diff is None else diff)
    return folder


def refused(root: Path, name: str = "p") -> str:
    with pytest.raises(PatchError) as ei:
        load_patch(name, [root], PROFILE)
    return str(ei.value)


def wheel_bytes(version: str, member: str) -> bytes:
    with zipfile.ZipFile(wheel_path(version)) as zf:
        return zf.read(member)


# ------------------------------------------------------------------ CRLF on the hunk lines only


def test_hunk_lines_in_crlf_are_refused_naming_file_line_and_fix(tmp_path):
    diff = hunk_lines_crlf(lf_diff())
    assert diff.count(b"\r\n") > 10 and not diff.startswith(b"--- a/sglang/srt/speculative/eagle_worker.py\r")
    write_patch(tmp_path, diff=diff)
    msg = refused(tmp_path)
    # line 4 is the first hunk line: the headers (lines 1-3) are LF
    assert msg.startswith(f"{tmp_path / 'p' / 'r1.diff'}: line 4: "), msg
    assert f"hunk 1 of {V1}" in msg and "CRLF" in msg and "dos2unix" in msg, msg


def test_crlf_on_one_hunk_line_of_the_second_file_is_found_at_its_line(tmp_path):
    lines = lf_diff().splitlines(keepends=True)
    second = [i for i, ln in enumerate(lines) if ln.startswith(b"+++ ")][1]
    lines[second + 3] = lines[second + 3].replace(b"\n", b"\r\n")   # a context line of V2's hunk
    write_patch(tmp_path, diff=b"".join(lines))
    msg = refused(tmp_path)
    assert f": line {second + 4}: this line of hunk 1 of {V2} ends in CRLF" in msg, msg


def test_the_profile_is_right_that_its_files_end_in_lf():
    """What the refusal relies on, read from the released wheels: every file the profile knows is LF."""
    for version in ("0.5.8", "0.5.9"):
        with zipfile.ZipFile(wheel_path(version)) as zf:
            names = set(zf.namelist())
            known = [f for f in PROFILE.fetch_files(version) if f in names]
            assert len(known) >= 8
            for member in known:
                assert PROFILE.line_ending(member) == "\n"
                assert b"\r" not in zf.read(member), member
    assert PROFILE.line_ending("python/" + V1) == "\n" and PROFILE.line_ending("a/" + V2) == "\n"
    assert PROFILE.line_ending(APERTUS) is None


def test_a_diff_of_a_real_crlf_file_still_loads_and_applies(tmp_path):
    """apertus.py really has CRLF endings: a diff of it keeps them on its hunk lines and is not refused."""
    original = wheel_bytes("0.5.9", APERTUS)
    lines = original.splitlines(keepends=True)
    assert lines[0].endswith(b"\r\n")
    new = lines[:3] + [b"# fleetpatch was here\r\n"] + lines[3:6]
    diff = (f"--- a/{APERTUS}\n+++ b/{APERTUS}\n@@ -1,6 +1,7 @@\n".encode()
            + b"".join(b" " + ln for ln in lines[:3]) + b"+" + new[3] + b"".join(b" " + ln for ln in lines[3:6]))
    write_patch(tmp_path, diff=lf_diff() + diff)
    patch, _ = load_patch("p", [tmp_path], PROFILE)
    fd = [f for f in patch.revisions[0].files if f.path == APERTUS][0]
    result = apply_file(fd, original)
    assert result.state == "applies"
    assert result.new == b"".join(lines[:3]) + b"# fleetpatch was here\r\n" + b"".join(lines[3:])


def test_the_lf_diff_applies_to_the_real_files(tmp_path):
    """The refused diffs differ from a good one only in their line endings."""
    write_patch(tmp_path)
    patch, _ = load_patch("p", [tmp_path], PROFILE)
    for fd in patch.revisions[0].files:
        assert apply_file(fd, wheel_bytes("0.5.9", fd.path)).state == "applies"


# ------------------------------------------------------------------ misspelled keys, unknown or shared markers


def manifest(old: str, new: str) -> str:
    assert old in MANIFEST, old
    return MANIFEST.replace(old, new)


EXTRA_MARKERS = '  EAGLEWorkerV2: "fleetpatch fixture crlf: EAGLEWorkerV2 ("\n'

CASES = {
    "top-level key": (manifest("markers:", "markerz:"), "markerz: unknown key (did you mean 'markers'?)"),
    "marker class": (manifest("  EAGLEWorker:", "  EagleWorker:"),
                     "markers.EagleWorker: sglang has no speculative decoding worker 'EagleWorker' "
                     "(did you mean 'EAGLEWorker'?)"),
    "revision key": (manifest("    diff: r1.diff", "    dif: r1.diff"),
                     "revisions[0].dif: unknown key (did you mean 'diff'?)"),
    "revision versions": (manifest("    engine_versions:", "    engine_version:"),
                          "revisions[0].engine_version: unknown key (did you mean 'engine_versions'?)"),
    "marker regex": (manifest('EAGLEWorkerV2: "fleetpatch fixture crlf: EAGLEWorkerV2 ("',
                              'EAGLEWorkerV2: {regx: "EAGLEWorkerV2 \\\\("}'),
                     "markers.EAGLEWorkerV2.regx: unknown key (did you mean 'regex'?)"),
    "one marker, two paths": (manifest('EAGLEWorkerV2: "fleetpatch fixture crlf: EAGLEWorkerV2 ("',
                                       'EAGLEWorkerV2: "fleetpatch fixture crlf: EAGLEWorker ("'),
                              "markers.EAGLEWorkerV2: the same marker as markers.EAGLEWorker"),
    "superseded key": (MANIFEST + 'superseded: {engine_versions: ">=0.5.23", usse: "--speculative-adaptive"}\n',
                       "superseded.usse: unknown key (did you mean 'use'?)"),
    "executed value": (MANIFEST + "executed: maybe\n", "executed: expected any"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_manifest_mistakes_are_named_with_the_likely_word(tmp_path, case):
    text, needle = CASES[case]
    write_patch(tmp_path, manifest=text)
    msg = refused(tmp_path)
    assert msg.startswith(f"{tmp_path / 'p' / 'patch.yaml'}: "), msg
    assert needle in msg, msg


def test_one_marker_for_two_paths_names_both_paths(tmp_path):
    text = manifest('EAGLEWorkerV2: "fleetpatch fixture crlf: EAGLEWorkerV2 ("',
                    'EAGLEWorkerV2: {regex: "fixture"}\n  EAGLEWorker: {regex: "fixture"}').replace(
        '  EAGLEWorker: "fleetpatch fixture crlf: EAGLEWorker ("\n', "")
    write_patch(tmp_path, manifest=text)
    msg = refused(tmp_path)
    assert "markers.EAGLEWorker: the same marker as markers.EAGLEWorkerV2 (regex /fixture/)" in msg, msg
    assert "EAGLEWorkerV2 from EAGLEWorker" in msg, msg


def test_executed_and_superseded_are_known_keys(tmp_path):
    text = MANIFEST + 'executed: off\nsuperseded: {engine_versions: ">=0.5.23", use: "--speculative-adaptive"}\n'
    write_patch(tmp_path, manifest=text)
    patch, _ = load_patch("p", [tmp_path], PROFILE)
    assert patch.executed == "off"
    assert patch.superseded.use == "--speculative-adaptive" and patch.superseded.spec_text == ">=0.5.23"
    assert patch.superseded.admits("0.5.23") and not patch.superseded.admits("0.5.9")
    write_patch(tmp_path, manifest=MANIFEST + "executed: any\n")
    patch, _ = load_patch("p", [tmp_path], PROFILE)
    assert patch.executed == "any" and patch.superseded is None


@pytest.mark.parametrize("value, needle", [
    ('"0.5.23"', "superseded: expected a mapping"),
    ('{engine_versions: ">=0.5.23"}', "superseded.use: required but missing"),
    ('{engine_versions: "0.5.x", use: "x"}', "superseded.engine_versions: '0.5.x' is not a PEP 440"),
    ('{engine_versions: ">=0.5.23", use: ""}', "superseded.use: must not be empty"),
])
def test_superseded_values_are_checked(tmp_path, value, needle):
    write_patch(tmp_path, manifest=MANIFEST + f"superseded: {value}\n")
    assert needle in refused(tmp_path)


def test_shipped_patches_still_load():
    from fleetpatch.patchset import available_patches, shipped_dir
    for name in available_patches([shipped_dir()]):
        load_patch(name, [shipped_dir()], PROFILE)


# ------------------------------------------------------------------ through the program: no host is contacted


@pytest.fixture
def knocking_host(tmp_path):
    """An inventory whose one host is a listening socket: any SSH attempt shows up as a connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    (tmp_path / "hosts.yaml").write_text(textwrap.dedent(f"""\
        hosts:
          gpu-a01:
            address: 127.0.0.1
            port: {listener.getsockname()[1]}
            user: root
            connect_timeout: 2
            engine: {{python: /usr/bin/python3}}
            server:
              log: /tmp/sglang.log
              restart: {{kind: systemd, unit: sglang.service}}
        """))
    yield listener
    listener.close()


@pytest.mark.parametrize("case", ["crlf hunks", "top-level key", "marker class", "one marker, two paths"])
@pytest.mark.parametrize("command", ["check-patch", "deploy-patch"])
def test_the_program_refuses_before_contacting_any_host(tmp_path, knocking_host, case, command):
    if case == "crlf hunks":
        write_patch(tmp_path / "patches", diff=hunk_lines_crlf(lf_diff()))
        needle = "p/r1.diff: line 4: this line of hunk 1"
    else:
        write_patch(tmp_path / "patches", manifest=CASES[case][0])
        needle = CASES[case][1]
    proc = subprocess.run([sys.executable, "-m", "fleetpatch", command, "--patch", "p", "--hosts", "gpu-a01",
                           "--inventory", "hosts.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "fleetpatch: error: " in out and needle in out, out
    assert "conflict" not in out and "gpu-a01" not in out and "Traceback" not in out, out
    with pytest.raises(BlockingIOError):
        knocking_host.accept()  # nobody knocked
