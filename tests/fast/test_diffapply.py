"""diffapply: parse + classify + apply, on the real SGLang 0.5.9 files."""
from __future__ import annotations

import difflib

import pytest

from fleetpatch_demo.wheels import sglang_tree
from fleetpatch.diffapply import (
    DiffError,
    FileDiff,
    apply_file,
    describe_offsets,
    parse_diff,
    split_lines,
)
from fleetpatch.errors import UsageError

V1 = "sglang/srt/speculative/eagle_worker.py"
V2 = "sglang/srt/speculative/eagle_worker_v2.py"


@pytest.fixture(scope="module")
def tree():
    return sglang_tree("0.5.9")


@pytest.fixture(scope="module")
def v1_bytes(tree):
    return (tree / V1).read_bytes()


@pytest.fixture(scope="module")
def v2_bytes(tree):
    return (tree / V2).read_bytes()


def lines_of(data: bytes):
    return split_lines(data.decode("utf-8", "surrogateescape"))


def udiff(old, new, path=V1, a="a/", b="b/", n=3):
    """difflib unified diff, with proper '\\ No newline at end of file' markers."""
    out = []
    for ln in difflib.unified_diff(old, new, a + path, b + path, n=n):
        if not ln.endswith("\n"):
            out.append(ln + "\n")
            out.append("\\ No newline at end of file\n")
        else:
            out.append(ln)
    return "".join(out)


def find_line(lines, needle, start=0):
    for i in range(start, len(lines)):
        if needle in lines[i]:
            return i
    raise AssertionError(f"{needle!r} not in file")


def modify_v1(lines):
    """Two hunks: insert a marker log line in __init__, change a line further down."""
    new = list(lines)
    i = find_line(new, "def __init__(")
    j = find_line(new, "super().__init__(", i) if any("super().__init__(" in x for x in new[i:i + 40]) else i + 1
    new.insert(j, '        logger.info("Dynamic speculation disable enabled")\n')
    k = find_line(new, "def forward_batch_generation(")
    new[k + 1:k + 1] = ["        # fleetpatch test change\n"]
    return new


def joined(lines) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape")


# ------------------------------------------------------------------------ applying


def test_real_file_applies_exactly_and_round_trips(v1_bytes):
    old = lines_of(v1_bytes)
    new = modify_v1(old)
    fds = parse_diff(udiff(old, new), "patches/p/r1.diff")
    assert [f.path for f in fds] == [V1]
    assert fds[0].raw_path == "b/" + V1
    assert len(fds[0].hunks) == 2
    r = apply_file(fds[0], v1_bytes)
    assert r.state == "applies"
    assert r.offsets == [0, 0]
    assert r.new == joined(new)
    assert r.detail == ""


def test_second_apply_is_already_applied(v1_bytes):
    old = lines_of(v1_bytes)
    new = modify_v1(old)
    fd = parse_diff(udiff(old, new), "p.diff")[0]
    patched = apply_file(fd, v1_bytes).new
    r = apply_file(fd, patched)
    assert r.state == "already-applied"
    assert r.new is None
    assert r.offsets == [0, 0]


def test_offsets_when_lines_inserted_above(v1_bytes):
    old = lines_of(v1_bytes)
    new = modify_v1(old)
    fd = parse_diff(udiff(old, new), "p.diff")[0]
    shifted = ["# local 1\n", "# local 2\n", "# local 3\n"] + old
    r = apply_file(fd, joined(shifted))
    assert r.state == "applies"
    assert r.offsets == [3, 3]
    assert "hunk 1 offset +3 lines" in r.detail
    assert r.new == joined(["# local 1\n", "# local 2\n", "# local 3\n"] + new)
    # lines removed above -> negative offset; and between hunks -> only the second moves
    i = find_line(old, "def forward_batch_generation(")
    between = old[:i - 5] + old[i - 3:]
    r2 = apply_file(fd, joined(between))
    assert r2.state == "applies"
    assert r2.offsets == [0, -2]
    # already-applied is found with offsets too
    r3 = apply_file(fd, joined(["# x\n"] + new))
    assert r3.state == "already-applied"
    assert r3.offsets == [1, 1]


def test_offset_prefers_nearest_match():
    block = ["def f():\n", "    a = 1\n", "    return a\n"]
    base = ["# head\n"] + block + ["\n"] * 20 + block + ["# tail\n"]
    new = list(base)
    new.insert(24 + 2, "    b = 2\n")  # in the second copy (0-based 24 is its 'def f')
    d = udiff(base, new, path="sglang/x.py", n=1)
    fd = parse_diff(d, "p.diff")[0]
    r = apply_file(fd, joined(base))
    assert r.state == "applies" and r.offsets == [0]
    assert r.new == joined(new)
    # with two extra lines on top the same copy (the nearest) is chosen
    r2 = apply_file(fd, joined(["#\n", "#\n"] + base))
    assert r2.offsets == [2]
    assert r2.new == joined(["#\n", "#\n"] + new)


