"""Where things are: the repository, the tests, the fixture patches."""
from __future__ import annotations

import hashlib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FIXTURE_PATCHES = TESTS / "fixtures" / "patches"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
