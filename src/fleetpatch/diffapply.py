"""Pure unified-diff handling: parse (with unidiff), then classify and apply on bytes.

Nothing here touches a host, the clock or the file system. `parse_diff` turns
the text of a ``.diff`` file into `FileDiff` records (paths normalized to
``sglang/...``, every refusal a `DiffError`); `apply_file` takes the original
bytes of one file (None: the file does not exist) and says what the diff would
do to it: ``applies`` (with the new bytes and any line offsets), ``creates``,
``deletes``, ``already-applied`` or ``conflict`` (with the first differing line).

File operations (`FileDiff.op`):

- ``modify``: the file exists and its hunks are applied as below.
- ``create``: the diff's source is ``/dev/null`` (``git diff``'s ``new file
  mode``), or its one hunk is ``-0,0`` with the epoch timestamp that
  ``diff -N`` writes. One hunk of added lines (none for an empty file);
  `FileDiff.content` is the whole new file. `apply_file` says ``creates`` (with
  `FileResult.new` the bytes to write) when the file is absent,
  ``already-applied`` when it exists with exactly those bytes, else
  ``conflict``. The diff may not give the new file a mode other than 100644:
  the host gives it the mode and owner of the files beside it.
- ``delete``: the diff's target is ``/dev/null`` (or its one hunk is ``+0,0``
  with the epoch timestamp). One hunk of removed lines (none for an empty
  file); `FileDiff.content` is the whole file as it must be before deletion.
  `apply_file` says ``deletes`` (`FileResult.new` is None) when the file has
  exactly those bytes, ``already-applied`` when it is absent, else
  ``conflict``: a file is only deleted when it is byte for byte the one the
  diff was made from, so that rollback can restore it from the host's backup.

Rules:

- A hunk matches its context exactly: no fuzz, no whitespace folding, line
  endings included. A hunk may sit at another line than its header says
  (an *offset*); the match nearest to the expected position wins, where the
  expected position is the header's line shifted by the previous hunk's offset.
- A hunk whose context is cut short on one side (diff tools do that only
  where the file ends) must sit at that end of the file: at line 1 when it
  starts there with less context before its changes than after, at the last
  line when it has less context after than before or a side of it lacks the
  final newline. This is how GNU ``patch -F0`` places hunks (except that GNU
  patch lets a hunk whose patched side alone lacks the final newline sit
  anywhere, then quietly keeps the newline); the property tests
  (tests/fast/test_diff_properties.py) hold diffapply to GNU patch's results.
- Hunks apply in order and never overlap.
- ``already-applied`` when every hunk's post-image is found (same search) and
  the pre-images are not all found. When both the complete pre-image and the
  complete post-image are present, the file is ambiguous and reported as a
  conflict rather than risking a second application.
- Bytes are decoded as UTF-8 with ``surrogateescape`` and re-encoded the same
  way, so any file (CRLF, invalid UTF-8, no final newline) round-trips byte for
  byte. Lines are split on ``\\n`` only; a ``\\r`` stays part of its line.
- A diff whose own structure lines (``@@`` hunk headers, ``diff --git``) end in
  CRLF was converted to Windows line endings after it was made (an editor, or
  git's ``core.autocrlf``); it is refused before any host is asked, since no
  hunk of it would match an LF file. A diff *of* a CRLF file keeps LF
  structure lines (as ``git diff`` and ``diff -u`` write it) and is applied;
  but a hunk line ending in CRLF for a file that the engine profile knows to
  end its lines in LF (`refuse_crlf_hunks`) is a diff whose hunk lines alone
  were converted, and is refused before any host is asked too.
- Paths: inside the package, no ``..``, not absolute, no control characters,
  no ``__pycache__``.
"""
from __future__ import annotations

import dataclasses
import datetime
import posixpath
import re
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from .errors import UsageError

__all__ = [
    "MODIFY",
    "CREATE",
    "DELETE",
    "DiffError",
    "Hunk",
    "FileDiff",
    "FileResult",
    "AppliedFiles",
    "parse_diff",
    "apply_file",
    "split_lines",
    "describe_offsets",
    "refuse_crlf_hunks",
]