def test_no_fuzz_whitespace_change_is_conflict(v1_bytes):
    old = lines_of(v1_bytes)
    new = modify_v1(old)
    fd = parse_diff(udiff(old, new), "p.diff")[0]
    h2 = fd.hunks[1]
    # change one context line of hunk 2 by a single trailing space
    idx = h2.source_start - 1 + 1
    drifted = list(old)
    drifted[idx] = drifted[idx].rstrip("\n") + " \n"
    r = apply_file(fd, joined(drifted))
    assert r.state == "conflict"
    assert r.new is None
    assert r.offsets == [0]
    assert r.detail.startswith(f"hunk 2 ({h2.short_header}): line {idx + 1} expected ")
    assert repr(old[idx].rstrip("\n")) in r.detail
    assert repr(drifted[idx].rstrip("\n")) in r.detail


def test_conflict_detail_format():
    old = [f"line {i}\n" for i in range(1, 200)]
    old[121] = "    x = 1\n"  # line 122
    old[122] = "    y = 1\n"  # line 123
    new = list(old)
    new[121:123] = ["    x = 1\n", "    y = 1\n", "    z = 3\n", "    w = 4\n"]
    fd = parse_diff(udiff(old, new, path="sglang/m.py"), "p.diff")[0]
    assert fd.hunks[0].short_header == "@@ -121,6 +121,8 @@"
    host = list(old)
    host[122] = "    y = 2\n"
    r = apply_file(fd, joined(host))
    assert r.state == "conflict"
    assert r.detail == "hunk 1 (@@ -121,6 +121,8 @@): line 123 expected '    y = 1' found '    y = 2'"


def test_conflict_past_end_of_file():
    old = [f"l{i}\n" for i in range(10)]
    new = old[:8] + ["added\n"] + old[8:]
    fd = parse_diff(udiff(old, new, path="sglang/m.py"), "p.diff")[0]
    r = apply_file(fd, joined(old[:7]))
    assert r.state == "conflict"
    assert "found end of file" in r.detail


def test_hunks_with_cut_context_stay_at_their_end_of_the_file():
    """Less context on one side means the file ends there (GNU patch -F0 reads it so too)."""
    old = [f"l{i}\n" for i in range(1, 9)]
    first = udiff(old, ["L1\n"] + old[1:], path="sglang/m.py")
    last = udiff(old, old[:-1] + ["L8\n"], path="sglang/m.py")
    fd_first, fd_last = parse_diff(first, "p.diff")[0], parse_diff(last, "p.diff")[0]
    assert (fd_first.hunks[0].prefix_context, fd_first.hunks[0].suffix_context) == (0, 3)
    assert fd_first.hunks[0].anchor() == "start" and fd_last.hunks[0].anchor() == "end"
    assert apply_file(fd_first, joined(old)).new == joined(["L1\n"] + old[1:])
    assert apply_file(fd_last, joined(old)).new == joined(old[:-1] + ["L8\n"])
    # a line added above the start (or below the end): the hunk no longer sits there
    r = apply_file(fd_first, joined(["# local\n"] + old))
    assert r.state == "conflict"
    assert r.detail == ("hunk 1 (@@ -1,4 +1,4 @@): line 1 expected 'l1' found '# local' (its lines appear at "
                        "line 2, but the diff puts this hunk at the start of the file (its context is cut short "
                        "there))")
    r = apply_file(fd_last, joined(old + ["# local\n"]))
    assert r.state == "conflict"
    assert r.detail.startswith("hunk 1 (@@ -5,4 +5,4 @@): the hunk changes the end of the file, but line 9 follows it")
    # ... and the same hunk in the middle of a longer file is found with an offset when its context is whole
    whole = udiff(["x\n"] * 3 + old, ["x\n"] * 3 + ["L1\n"] + old[1:], path="sglang/m.py")
    fd = parse_diff(whole, "p.diff")[0]
    assert fd.hunks[0].anchor() is None
    assert apply_file(fd, joined(["y\n"] + ["x\n"] * 3 + old)).offsets == [1]


def test_partly_patched_file_is_conflict_and_says_so(v1_bytes):
    old = lines_of(v1_bytes)
    new = modify_v1(old)
    fd = parse_diff(udiff(old, new), "p.diff")[0]
    # apply only hunk 1 by hand
    half = FileDiff(path=fd.path, raw_path=fd.raw_path, hunks=[fd.hunks[0]])
    half_bytes = apply_file(half, v1_bytes).new
    r = apply_file(fd, half_bytes)
    assert r.state == "conflict"
    assert r.detail.startswith("hunk 1 (")
    assert "hunk 1 of 2 already applied" in r.detail


