"""diffapply against GNU patch, on generated files and diffs (hypothesis).

GNU ``patch -F0`` (no fuzz, exact bytes with ``--binary``) is the reference for
what a hunk matches, where (offsets, the nearest match first, the later one on a
tie, hunks in order and never overlapping, hunks anchored at the start or the
end of the file) and what comes out, byte for byte. fleetpatch's classification
maps onto two runs of it:

- ``applies``          = the diff applies forward, and not in reverse;
- ``already-applied``  = it applies in reverse only (every post-image is there);
- ``conflict``         = neither, or both (ambiguous: fleetpatch refuses to
  guess whether the file is patched).

One deliberate difference, see `ends_where_the_diff_says`: a hunk whose patched
side lacks the final newline must end at the end of the file.

Needs GNU patch (and GNU diff for some diffs); CI machines have them from the
`patch` and `diffutils` packages.
"""
from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from fleetpatch.diffapply import DiffError, apply_file, parse_diff, split_lines

PATCH = shutil.which("patch")
DIFF = shutil.which("diff")
pytestmark = pytest.mark.skipif(PATCH is None, reason="GNU patch is not installed (apt-get install patch)")

PATH = "sglang/srt/x.py"
# Each example runs GNU patch two to four times: the budget keeps the file under
# 30 s on a busy 2-core machine. FLEETPATCH_PROPERTY_SCALE=50 searches harder.
SCALE = float(os.environ.get("FLEETPATCH_PROPERTY_SCALE", "1"))
SETTINGS = settings(max_examples=int(80 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# A small alphabet, so that the same lines recur: offsets, several candidate
# places and ambiguous files come up often. CRLF and non-ASCII lines included.
ALPHABET = ["a\n", "b\n", "c\n", "\n", "def f():\n", "    return 1\n", "x = 1\r\n", "# caf\u00e9\n"]
line = st.sampled_from(ALPHABET)


def as_bytes(lines) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape")


def drop_final_newline(lines):
    if lines and lines[-1].endswith("\n") and lines[-1] != "\n":
        return lines[:-1] + [lines[-1][:-1]]
    return lines


@st.composite
def texts(draw, min_size=0, max_size=24):
    lines = draw(st.lists(line, min_size=min_size, max_size=max_size))
    if draw(st.integers(0, 4)) == 0:
        lines = drop_final_newline(lines)
    return lines


@st.composite
def edited(draw, lines):
    """`lines` after a few insertions, deletions and replacements (and maybe a changed last newline)."""
    out = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        if kind == "insert" or not out:
            out.insert(draw(st.integers(0, len(out))), draw(line))
        elif kind == "delete":
            del out[draw(st.integers(0, len(out) - 1))]
        else:
            out[draw(st.integers(0, len(out) - 1))] = draw(line)
    # Only the last line may lack its newline.
    out = [ln if ln.endswith("\n") else ln + "\n" for ln in out[:-1]] + out[-1:]
    if out and draw(st.integers(0, 5)) == 0:  # add or drop the final newline
        out = drop_final_newline(out) if out[-1].endswith("\n") else out[:-1] + [out[-1] + "\n"]
    return out


def difflib_diff(old, new, n: int) -> str:
    out = []
    for ln in difflib.unified_diff(old, new, "a/" + PATH, "b/" + PATH, n=n):
        out.append(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n")
    return "".join(out)


def gnu_diff(old, new, n: int, tmp: Path) -> str:
    (tmp / "a").mkdir(exist_ok=True)
    (tmp / "b").mkdir(exist_ok=True)
    (tmp / "a" / "x.py").write_bytes(as_bytes(old))
    (tmp / "b" / "x.py").write_bytes(as_bytes(new))
    proc = subprocess.run([DIFF, f"-U{n}", "--label", "a/" + PATH, "--label", "b/" + PATH, "a/x.py", "b/x.py"],
                          cwd=tmp, capture_output=True)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout.decode("utf-8", "surrogateescape")


_SUCCEEDED = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: with fuzz \d+)?(?: \(offset (-?\d+) lines?\))?\.$")


def gnu_patch(diff: str, host: bytes, tmp: Path, reverse: bool = False):
    """(applied cleanly, output bytes, per-hunk offsets) from GNU patch -F0 on a copy of `host`."""
    work = tmp / ("rev" if reverse else "fwd")
    shutil.rmtree(work, ignore_errors=True)
    (work / "sglang" / "srt").mkdir(parents=True)
    (work / PATH).write_bytes(host)
    (tmp / "p.diff").write_bytes(diff.encode("utf-8", "surrogateescape"))
    argv = [PATCH, "-p1", "-F0", "-f", "--binary", "--verbose", "--no-backup-if-mismatch", "-r", "-",
            "-o", str(tmp / "out"), "-i", str(tmp / "p.diff")]
    if reverse:
        argv.append("-R")
    if (tmp / "out").exists():
        (tmp / "out").unlink()
    proc = subprocess.run(argv, cwd=work, capture_output=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
    text = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode in (0, 1), text + proc.stderr.decode("utf-8", "replace")
    offsets = {}
    for ln in text.splitlines():
        m = _SUCCEEDED.match(ln)
        if m:
            offsets[int(m.group(1))] = int(m.group(3) or 0)
    ok = proc.returncode == 0
    out = (tmp / "out").read_bytes() if ok else None
    return ok, out, [offsets[k] for k in sorted(offsets)] if ok else None


def ends_where_the_diff_says(fd, n_lines: int, offsets, post: bool) -> bool:
    """False when GNU patch placed a hunk without a final newline somewhere other than the end of the file.

    The one place where fleetpatch is deliberately stricter than GNU patch: when only
    the patched side of a hunk lacks the final newline, GNU patch matches the
    original side anywhere and then quietly keeps a newline. The hunk says that the
    file ends there; a host file that goes on is not the file the diff was made from."""
    for h, off in zip(fd.hunks, offsets):
        if h.touches_eof:
            start, block = (h.target_start, h.target_lines) if post else (h.source_start, h.source_lines)
            if max(start - 1, 0) + off + len(block) != n_lines:
                return False
    return True


def hunks_in_order(fd, offsets, post: bool) -> bool:
    """False when GNU patch placed a hunk over the previous hunk's lines.

    GNU patch copies a hunk's trailing context lazily, so the next hunk may start on
    those lines (with -F0 too); fleetpatch places each hunk after the whole of the one
    before, as the diff was made. Where GNU overlapped them, it is no reference."""
    end = 0
    for h, off in zip(fd.hunks, offsets):
        start, block = (h.target_start, h.target_lines) if post else (h.source_start, h.source_lines)
        pos = max(start - 1, 0) + off
        if pos < end:
            return False
        end = pos + len(block)
    return True


_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def moved(diff: str, fd, offsets) -> str:
    """`diff` with each hunk's header moved by its offset: GNU patch then looks there first."""
    lines = split_lines(diff)
    for h, off in zip(fd.hunks, offsets):
        m = _HEADER.match(lines[h.diff_line - 1])
        lines[h.diff_line - 1] = (f"@@ -{int(m.group(1)) + off}{m.group(2) or ''} "
                                  f"+{int(m.group(3)) + off}{m.group(4) or ''} @@\n")
    return "".join(lines)


def check_against_gnu(diff: str, host: bytes, tmp: Path):
    try:
        fds = parse_diff(diff, "gen.diff")
    except DiffError as exc:
        # The one kind of generated diff fleetpatch refuses: a hunk without context
        # (it matches context exactly and has none to match).
        assert "no context lines" in str(exc), str(exc)
        assume(False)
    assert len(fds) == 1 and fds[0].path == PATH
    fd = fds[0]
    fwd_ok, fwd_out, fwd_offsets = gnu_patch(diff, host, tmp)
    rev_ok, _, rev_offsets = gnu_patch(diff, host, tmp, reverse=True)
    n_lines = len(split_lines(host.decode("utf-8", "surrogateescape")))
    fwd_odd = fwd_ok and not (ends_where_the_diff_says(fd, n_lines, fwd_offsets, post=False)
                               and hunks_in_order(fd, fwd_offsets, post=False))
    rev_odd = rev_ok and not (ends_where_the_diff_says(fd, n_lines, rev_offsets, post=True)
                              and hunks_in_order(fd, rev_offsets, post=True))
    fwd_ok, rev_ok = fwd_ok and not fwd_odd, rev_ok and not rev_odd
    r = apply_file(fd, host)
    note(f"diff:\n{diff}\nhost: {host!r}\nGNU forward {fwd_ok} {fwd_offsets}, reverse {rev_ok} {rev_offsets}"
         f"{' (placed away from the end of the file, or over the hunk before)' if fwd_odd or rev_odd else ''}\n"
         f"fleetpatch: {r.state} {r.offsets} {r.detail}")
    if fwd_odd or rev_odd:
        # GNU's nearest match broke the end-of-file rule or overlapped two hunks, so it is no
        # reference for where the hunk goes; GNU still checks what fleetpatch did, with the headers moved to its places.
        zeros = [0] * len(fd.hunks)
        if r.state == "applies":
            ok, out, offsets = gnu_patch(moved(diff, fd, r.offsets), host, tmp)
            assert ok and out == r.new and offsets == zeros
            assert not rev_ok
            if fwd_ok:
                assert r.offsets == fwd_offsets and r.new == fwd_out
        elif r.state == "already-applied":
            ok, _, offsets = gnu_patch(moved(diff, fd, r.offsets), host, tmp, reverse=True)
            assert ok and offsets == zeros
            assert not fwd_ok
            if rev_ok:
                assert r.offsets == rev_offsets
        elif not r.detail.startswith("ambiguous"):
            assert not fwd_ok and not rev_ok
        return r
    if fwd_ok and not rev_ok:
        assert r.state == "applies"
        assert r.new == fwd_out
        assert r.offsets == fwd_offsets
    elif fwd_ok and rev_ok:
        assert r.state == "conflict" and r.detail.startswith("ambiguous")
    elif rev_ok:
        assert r.state == "already-applied"
        assert r.offsets == rev_offsets
        assert r.new is None
    else:
        assert r.state == "conflict" and r.new is None
    return r


@st.composite
def host_of(draw, old, new):
    """The file on the host: the original or the patched file, maybe with lines added or changed."""
    base = list(draw(st.sampled_from([old, new])))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["insert", "replace"]))
        if kind == "insert" or not base:
            base.insert(draw(st.integers(0, len(base))), draw(line))
        else:
            base[draw(st.integers(0, len(base) - 1))] = draw(line)
    base = [ln if ln.endswith("\n") else ln + "\n" for ln in base[:-1]] + base[-1:]
    return base


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory(prefix="fleetpatch-props-") as d:
        yield Path(d)


@SETTINGS
@given(data=st.data())
def test_same_outcome_as_gnu_patch(tmp, data):
    old = data.draw(texts(min_size=1), label="old")
    new = data.draw(edited(old), label="new")
    assume(old != new)
    n = data.draw(st.integers(1, 3), label="context")
    use_gnu = DIFF is not None and data.draw(st.booleans(), label="GNU diff")
    diff = gnu_diff(old, new, n, tmp) if use_gnu else difflib_diff(old, new, n)
    host = data.draw(host_of(old, new), label="host")
    check_against_gnu(diff, as_bytes(host), tmp)


@settings(SETTINGS, max_examples=int(30 * SCALE))
@given(data=st.data())
def test_original_applies_and_result_is_then_already_applied(tmp, data):
    """On the exact original the diff applies to the modified text; on that, it is already applied."""
    old = data.draw(texts(min_size=1), label="old")
    new = data.draw(edited(old), label="new")
    assume(old != new)
    diff = difflib_diff(old, new, data.draw(st.integers(1, 3), label="context"))
    r = check_against_gnu(diff, as_bytes(old), tmp)
    if r.state == "applies":
        assert r.new == as_bytes(new)
        again = check_against_gnu(diff, r.new, tmp)
        # With little context the original's lines can survive in the patched file:
        # then both images are present and the rule is to refuse, not to guess.
        assert again.state == "already-applied" or again.detail.startswith("ambiguous")


@settings(SETTINGS, max_examples=200)
@given(data=st.data())
def test_split_lines_round_trips(data):
    text = data.draw(st.text(alphabet=st.sampled_from("ab\r\n\u00e9\x00 "), max_size=40))
    assert "".join(split_lines(text)) == text
    assert all(ln.endswith("\n") for ln in split_lines(text)[:-1])


@settings(SETTINGS, max_examples=int(25 * SCALE))
@given(content=texts(max_size=12))
def test_created_and_deleted_files_match_gnu_patch(tmp, content):
    """A created file's bytes are what GNU patch creates; a delete takes exactly the file's bytes."""
    body = as_bytes(content)
    create = difflib_diff([], content, 3).replace("--- a/" + PATH, "--- /dev/null", 1)
    delete = difflib_diff(content, [], 3).replace("+++ b/" + PATH, "+++ /dev/null", 1)
    if not content:
        create = f"diff --git a/{PATH} b/{PATH}\nnew file mode 100644\n"
        delete = f"diff --git a/{PATH} b/{PATH}\ndeleted file mode 100644\n"
    fd_c = parse_diff(create, "c.diff")[0]
    fd_d = parse_diff(delete, "d.diff")[0]
    assert (fd_c.op, fd_d.op) == ("create", "delete")
    r = apply_file(fd_c, None)
    assert (r.state, r.new) == ("creates", body)
    assert apply_file(fd_c, body).state == "already-applied"
    assert apply_file(fd_d, body).state == "deletes"
    assert apply_file(fd_d, None).state == "already-applied"
    assert apply_file(fd_d, body + b"#\n").state == "conflict"
    if content:
        work = tmp / "create"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (tmp / "c.diff").write_text(create)
        proc = subprocess.run([PATCH, "-p1", "-f", "--binary", "-i", str(tmp / "c.diff")], cwd=work,
                              capture_output=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (work / PATH).read_bytes() == body
        (tmp / "d.diff").write_text(delete)
        proc = subprocess.run([PATCH, "-p1", "-f", "--binary", "-i", str(tmp / "d.diff")], cwd=work,
                              capture_output=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not (work / PATH).exists()