_DEV_NULL = "/dev/null"
_NO_NEWLINE = "\\ No newline at end of file"
_RE_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")
_RE_HEADER_CORE = re.compile(r"^(@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@)")
_RE_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_RE_TIMESTAMP = re.compile(r"^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?: ?([+-])(\d\d):?(\d\d))?$")
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"


class DiffError(UsageError):
    """A diff fleetpatch refuses (exit 2). str() names the origin file, the diff line and what to do."""

    def __init__(self, origin: str, line: Optional[int], reason: str, path: Optional[str] = None):
        self.origin = origin
        self.line = line
        self.reason = reason
        self.path = path
        where = f"{origin}: line {line}" if line else origin
        super().__init__(f"{where}: {reason}")


@dataclass
class Hunk:
    source_start: int          # 1-based line in the original, as the header says
    source_lines: List[str]    # context + removed lines, each WITH its line ending
    target_lines: List[str]    # context + added lines, each WITH its line ending
    header: str                # "@@ -a,b +c,d @@ section"
    diff_line: int             # line number of the @@ header inside the .diff file
    target_start: int = 0      # 1-based line in the patched file, as the header says
    prefix_context: int = 0    # context lines before the first change
    suffix_context: int = 0    # context lines after the last change
    crlf_line: Optional[int] = None   # line of the .diff of the hunk's first line ending in CRLF

    @property
    def short_header(self) -> str:
        """The header without its section text: "@@ -120,7 +120,9 @@"."""
        m = _RE_HEADER_CORE.match(self.header)
        return m.group(1) if m else self.header

    @property
    def touches_eof(self) -> bool:
        """True when either side ends without a final newline (the hunk must end at EOF)."""
        return any(block and not block[-1].endswith("\n") for block in (self.source_lines, self.target_lines))

    def anchor(self, post: bool = False) -> Optional[str]:
        """"start" or "end" when the hunk must sit at that end of the file, else None.

        A diff tool cuts a hunk's context short only where the file ends, so less
        context before than after (in a hunk at line 1) means "the start of the
        file", less after than before means "the end of the file", exactly as
        GNU patch without fuzz reads it. A missing final newline means the end too."""
        start = self.target_start if post else self.source_start
        if self.prefix_context < self.suffix_context and start <= 1:
            return "start"
        if self.suffix_context < self.prefix_context or self.touches_eof:
            return "end"
        return None


MODIFY, CREATE, DELETE = "modify", "create", "delete"


@dataclass
class FileDiff:
    path: str                  # normalized: "sglang/srt/..." (a/ b/ and python/ prefixes stripped)
    raw_path: str              # as written in the diff (the side that is not /dev/null)
    hunks: List[Hunk]
    diff_line: int = 0         # line of the diff where this file's entry starts
    op: str = MODIFY           # "modify" | "create" | "delete" (see the module docstring)

    @property
    def content(self) -> Optional[bytes]:
        """create: the new file's bytes; delete: the bytes the file must have; modify: None."""
        if self.op == CREATE:
            return "".join(ln for h in self.hunks for ln in h.target_lines).encode(_ENCODING, _ERRORS)
        if self.op == DELETE:
            return "".join(ln for h in self.hunks for ln in h.source_lines).encode(_ENCODING, _ERRORS)
        return None


@dataclass
class FileResult:
    path: str
    state: str                 # "applies" | "creates" | "deletes" | "already-applied" | "conflict"
    new: Optional[bytes]       # the bytes to write: patched ("applies") or the whole new file ("creates")
    offsets: List[int]         # per hunk: actual start - header start (0 = exact; always 0 for create/delete)
    detail: str                # conflict: which hunk, expected vs found (first differing line)


# --------------------------------------------------------------------------- parsing