def test_hunks_must_not_overlap_when_placed():
    # hunk 2's context exists only overlapping hunk 1's match: it must not be used
    base = ["a\n", "b\n", "c\n"] + [f"f{i}\n" for i in range(10)] + ["c\n", "d\n", "e\n", "g1\n", "g2\n"]
    new = list(base)
    new[1] = "B\n"
    new[14] = "D\n"
    fd = parse_diff(udiff(base, new, path="sglang/m.py", n=1), "p.diff")[0]
    assert len(fd.hunks) == 2
    assert fd.hunks[1].source_lines == ["c\n", "d\n", "e\n"]
    assert apply_file(fd, joined(base)).new == joined(new)
    host = ["a\n", "b\n", "c\n", "d\n", "e\n", "g1\n", "g2\n"]
    r = apply_file(fd, joined(host))
    assert r.state == "conflict"
    assert r.offsets == [0]
    assert r.detail.startswith("hunk 2 (")
    assert "its context appears only at line 3, before hunk 1 ends" in r.detail


def test_ambiguous_both_images_present_is_conflict():
    old = ["a\n", "b\n", "c\n", "d\n"]
    new = ["a\n", "b\n", "X\n", "c\n", "d\n"]
    fd = parse_diff(udiff(old, new, path="sglang/m.py", n=2), "p.diff")[0]
    both = old + ["\n"] + new
    r = apply_file(fd, joined(both))
    assert r.state == "conflict"
    assert "ambiguous" in r.detail


def test_crlf_file_round_trips_byte_for_byte(v2_bytes):
    old = [ln.replace("\n", "\r\n") for ln in lines_of(v2_bytes)]
    new = list(old)
    i = find_line(new, "def __init__(")
    new.insert(i + 1, '        logger.info("Dynamic speculation disable enabled V2")\r\n')
    d = udiff(old, new, path=V2)
    assert "\r\n" in d
    fd = parse_diff(d, "p.diff")[0]
    assert all(ln.endswith("\r\n") for ln in fd.hunks[0].source_lines)
    r = apply_file(fd, joined(old))
    assert r.state == "applies"
    assert r.new == joined(new)
    assert b"\r\n" in r.new and b"\n" not in r.new.replace(b"\r\n", b"")
    assert apply_file(fd, r.new).state == "already-applied"
    # the same diff against the LF file: a conflict that names the line-ending difference
    r_lf = apply_file(fd, v2_bytes)
    assert r_lf.state == "conflict"
    assert "\\r\\n" in r_lf.detail


def test_invalid_utf8_and_other_bytes_round_trip():
    raw = b"a = 1\n# caf\xe9 \xff\xfe\nb = 2\nc = 3\nd = 4\n"
    old = split_lines(raw.decode("utf-8", "surrogateescape"))
    new = list(old)
    new.insert(3, "inserted = True\n")
    d = udiff(old, new, path="sglang/m.py")
    fd = parse_diff(d, "p.diff")[0]
    r = apply_file(fd, raw)
    assert r.state == "applies"
    assert r.new == raw.replace(b"b = 2\n", b"b = 2\ninserted = True\n")


def test_no_newline_at_eof_kept_and_changed():
    old = ["x = 1\n", "y = 2\n", "z = 3"]  # no final newline
    # 1) change a line above, keep the missing newline
    new = ["x = 10\n", "y = 2\n", "z = 3"]
    d = udiff(old, new, path="sglang/m.py")
    assert "\\ No newline at end of file" in d
    fd = parse_diff(d, "p.diff")[0]
    assert fd.hunks[0].source_lines[-1] == "z = 3"
    r = apply_file(fd, joined(old))
    assert r.state == "applies" and r.new == b"x = 10\ny = 2\nz = 3"
    assert apply_file(fd, r.new).state == "already-applied"
    # 2) add a final newline
    d2 = udiff(old, ["x = 1\n", "y = 2\n", "z = 3\n"], path="sglang/m.py")
    fd2 = parse_diff(d2, "p.diff")[0]
    assert fd2.hunks[0].source_lines[-1] == "z = 3" and fd2.hunks[0].target_lines[-1] == "z = 3\n"
    r2 = apply_file(fd2, joined(old))
    assert r2.state == "applies" and r2.new == b"x = 1\ny = 2\nz = 3\n"
    assert apply_file(fd2, r2.new).state == "already-applied"
    # 3) remove the final newline; the hunk must end at EOF
    d3 = udiff(["x = 1\n", "y = 2\n", "z = 3\n"], old, path="sglang/m.py")
    fd3 = parse_diff(d3, "p.diff")[0]
    r3 = apply_file(fd3, b"x = 1\ny = 2\nz = 3\n")
    assert r3.state == "applies" and r3.new == b"x = 1\ny = 2\nz = 3"
    r3b = apply_file(fd3, b"x = 1\ny = 2\nz = 3\nmore = 4\n")
    assert r3b.state == "conflict"
    # 4) append after a last line that has no newline
    d4 = udiff(old, ["x = 1\n", "y = 2\n", "z = 3\n", "w = 4\n"], path="sglang/m.py")
    r4 = apply_file(parse_diff(d4, "p.diff")[0], joined(old))
    assert r4.state == "applies" and r4.new == b"x = 1\ny = 2\nz = 3\nw = 4\n"


