"""The laptop's cache of splice hints (probe/splice.py) across runs.

Working out a hint parses the patched file: about 20 ms for the two 1000-line
workers of the shipped patch, between a host's pre-flight read and its write, on
every rollout. The answer depends only on the file's bytes, the added lines, the
code that works it out and the Python that parses it, so it is kept under a key
made of all four, in $FLEETPATCH_CACHE (else $XDG_CACHE_HOME/fleetpatch, else
~/.cache/fleetpatch)/splice-hints, one small JSON file per hint.

An entry that cannot be read, or does not have the shape of a hint for these
bytes, is worked out again; a cache that cannot be written costs the parse and
nothing else. A wrong hint could only ever cost proof (the host then rewrites the
whole module, or the probe reports the lines as not run), never a changed file.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from ..cacheroot import cache_root

FORMAT = b"fleetpatch splice hint 1"


def default_dir() -> Path:
    return cache_root() / "splice-hints"


def code_tag() -> bytes:
    """What a hint's answer depends on besides its input: the modules that work it out, and the
    Python that parses the file."""
    here = Path(__file__).resolve().parent
    tag = hashlib.sha256(FORMAT + repr(sys.version_info[:2]).encode())
    for name in ("splice.py", "guards.py"):
        tag.update((here / name).read_bytes())
    return tag.digest()


class HintStore:
    """One directory of hints; `get` and `put` never raise."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or default_dir()
        self._tag: bytes | None = None

    def key(self, source_sha: bytes, lines: tuple) -> str:
        if self._tag is None:
            self._tag = code_tag()
        return hashlib.sha256(self._tag + source_sha + repr(lines).encode()).hexdigest()

    def get(self, source_sha: bytes, lines: tuple):
        """(True, hint) for a kept answer (a hint, or None: no splice for these bytes);
        (False, None) when there is none that checks out."""
        try:
            with open(self.directory / (self.key(source_sha, lines) + ".json"), "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError):
            return False, None
        found = doc.get("hint") if isinstance(doc, dict) else None
        if found is None and isinstance(doc, dict) and "hint" in doc:
            return True, None
        return (True, found) if well_formed(found, source_sha.hex(), lines) else (False, None)

    def put(self, source_sha: bytes, lines: tuple, found) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            final = self.directory / (self.key(source_sha, lines) + ".json")
            tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"hint": found}, f)
            os.replace(tmp, final)
        except OSError:
            pass


def well_formed(found, source_hex: str, lines: tuple) -> bool:
    """A hint for these bytes: sorted disjoint line ranges that hold every added line, and names."""
    if not isinstance(found, dict) or found.get("sha256") != source_hex:
        return False
    keep, imports, holders = found.get("keep"), found.get("imports"), found.get("holders")
    if not all(isinstance(names, list) and all(isinstance(n, str) for n in names) for names in (imports, holders)):
        return False
    if not isinstance(keep, list):
        return False
    last = 0
    for pair in keep:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(n) is int for n in pair)
                and last < pair[0] <= pair[1]):
            return False
        last = pair[1]
    return all(any(first <= n <= end for first, end in keep) for n in lines)