def split_lines(text: str) -> List[str]:
    """Split on "\\n" only, keeping it; "".join(split_lines(t)) == t for every t."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


class _Counter:
    """Feeds lines to unidiff and remembers how far it got (for error line numbers)."""

    def __init__(self, lines: Sequence[str]):
        self.lines = lines
        self.n = 0

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            self.n += 1
            yield line


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(path: str) -> str:
    """Undo git's C-style quoting of unusual paths ("a/caf\\303\\251.py")."""
    if not (len(path) >= 2 and path.startswith('"') and path.endswith('"')):
        return path
    body = path[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and re.match(r"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
        out.extend(c.encode(_ENCODING, _ERRORS))
        i += 1
    return out.decode(_ENCODING, _ERRORS)


def _normalize_path(raw: str, package: str, origin: str, line: int) -> str:
    """'a/python/sglang/srt/x.py' -> 'sglang/srt/x.py'; refuse anything that could leave the package."""
    path = _unquote(raw)
    fix = (f"paths must name a file inside the {package} package, e.g. "
           f"'a/{package}/srt/server_args.py' or 'python/{package}/srt/server_args.py'")
    if not path.strip():
        raise DiffError(origin, line, f"a file header names no path; {fix}", raw)
    if "\\" in path or "\x00" in path:
        raise DiffError(origin, line, f"path {raw!r} contains a backslash or NUL; {fix}", raw)
    if _RE_CONTROL.search(path):
        cr = " (a carriage return: the diff has CRLF line endings; convert it to LF)" if "\r" in path else ""
        raise DiffError(origin, line, f"path {raw!r} contains a control character{cr}; {fix}", raw)
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path) or path.startswith("~"):
        raise DiffError(origin, line, f"path {raw!r} is absolute; {fix}", raw)
    parts = path.split("/")
    if ".." in parts:
        raise DiffError(origin, line, f"path {raw!r} contains '..'; {fix}", raw)
    parts = [p for p in parts if p not in ("", ".")]

    def rooted(ps: List[str]) -> bool:
        return (len(ps) >= 2 and ps[0] == package) or (len(ps) >= 3 and ps[0] == "python" and ps[1] == package)

    if len(parts) >= 3 and parts[0] in ("a", "b") and rooted(parts[1:]):
        parts = parts[1:]
    if len(parts) >= 3 and parts[0] == "python" and parts[1] == package:
        parts = parts[1:]
    if not (len(parts) >= 2 and parts[0] == package):
        raise DiffError(origin, line, f"path {raw!r} is outside the {package}/ package; {fix}", raw)
    if "__pycache__" in parts:
        raise DiffError(origin, line, f"path {raw!r} is inside __pycache__: bytecode is Python's cache, not "
                                      f"source; patch the .py file instead", raw)
    return posixpath.join(*parts)


def _is_epoch(timestamp: Optional[str]) -> bool:
    """True for the Unix epoch in any zone: `diff -N` dates a missing file so ("1970-01-01 00:00:00 +0000")."""
    m = _RE_TIMESTAMP.match((timestamp or "").strip())
    if not m:
        return False
    y, mo, d, h, mi, sec = (int(x) for x in m.group(1, 2, 3, 4, 5, 6))
    if m.group(7) and int(m.group(7)):
        return False
    try:
        when = datetime.datetime(y, mo, d, h, mi, sec)
    except ValueError:
        return False
    if m.group(8):
        zone = datetime.timedelta(hours=int(m.group(9)), minutes=int(m.group(10)))
        when -= zone if m.group(8) == "+" else -zone
    return when == datetime.datetime(1970, 1, 1)


def _build_hunk(uhunk, lines: Sequence[str], origin: str, path: str, number: int, op: str = MODIFY) -> Hunk:
    body = [ln for ln in uhunk if ln.line_type in ("+", "-", " ", "\\")]
    numbered = [ln.diff_line_no for ln in body if ln.diff_line_no]
    header_line = (numbered[0] - 1) if numbered else 0
    header = lines[header_line - 1].rstrip("\r\n") if header_line >= 1 else str(uhunk).split("\n", 1)[0]
    items: List[List[str]] = []
    for ln in body:
        if ln.line_type == "\\":
            if not items:
                raise DiffError(origin, ln.diff_line_no or header_line,
                                f"'{_NO_NEWLINE}' before any line in hunk {number} of {path}", path)
            prev = items[-1]
            if prev[1].endswith("\n"):
                prev[1] = prev[1][:-1]
            continue
        items.append([ln.line_type, ln.value])
    kinds = "".join(t for t, _ in items)
    prefix = len(kinds) - len(kinds.lstrip(" "))
    suffix = len(kinds) - len(kinds.rstrip(" ")) if prefix < len(kinds) else 0
    source = [v for t, v in items if t in (" ", "-")]
    target = [v for t, v in items if t in (" ", "+")]
    if op != MODIFY:
        want, verb, shape = ("+", "creates", "-0,0 +1,N") if op == CREATE else ("-", "deletes", "-1,N +0,0")
        empty_side_start = uhunk.source_start if op == CREATE else uhunk.target_start
        if number > 1 or empty_side_start != 0 or any(t != want for t, _ in items):
            core = _RE_HEADER_CORE.match(header)
            raise DiffError(
                origin, header_line,
                f"the diff {verb} {path}, but hunk {number} ({core.group(1) if core else header}) is not one hunk of "
                f"{'added' if op == CREATE else 'removed'} lines ('@@ {shape} @@'); the diff is damaged: "
                "regenerate it (git diff, or diff -N -u)", path)
    elif not any(t == " " for t, _ in items):
        raise DiffError(
            origin, header_line,
            f"hunk {number} of {path} has no context lines; fleetpatch matches context exactly and "
            "needs it: regenerate the diff with context (git diff, or diff -u)", path)
    for side, block in (("original", source), ("patched", target)):
        if any(not v.endswith("\n") for v in block[:-1]):
            raise DiffError(origin, header_line,
                            f"hunk {number} of {path}: '{_NO_NEWLINE}' on a line that is not the last "
                            f"of the {side} side; the diff is damaged", path)
    return Hunk(
        source_start=uhunk.source_start,
        source_lines=source,
        target_lines=target,
        header=header,
        diff_line=header_line,
        target_start=uhunk.target_start,
        prefix_context=prefix,
        suffix_context=suffix,
        crlf_line=next((ln.diff_line_no for ln in body if ln.line_type != "\\" and ln.value.endswith("\r\n")),
                       None),
    )


def _read_patchset(text: str, origin: str) -> tuple:
    """The diff's lines (no-newline markers normalised) and unidiff's PatchSet of them."""
    if not text.strip():
        raise DiffError(origin, None, "the diff is empty; expected a unified diff (git diff, or diff -u)")
    if not text.endswith("\n"):
        text += "\n"  # a missing final newline of the .diff file itself means nothing
    lines = split_lines(text)
    _refuse_crlf(lines, origin)
    # Any "\ ..." line is a no-newline marker in a unified diff, whatever language diff spoke.
    lines = [(_NO_NEWLINE + "\n") if ln.startswith("\\ ") else ln for ln in lines]
    for no, ln in enumerate(lines, 1):
        if ln.startswith("@@") and not _RE_HUNK_HEADER.match(ln):
            raise DiffError(origin, no, f"malformed hunk header {ln.rstrip()!r}; expected '@@ -l,n +l,n @@'")
    counter = _Counter(lines)
    try:
        patch = PatchSet(counter)
    except UnidiffParseError as exc:
        raise DiffError(origin, counter.n, f"not a valid unified diff: {exc}".rstrip()) from exc
    except UnicodeError as exc:  # pragma: no cover - text is already str
        raise DiffError(origin, counter.n, f"cannot decode the diff: {exc}") from exc
    if not len(patch):
        raise DiffError(origin, None,
                        "no file changes found: not a unified diff (expected '--- a/<path>', "
                        "'+++ b/<path>' and '@@ -l,n +l,n @@' hunks)")

    return lines, patch


def _file_diff(pf, lines: List[str], origin: str, package: str, seen: Dict[str, int]) -> FileDiff:
    """One file of the diff, checked: the path inside the package, one operation, ordered hunks."""
    at = pf.diff_line_no or 0
    src_raw = pf.source_file or ""
    tgt_raw = pf.target_file or ""
    shown = tgt_raw if tgt_raw and tgt_raw != _DEV_NULL else src_raw
    if pf.is_binary_file:
        raise DiffError(origin, at, f"binary diff for {shown!r}; fleetpatch patches text files only", shown)
    if pf.is_symlink or pf.is_submodule:
        raise DiffError(origin, at, f"{shown!r} is a symlink or submodule; fleetpatch patches regular files only",
                        shown)
    op = _operation(pf, origin, at, shown)
    # The /dev/null side names no file: the other side is the path (both, when diff -N wrote them).
    src = _normalize_path(shown if src_raw == _DEV_NULL else src_raw, package, origin, at)
    tgt = _normalize_path(shown if tgt_raw == _DEV_NULL else tgt_raw, package, origin, at)
    if src != tgt:
        raise DiffError(origin, at,
                        f"the diff renames or copies {src_raw!r} to {tgt_raw!r}; not supported: "
                        "both headers must name the same file", shown)
    if pf.source_mode and pf.target_mode and pf.source_mode != pf.target_mode:
        raise DiffError(origin, at,
                        f"the diff changes the mode of {shown!r} ({pf.source_mode} -> {pf.target_mode}); "
                        "fleetpatch keeps file modes: drop the mode change", shown)
    if op == CREATE and pf.target_mode and pf.target_mode != "100644":
        raise DiffError(origin, at,
                        f"the diff creates {shown!r} with mode {pf.target_mode}; fleetpatch gives a created "
                        "file the mode and owner of the files beside it: make it 100644", shown)
    if op == MODIFY and not len(pf):
        raise DiffError(origin, at, f"no hunks for {shown!r}; nothing to apply", shown)
    if op != MODIFY and len(pf) > 1:
        raise DiffError(origin, at,
                        f"the diff {'creates' if op == CREATE else 'deletes'} {shown!r} in {len(pf)} hunks; "
                        "a whole-file diff is one hunk: the diff is damaged, regenerate it", shown)
    if tgt in seen:
        raise DiffError(origin, at,
                        f"{tgt} appears twice in the diff (first at line {seen[tgt]}); "
                        "make one entry with all its hunks", shown)
    seen[tgt] = at
    hunks = [_build_hunk(h, lines, origin, tgt, i + 1, op) for i, h in enumerate(pf)]
    for i in range(1, len(hunks)):
        prev, cur = hunks[i - 1], hunks[i]
        if cur.source_start < prev.source_start + len(prev.source_lines):
            raise DiffError(origin, cur.diff_line,
                            f"hunk {i + 1} of {tgt} ({cur.short_header}) starts before hunk {i} ends "
                            f"({prev.short_header}); hunks must be in order and must not overlap", tgt)
    return FileDiff(path=tgt, raw_path=shown, hunks=hunks, diff_line=at, op=op)


def parse_diff(text: str, origin: str, package: str = "sglang") -> List[FileDiff]:
    """Parse a unified diff (git or plain) into per-file hunks; refuse what fleetpatch cannot apply safely."""
    lines, patch = _read_patchset(text, origin)
    seen: Dict[str, int] = {}
    return [_file_diff(pf, lines, origin, package, seen) for pf in patch]


def _refuse_crlf(lines: Sequence[str], origin: str) -> None:
    """A diff whose structure lines end in CRLF was converted after it was made: none of its hunks would match."""
    for no, ln in enumerate(lines, 1):
        if ln.endswith("\r\n") and (ln.startswith("@@") or ln.startswith("diff --git ")):
            lf = sum(1 for x in lines if x.endswith("\n") and not x.endswith("\r\n"))
            mixed = f" ({lf} of its {len(lines)} lines end in LF)" if lf else ""
            raise DiffError(
                origin, no,
                f"the diff has Windows (CRLF, \\r\\n) line endings{mixed}: its hunk and file headers end in \\r\\n, "
                "so it was converted after it was made (by an editor, or git's core.autocrlf), and none of its "
                "lines would match the engine's files, which end in LF (\\n). Convert the .diff to LF line endings "
                "(dos2unix FILE, or regenerate it with git diff) and rerun; a diff of a file that really has CRLF "
                "line endings keeps LF on its header lines, as git diff and diff -u write it")
def refuse_crlf_hunks(files: Sequence[FileDiff], origin: str, ending_of: Callable[[str], Optional[str]],
                      engine: str) -> None:
    """A hunk line ending in CRLF, for a file whose lines end in LF in every version the engine
    profile knows (`ending_of(path) == "\\n"`): its headers are LF, so `parse_diff` took it for
    a diff of a CRLF file, but only its hunk lines were converted (a copy and paste, an editor)
    and no host's file would match it."""
    for fd in files:
        if ending_of(fd.path) != "\n":
            continue
        for number, hunk in enumerate(fd.hunks, 1):
            if hunk.crlf_line is None:
                continue
            raise DiffError(
                origin, hunk.crlf_line,
                f"this line of hunk {number} of {fd.path} ends in CRLF (\\r\\n) while the diff's headers end in "
                f"LF, but {posixpath.basename(fd.path)} ends its lines in LF (\\n) in every {engine} version "
                "fleetpatch knows: the hunk's lines were converted to Windows line endings after the diff was made (by an "
                "editor, or a copy and paste), so no host's file would match them. Convert the .diff to LF line "
                "endings (dos2unix FILE, or regenerate it with git diff) and rerun", fd.path)


def _operation(pf, origin: str, at: int, shown: str) -> str:
    """modify, create or delete: /dev/null on one side (git), or diff -N's epoch-dated whole-file hunk."""
    src, tgt = pf.source_file or "", pf.target_file or ""
    if src == _DEV_NULL and tgt == _DEV_NULL:
        raise DiffError(origin, at, "both file headers are /dev/null: the entry names no file", shown)
    if src == _DEV_NULL:
        return CREATE
    if tgt == _DEV_NULL:
        return DELETE
    if len(pf) == 1:
        h = pf[0]
        if h.source_start == 0 and h.source_length == 0 and _is_epoch(pf.source_timestamp):
            return CREATE
        if h.target_start == 0 and h.target_length == 0 and _is_epoch(pf.target_timestamp):
            return DELETE
    return MODIFY


# --------------------------------------------------------------------------- applying


class _Text:
    """The original file as lines, with an index from line text to positions."""

    def __init__(self, lines: List[str]):
        self.lines = lines
        self._index: Optional[Dict[str, List[int]]] = None

    def positions(self, line: str) -> List[int]:
        if self._index is None:
            index: Dict[str, List[int]] = {}
            for i, ln in enumerate(self.lines):
                index.setdefault(ln, []).append(i)
            self._index = index
        return self._index.get(line, [])

    def matches_at(self, block: Sequence[str], pos: int) -> bool:
        return 0 <= pos and pos + len(block) <= len(self.lines) and self.lines[pos:pos + len(block)] == list(block)

    def find(self, block: Sequence[str], expected: int, floor: int = 0, anchor: Optional[str] = None) -> Optional[int]:
        """The start of `block` nearest to `expected` (ties: the later one), at or after `floor`;
        only at the start or the end of the file when `anchor` says so."""
        if not block:
            return None
        n = len(block)
        best: Optional[int] = None
        for pos in self.positions(block[0]):
            if pos < floor or pos + n > len(self.lines):
                continue
            if (anchor == "end" and pos + n != len(self.lines)) or (anchor == "start" and pos != 0):
                continue
            if not self.matches_at(block, pos):
                continue
            if best is None or (abs(pos - expected), pos < expected) < (abs(best - expected), best < expected):
                best = pos
        return best


def _search(text: _Text, hunks: Sequence[Hunk], post: bool) -> Tuple[List[int], Optional[int]]:
    """Place each hunk's pre-image (post=False) or post-image (post=True) in order.

    Returns (offsets of the placed hunks, index of the first hunk that could not be placed or None)."""
    offsets: List[int] = []
    drift = 0
    floor = 0
    for k, h in enumerate(hunks):
        block = h.target_lines if post else h.source_lines
        start = max((h.target_start if post else h.source_start) - 1, 0)
        pos = text.find(block, start + drift, floor, h.anchor(post))
        if pos is None:
            return offsets, k
        drift = pos - start
        offsets.append(drift)
        floor = pos + len(block)
    return offsets, None


def _show(line: Optional[str], other: Optional[str]) -> str:
    if line is None:
        return "end of file"
    # Show line endings only when they are what differs.
    if other is not None and line.rstrip("\r\n") == other.rstrip("\r\n") and line != other:
        s = repr(line)
    else:
        s = repr(line.rstrip("\n").rstrip("\r") if line.endswith("\n") else line)
    return s if len(s) <= 160 else s[:150] + "...'"


def _conflict_detail(text: _Text, hunks: Sequence[Hunk], k: int, offsets: Sequence[int]) -> str:
    h = hunks[k]
    drift = offsets[-1] if offsets else 0
    exp = max(h.source_start - 1, 0) + drift
    anchor = h.anchor()
    label = f"hunk {k + 1} ({h.short_header})"
    lines = text.lines
    detail = None
    for j, want in enumerate(h.source_lines):
        i = exp + j
        got = lines[i] if i < len(lines) else None
        if got != want:
            detail = f"{label}: line {i + 1} expected {_show(want, got)} found {_show(got, want)}"
            if got is not None and got.rstrip("\r\n") == want.rstrip("\r\n"):
                detail += " (only the line endings differ)"
            break
    if detail is None:
        # The pre-image is at the expected place but could not be used there.
        if anchor == "end" and exp + len(h.source_lines) != len(lines):
            detail = (f"{label}: the hunk changes the end of the file, but line {exp + len(h.source_lines) + 1} "
                      "follows it")
        elif anchor == "start" and exp != 0:
            detail = f"{label}: the hunk changes the start of the file, but here its lines start at line {exp + 1}"
        else:
            detail = f"{label}: its context at line {exp + 1} overlaps hunk {k}"
    notes = []
    floor = 0
    if k:
        prev = hunks[k - 1]
        floor = max(prev.source_start - 1, 0) + drift + len(prev.source_lines)
    if text.find(h.source_lines, exp, floor, anchor) is None:
        earlier = text.find(h.source_lines, exp, 0, anchor)
        loose = text.find(h.source_lines, exp, floor)
        if k and earlier is not None:
            notes.append(f"its context appears only at line {earlier + 1}, before hunk {k} ends")
        elif anchor and loose is not None:
            where = "start" if anchor == "start" else "end"
            notes.append(f"its lines appear at line {loose + 1}, but the diff puts this hunk at the {where} of the "
                         f"file (its context is cut short there)")
    applied = [i + 1 for i, hk in enumerate(hunks)
               if text.find(hk.target_lines, max(hk.target_start - 1, 0), 0, hk.anchor(post=True)) is not None
               and text.find(hk.source_lines, max(hk.source_start - 1, 0), 0, hk.anchor()) is None]
    if applied:
        which = ", ".join(str(i) for i in applied)
        notes.append(f"hunk{'s' if len(applied) > 1 else ''} {which} of {len(hunks)} already applied: "
                     "the file is partly patched or was changed by hand")
    if notes:
        detail += " (" + "; ".join(notes) + ")"
    return detail


def describe_offsets(offsets: Sequence[int]) -> str:
    """'' when every hunk is exact, else 'hunk 1 offset +3 lines, hunk 2 offset +3 lines'."""
    if not any(offsets):
        return ""
    parts = []
    for i, off in enumerate(offsets):
        if off:
            parts.append(f"hunk {i + 1} offset {off:+d} line{'s' if abs(off) != 1 else ''}")
    return ", ".join(parts)


def _first_difference(want: Sequence[str], got: Sequence[str]) -> str:
    """'line 3 expected 'a' found 'b'' for the first line where two whole files differ."""
    for i in range(max(len(want), len(got))):
        w = want[i] if i < len(want) else None
        g = got[i] if i < len(got) else None
        if w != g:
            text = f"line {i + 1} expected {_show(w, g)} found {_show(g, w)}"
            if w is not None and g is not None and w.rstrip("\r\n") == g.rstrip("\r\n"):
                eol = not w.endswith("\n") or not g.endswith("\n")
                text += " (only the newline at the end of the file differs)" if eol else " (only the line endings differ)"
            return text
    return "the files are equal"  # pragma: no cover - callers compare first


def _whole_file(fd: FileDiff, original: Optional[bytes]) -> FileResult:
    """A created or deleted file: all or nothing, byte for byte."""
    content = fd.content or b""
    zero = [0] * len(fd.hunks)
    if fd.op == CREATE:
        if original is None:
            return FileResult(fd.path, "creates", content, zero, "")
        if original == content:
            return FileResult(fd.path, "already-applied", None, zero, "")
        what = "it already exists" + (" (empty)" if not original else " with other content")
        verb = "creates"
    else:
        if original is None:
            return FileResult(fd.path, "already-applied", None, zero, "")
        if original == content:
            return FileResult(fd.path, "deletes", None, zero, "")
        what = "the file differs from the one the diff was made from"
        verb = "deletes"
    diff = _first_difference(split_lines(content.decode(_ENCODING, _ERRORS)),
                             split_lines(original.decode(_ENCODING, _ERRORS)))
    return FileResult(fd.path, "conflict", None, zero, f"the diff {verb} {fd.path}, but {what}: {diff}")


def apply_file(fd: FileDiff, original: Optional[bytes]) -> FileResult:
    """Classify `original` (None: the file does not exist) against the diff of one file; build the new bytes."""
    if fd.op != MODIFY:
        return _whole_file(fd, original)
    if original is None:
        return FileResult(fd.path, "conflict", None, [], f"{fd.path} does not exist, so the diff cannot change it")
    lines = split_lines(original.decode(_ENCODING, _ERRORS))
    text = _Text(lines)
    offsets, failed = _search(text, fd.hunks, post=False)
    if failed is None:
        post_offsets, post_failed = _search(text, fd.hunks, post=True)
        if post_failed is None:
            return FileResult(
                path=fd.path, state="conflict", new=None, offsets=offsets,
                detail=("ambiguous: both the original and the patched form of every hunk are present, "
                        "so the file may already be patched; regenerate the diff with more context "
                        "(git diff -U6)"))
        out: List[str] = []
        cursor = 0
        for h, off in zip(fd.hunks, offsets):
            pos = max(h.source_start - 1, 0) + off
            out.extend(lines[cursor:pos])
            out.extend(h.target_lines)
            cursor = pos + len(h.source_lines)
        out.extend(lines[cursor:])
        new = "".join(out).encode(_ENCODING, _ERRORS)
        return FileResult(path=fd.path, state="applies", new=new, offsets=offsets,
                          detail=describe_offsets(offsets))
    post_offsets, post_failed = _search(text, fd.hunks, post=True)
    if post_failed is None:
        return FileResult(path=fd.path, state="already-applied", new=None, offsets=post_offsets,
                          detail=describe_offsets(post_offsets))
    return FileResult(path=fd.path, state="conflict", new=None, offsets=offsets,
                      detail=_conflict_detail(text, fd.hunks, failed, offsets))


class AppliedFiles:
    """`apply_file`, once per distinct diff and original: the hosts of a fleet mostly hold
    the same engine files, so one run applies each diff to each distinct file once, not
    once per host. Keyed by content (every field of the diff, the original's bytes), never
    by an object's identity, so two diffs that differ in anything never share an entry.
    One per run (the run's Job holds it), shared by its host threads; each caller gets its
    own copy of the result (a caller may rewrite its detail)."""

    def __init__(self, most: int = 64):
        self.most = most    # distinct (diff, original) pairs kept; the oldest go all at once beyond it
        self._results: Dict[Tuple[str, Optional[bytes]], FileResult] = {}
        self._lock = threading.Lock()

    def apply(self, fd: FileDiff, original: Optional[bytes]) -> FileResult:
        key = (repr(fd), original)   # a dataclass's repr: every field, the hunks' lines included
        with self._lock:
            hit = self._results.get(key)
        if hit is None:   # a lost race only computes the same result twice
            hit = apply_file(fd, original)
            with self._lock:
                if len(self._results) >= self.most:
                    self._results.clear()
                self._results[key] = hit
        return dataclasses.replace(hit, offsets=list(hit.offsets))