def test_no_newline_marker_mid_hunk_hand_written():
    d = (
        "--- a/sglang/m.py\n"
        "+++ b/sglang/m.py\n"
        "@@ -1,2 +1,2 @@\n"
        " a\n"
        "-b\n"
        "\\ No newline at end of file\n"
        "+c\n"
        "\\ No newline at end of file\n"
    )
    fd = parse_diff(d, "p.diff")[0]
    assert fd.hunks[0].source_lines == ["a\n", "b"]
    assert fd.hunks[0].target_lines == ["a\n", "c"]
    assert apply_file(fd, b"a\nb").new == b"a\nc"


def test_python_root_and_prefixes(v1_bytes):
    old = lines_of(v1_bytes)
    new = modify_v1(old)
    expected = joined(new)
    for a, b, root in [("a/", "b/", "python/"), ("", "", "python/"), ("", "", ""), ("a/", "b/", "")]:
        d = udiff(old, new, path=root + V1, a=a, b=b)
        fd = parse_diff(d, "p.diff")
        assert fd[0].path == V1, (a, b, root)
        assert fd[0].raw_path == b + root + V1
        assert apply_file(fd[0], v1_bytes).new == expected


def test_git_diff_with_index_line_and_two_files(v1_bytes, v2_bytes):
    o1, o2 = lines_of(v1_bytes), lines_of(v2_bytes)
    n1 = modify_v1(o1)
    n2 = list(o2)
    i = find_line(n2, "def __init__(")
    n2.insert(i + 1, '        logger.info("Dynamic speculation disable enabled V2")\n')
    d = (
        f"diff --git a/python/{V1} b/python/{V1}\n"
        "index 1111111..2222222 100644\n"
        + udiff(o1, n1, path="python/" + V1)
        + f"diff --git a/python/{V2} b/python/{V2}\n"
        "index 3333333..4444444 100644\n"
        + udiff(o2, n2, path="python/" + V2)
    )
    fds = parse_diff(d, "p.diff")
    assert [f.path for f in fds] == [V1, V2]
    assert apply_file(fds[0], v1_bytes).new == joined(n1)
    assert apply_file(fds[1], v2_bytes).new == joined(n2)
    # header and diff line of each hunk point into the .diff text
    dl = d.split("\n")
    for f in fds:
        for h in f.hunks:
            assert dl[h.diff_line - 1] == h.header
            assert h.header.startswith("@@ -")


def test_diff_with_timestamps_and_section_headers():
    d = (
        "--- sglang/m.py\t2024-01-01 00:00:00.000000000 +0000\n"
        "+++ sglang/m.py\t2024-01-02 00:00:00.000000000 +0000\n"
        "@@ -1,3 +1,4 @@ def f():\n"
        " a\n"
        " b\n"
        "+x\n"
        " c\n"
    )
    fd = parse_diff(d, "p.diff")[0]
    assert fd.hunks[0].header == "@@ -1,3 +1,4 @@ def f():"
    assert fd.hunks[0].short_header == "@@ -1,3 +1,4 @@"
    assert apply_file(fd, b"a\nb\nc\n").new == b"a\nb\nx\nc\n"


def test_empty_context_line_without_space_is_accepted():
    # editors strip the single space of empty context lines
    d = "--- a/sglang/m.py\n+++ b/sglang/m.py\n@@ -1,3 +1,4 @@\n a\n\n+x\n c\n"
    fd = parse_diff(d, "p.diff")[0]
    assert apply_file(fd, b"a\n\nc\n").new == b"a\n\nx\nc\n"


def test_diff_file_without_final_newline():
    d = "--- a/sglang/m.py\n+++ b/sglang/m.py\n@@ -1,2 +1,3 @@\n a\n+x\n b"
    fd = parse_diff(d, "p.diff")[0]
    assert fd.hunks[0].target_lines == ["a\n", "x\n", "b\n"]


def test_describe_offsets():
    assert describe_offsets([0, 0]) == ""
    assert describe_offsets([1, -4]) == "hunk 1 offset +1 line, hunk 2 offset -4 lines"


# ------------------------------------------------------------------------ refusals

GOOD_HUNK = "@@ -1,2 +1,3 @@\n a\n+x\n b\n"


def refuse(text, *needles, line=None):
    with pytest.raises(DiffError) as ei:
        parse_diff(text, "patches/demo/r1.diff")
    msg = str(ei.value)
    assert msg.startswith("patches/demo/r1.diff: "), msg
    if line is not None:
        assert msg.startswith(f"patches/demo/r1.diff: line {line}: "), msg
        assert ei.value.line == line
    for n in needles:
        assert n in msg, msg
    assert isinstance(ei.value, UsageError)
    return ei.value


@pytest.mark.parametrize("raw", [
    "/etc/passwd",
    "/usr/lib/python3/site-packages/sglang/srt/x.py",
    "a/sglang/../../etc/x.py",
    "sglang/srt/../../../x.py",
    "~/sglang/x.py",
])
def test_refuse_absolute_and_dotdot(raw):
    err = refuse(f"--- {raw}\n+++ {raw}\n" + GOOD_HUNK, repr(raw), line=2)
    assert err.path == raw


@pytest.mark.parametrize("raw", [
    "a/torch/nn/x.py",
    "a/vllm/x.py",
    "a/sglangx/x.py",
    "a/python/x.py",
    "a/src/sglang/x.py",
    "a/sglang",
    "setup.py",
])
def test_refuse_outside_package(raw):
    b = "b/" + raw[2:] if raw.startswith("a/") else raw
    refuse(f"--- {raw}\n+++ {b}\n" + GOOD_HUNK, "outside the sglang/ package", line=2)


def test_other_package_name():
    d = "--- a/vllm/x.py\n+++ b/vllm/x.py\n" + GOOD_HUNK
    assert parse_diff(d, "p.diff", package="vllm")[0].path == "vllm/x.py"
    refuse("--- a/vllm/x.py\n+++ b/vllm/x.py\n" + GOOD_HUNK, "outside")


def test_refuse_binary():
    refuse("Binary files a/sglang/x.so and b/sglang/x.so differ\n", "binary", line=1)
    refuse(
        "diff --git a/sglang/x.so b/sglang/x.so\n"
        "index 1111111..2222222 100644\n"
        "GIT binary patch\n"
        "literal 10\n"
        "Rcmb=*\n",
        "binary", line=1,
    )
    refuse(
        "diff --git a/sglang/x.so b/sglang/x.so\n"
        "index 1111111..2222222 100644\n"
        "Binary files a/sglang/x.so and b/sglang/x.so differ\n",
        "binary",
    )


CREATE_NEW = "--- /dev/null\n+++ b/sglang/srt/new_helper.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
DELETE_OLD = "--- a/sglang/srt/old_helper.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a = 1\n-b = 2\n"


def test_create_file_states():
    fd = parse_diff(CREATE_NEW, "p.diff")[0]
    assert (fd.op, fd.path, fd.raw_path) == ("create", "sglang/srt/new_helper.py", "b/sglang/srt/new_helper.py")
    assert fd.content == b"a = 1\nb = 2\n"
    r = apply_file(fd, None)
    assert (r.state, r.new, r.offsets, r.detail) == ("creates", b"a = 1\nb = 2\n", [0], "")
    r = apply_file(fd, b"a = 1\nb = 2\n")
    assert (r.state, r.new) == ("already-applied", None)
    r = apply_file(fd, b"a = 1\nb = 3\n")
    assert r.state == "conflict" and r.new is None
    assert r.detail == ("the diff creates sglang/srt/new_helper.py, but it already exists with other content: "
                        "line 2 expected 'b = 2' found 'b = 3'")
    r = apply_file(fd, b"")
    assert r.state == "conflict" and "already exists (empty): line 1 expected 'a = 1' found end of file" in r.detail
    # one more line on the host than in the diff
    r = apply_file(fd, b"a = 1\nb = 2\nc = 3\n")
    assert r.state == "conflict" and "line 3 expected end of file found 'c = 3'" in r.detail


def test_delete_file_states():
    fd = parse_diff(DELETE_OLD, "p.diff")[0]
    assert (fd.op, fd.path, fd.raw_path) == ("delete", "sglang/srt/old_helper.py", "a/sglang/srt/old_helper.py")
    assert fd.content == b"a = 1\nb = 2\n"
    r = apply_file(fd, b"a = 1\nb = 2\n")
    assert (r.state, r.new, r.offsets) == ("deletes", None, [0])
    assert apply_file(fd, None).state == "already-applied"
    # a file that is not byte for byte the diff's original is never deleted
    r = apply_file(fd, b"a = 1\nb = 2")
    assert r.state == "conflict"
    assert r.detail == ("the diff deletes sglang/srt/old_helper.py, but the file differs from the one the diff "
                        "was made from: line 2 expected 'b = 2\\n' found 'b = 2' (only the newline at the end of the file "
                        "differs)")
    r = apply_file(fd, b"a = 1\r\nb = 2\r\n")
    assert r.state == "conflict" and "(only the line endings differ)" in r.detail


def test_modify_of_a_missing_file_is_a_conflict():
    fd = parse_diff("--- a/sglang/x.py\n+++ b/sglang/x.py\n" + GOOD_HUNK, "p.diff")[0]
    assert fd.op == "modify" and fd.content is None
    r = apply_file(fd, None)
    assert r.state == "conflict" and r.detail == "sglang/x.py does not exist, so the diff cannot change it"


def test_git_create_and_delete_forms():
    d = ("diff --git a/sglang/new.py b/sglang/new.py\nnew file mode 100644\nindex 0000000..1111111\n"
         "--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1 @@\n+a\n\\ No newline at end of file\n"
         "diff --git a/sglang/empty.py b/sglang/empty.py\nnew file mode 100644\nindex 0000000..e69de29\n"
         "diff --git a/sglang/old.py b/sglang/old.py\ndeleted file mode 100755\nindex 1111111..0000000\n"
         "--- a/sglang/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n"
         "diff --git a/sglang/gone.py b/sglang/gone.py\ndeleted file mode 100644\nindex e69de29..0000000\n")
    fds = {f.path: f for f in parse_diff(d, "p.diff")}
    assert {p: (f.op, f.content) for p, f in fds.items()} == {
        "sglang/new.py": ("create", b"a"),          # no final newline kept
        "sglang/empty.py": ("create", b""),
        "sglang/old.py": ("delete", b"a\n"),
        "sglang/gone.py": ("delete", b""),
    }
    assert apply_file(fds["sglang/empty.py"], None).new == b""
    assert apply_file(fds["sglang/empty.py"], b"").state == "already-applied"
    assert apply_file(fds["sglang/gone.py"], b"").state == "deletes"
    assert apply_file(fds["sglang/gone.py"], b"x\n").state == "conflict"


def test_diff_N_epoch_dates_mean_create_and_delete(tmp_path):
    """GNU diff -N names both sides and dates the missing one at the epoch, in the local zone."""
    import shutil
    import subprocess

    if not shutil.which("diff"):
        pytest.skip("GNU diff not installed")
    (tmp_path / "a" / "sglang").mkdir(parents=True)
    (tmp_path / "b" / "sglang").mkdir(parents=True)
    (tmp_path / "a" / "sglang" / "old.py").write_bytes(b"q = 1\n")
    (tmp_path / "b" / "sglang" / "new.py").write_bytes(b"x = 1\ny = 2\n")
    (tmp_path / "a" / "sglang" / "kept.py").write_bytes(b"1\n2\n3\n")
    (tmp_path / "b" / "sglang" / "kept.py").write_bytes(b"1\n2\n2.5\n3\n")
    for tz in ("UTC", "America/New_York", "Asia/Kolkata"):
        out = subprocess.run(["diff", "-Naur", "a", "b"], cwd=tmp_path, capture_output=True, text=True,
                             env={"TZ": tz, "PATH": "/usr/bin:/bin"}).stdout
        fds = {f.path: f for f in parse_diff(out, "n.diff")}
        assert {p: f.op for p, f in fds.items()} == {
            "sglang/new.py": "create", "sglang/old.py": "delete", "sglang/kept.py": "modify"}, (tz, out)
        assert fds["sglang/new.py"].content == b"x = 1\ny = 2\n"
        assert apply_file(fds["sglang/old.py"], b"q = 1\n").state == "deletes"


def test_a_whole_file_hunk_with_real_dates_is_not_a_create():
    # diff -u of an existing empty file: no context, so refused as today (it is not a creation)
    d = ("--- a/sglang/x.py\t2024-01-01 00:00:00.000000000 +0000\n"
         "+++ b/sglang/x.py\t2024-01-02 00:00:00.000000000 +0000\n@@ -0,0 +1 @@\n+a\n")
    refuse(d, "no context")


def test_refuse_damaged_create_and_delete():
    refuse("--- /dev/null\n+++ b/sglang/new.py\n@@ -1,2 +1,3 @@\n a\n+x\n b\n",
           "the diff creates sglang/new.py, but hunk 1 (@@ -1,2 +1,3 @@) is not one hunk of added lines", line=3)
    refuse("--- a/sglang/old.py\n+++ /dev/null\n@@ -1,2 +1,1 @@\n a\n-b\n",
           "the diff deletes sglang/old.py, but hunk 1 (@@ -1,2 +1,1 @@) is not one hunk of removed lines", line=3)
    refuse("--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1,1 @@\n+a\n@@ -0,0 +2,1 @@\n+b\n", "in 2 hunks")
    refuse("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1,1 @@\n+a\n", "both file headers are /dev/null")
    refuse(
        "diff --git a/sglang/new.py b/sglang/new.py\nnew file mode 100755\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1,1 @@\n+a\n",
        "creates 'b/sglang/new.py' with mode 100755", "mode and owner of the files beside it", line=1)


@pytest.mark.parametrize("path, needle", [
    ("b/sglang/../../etc/cron.d/x", "'..'"),
    ("/etc/cron.d/x", "absolute"),
    ("b/torch/x.py", "outside the sglang/ package"),
    ("b/sglang/srt/__pycache__/x.cpython-310.pyc", "__pycache__"),
    ('"b/sglang/x\\npy"', "control character"),
])
def test_created_and_deleted_paths_keep_the_path_rules(path, needle):
    refuse(f"--- /dev/null\n+++ {path}\n@@ -0,0 +1 @@\n+a\n", needle, line=2)
    refuse(f"--- {path.replace('b/', 'a/', 1)}\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", needle, line=2)


def test_refuse_crlf_diff_before_anything_else():
    d = ("--- a/sglang/x.py\n+++ b/sglang/x.py\n" + GOOD_HUNK).replace("\n", "\r\n")
    err = refuse(d, "Windows (CRLF, \\r\\n) line endings", "dos2unix", "end in LF", line=3)
    assert err.path is None
    git = ("diff --git a/sglang/x.py b/sglang/x.py\nindex 1..2 100644\n--- a/sglang/x.py\n+++ b/sglang/x.py\n"
           + GOOD_HUNK).replace("\n", "\r\n")
    refuse(git, "CRLF", line=1)
    # converted in part (one header line): still refused, and says how much is LF
    part = "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,2 +1,3 @@\r\n a\n+x\n b\n"
    refuse(part, "CRLF", "(5 of its 6 lines end in LF)", line=3)
    # a CR in a header path alone (no hunk header): named as a CR
    refuse("--- a/sglang/x.py\r\n+++ b/sglang/x.py\r\n", "carriage return")


def test_refuse_rename_and_copy():
    refuse(
        "diff --git a/sglang/a.py b/sglang/b.py\nsimilarity index 100%\nrename from sglang/a.py\n"
        "rename to sglang/b.py\n",
        "renames",
    )
    refuse(
        "diff --git a/sglang/a.py b/sglang/b.py\nsimilarity index 90%\nrename from sglang/a.py\n"
        "rename to sglang/b.py\n--- a/sglang/a.py\n+++ b/sglang/b.py\n" + GOOD_HUNK,
        "renames",
    )
    refuse("--- a/sglang/a.py.orig\n+++ b/sglang/a.py\n" + GOOD_HUNK, "renames")


def test_refuse_mode_change():
    refuse(
        "diff --git a/sglang/a.py b/sglang/a.py\nold mode 100644\nnew mode 100755\n"
        "--- a/sglang/a.py\n+++ b/sglang/a.py\n" + GOOD_HUNK,
        "mode",
    )
    refuse("diff --git a/sglang/a.py b/sglang/a.py\nold mode 100644\nnew mode 100755\n", "mode")


@pytest.mark.parametrize("text", ["", "   \n\n", "\n"])
def test_refuse_empty(text):
    refuse(text, "empty")


@pytest.mark.parametrize("text", [
    "hello world\nthis is not a diff\n",
    "--- a/sglang/x.py\n",
    "Subject: a mail without a diff\n\nbody\n",
])
def test_refuse_garbage(text):
    refuse(text, "no file changes found")


def test_refuse_malformed_hunks_with_line_numbers():
    # too short
    refuse("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,3 +1,4 @@\n a\n+x\n", "not a valid unified diff")
    # garbage line inside a hunk
    refuse("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,3 +1,4 @@\n a\n+x\n?? b\n c\n",
           "not a valid unified diff", line=6)
    # hunk without file header
    refuse("@@ -1,2 +1,3 @@\n a\n+x\n b\n", "not a valid unified diff", line=1)
    # malformed hunk header
    refuse("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -eighty-nine +ninety @@\n a\n+x\n", "malformed hunk header",
           line=3)
    # file header without hunks
    refuse("--- a/sglang/x.py\n+++ b/sglang/x.py\n", "no hunks", line=2)


def test_refuse_hunk_without_context():
    refuse("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -3,0 +4,1 @@\n+x\n", "no context", line=3)
    refuse("--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -3,1 +3,1 @@\n-y\n+x\n", "no context")


def test_refuse_out_of_order_or_overlapping_hunks():
    d = ("--- a/sglang/x.py\n+++ b/sglang/x.py\n"
         "@@ -10,2 +10,3 @@\n a\n+x\n b\n"
         "@@ -5,2 +5,3 @@\n c\n+y\n d\n")
    refuse(d, "hunk 2", "must be in order", line=7)


def test_refuse_duplicate_file_entries():
    one = "--- a/sglang/x.py\n+++ b/sglang/x.py\n" + GOOD_HUNK
    refuse(one + one.replace("@@ -1,2 +1,3 @@", "@@ -10,2 +10,3 @@"), "appears twice")


def test_refuse_localized_no_newline_marker_is_understood():
    d = "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ Kein Zeilenumbruch am Dateiende.\n"
    fd = parse_diff(d, "p.diff")[0]
    assert fd.hunks[0].target_lines == ["a\n", "c"]


def test_real_git_diff_output(tmp_path, v1_bytes):
    """`git diff` in an SGLang-repo layout (python/sglang/...), CRLF + no-EOL file included."""
    import shutil
    import subprocess

    git = shutil.which("git")
    if not git:
        pytest.skip("git not installed")
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null", "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def run(*args):
        return subprocess.run([git, *args], cwd=tmp_path, env=env, check=True, capture_output=True).stdout

    run("init", "-q")
    f1 = tmp_path / "python" / V1
    f2 = tmp_path / "python" / "sglang" / "crlf.py"
    f1.parent.mkdir(parents=True)
    f1.write_bytes(v1_bytes)
    crlf = b"a = 1\r\nb = 2\r\nc = 3\r\nd = 4"  # CRLF and no final newline
    f2.write_bytes(crlf)
    run("add", "-A")
    run("commit", "-q", "-m", "base")
    new1 = joined(modify_v1(lines_of(v1_bytes)))
    new2 = b"a = 1\r\nb = 2\r\nc = 30\r\nd = 4\r\n"
    f1.write_bytes(new1)
    f2.write_bytes(new2)
    diff = run("diff").decode("utf-8", "surrogateescape")
    assert "\\ No newline at end of file" in diff
    fds = {f.path: f for f in parse_diff(diff, "git.diff")}
    assert set(fds) == {V1, "sglang/crlf.py"}
    assert apply_file(fds[V1], v1_bytes).new == new1
    r = apply_file(fds["sglang/crlf.py"], crlf)
    assert r.state == "applies" and r.new == new2
    assert apply_file(fds["sglang/crlf.py"], new2).state == "already-applied"


def test_real_git_diff_creating_and_deleting_files(tmp_path, v1_bytes):
    """`git diff --staged` of a new file, a deleted file and a changed one, applied back to the tree."""
    import shutil
    import subprocess

    git = shutil.which("git")
    if not git:
        pytest.skip("git not installed")
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null", "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def run(*args):
        return subprocess.run([git, *args], cwd=tmp_path, env=env, check=True, capture_output=True).stdout

    run("init", "-q")
    pkg = tmp_path / "python" / "sglang" / "srt" / "speculative"
    pkg.mkdir(parents=True)
    (tmp_path / "python" / V1).write_bytes(v1_bytes)
    old = b"# helper that the patch removes\ndef f():\n    return 1\n"
    (pkg / "old_helper.py").write_bytes(old)
    run("add", "-A")
    run("commit", "-q", "-m", "base")
    new1 = joined(modify_v1(lines_of(v1_bytes)))
    (tmp_path / "python" / V1).write_bytes(new1)
    created = b"def beacon():\n    return 'fleetpatch'"  # no final newline
    (pkg / "beacon.py").write_bytes(created)
    (pkg / "old_helper.py").unlink()
    run("add", "-A")
    diff = run("diff", "--staged").decode()
    fds = {f.path: f for f in parse_diff(diff, "git.diff")}
    new_path = "sglang/srt/speculative/beacon.py"
    old_path = "sglang/srt/speculative/old_helper.py"
    assert {p: f.op for p, f in fds.items()} == {V1: "modify", new_path: "create", old_path: "delete"}
    assert apply_file(fds[new_path], None).new == created
    assert apply_file(fds[old_path], old).state == "deletes"
    assert apply_file(fds[V1], v1_bytes).new == new1
    # the patched tree: every entry is already applied
    assert apply_file(fds[new_path], created).state == "already-applied"
    assert apply_file(fds[old_path], None).state == "already-applied"
    assert apply_file(fds[V1], new1).state == "already-applied"
