"""The compile-cache lines the vLLM profile recognises (engines/vllm.py COMPILED_CACHE_LINES) are
vLLM's own: each one's text is a literal of the real wheel's file at the line the profile records,
for every release it names (the wheels' vllm/compilation/*.py, fetched by HTTP range once per
machine by the stand-in's installer)."""
from __future__ import annotations

import re

import pytest

from fleetpatch.engines import vllm as vllm_profile
from fleetpatch_demo.standins.vllm import install

pytestmark = pytest.mark.pypi

CASES = [(sig, version, line) for sig in vllm_profile.COMPILED_CACHE_LINES for version, line in sig.lines]


def source_of(version: str, path: str) -> str:
    try:
        dirs = install.members_dirs(version)
    except OSError as e:      # offline and not cached: skipped, never faked
        pytest.skip(f"vllm {version} wheel members not available: {e}")
    for d in dirs:
        if (d / path).is_file():
            return (d / path).read_text(encoding="utf-8")
    pytest.fail(f"vllm {version}'s wheel has no {path}")


@pytest.mark.parametrize("sig,version,line", CASES, ids=lambda x: x if isinstance(x, (str, int)) else x.key)
def test_each_cache_line_is_the_wheels_own_at_its_line(sig, version, line):
    lines = source_of(version, sig.source).splitlines()
    # the format string may be split over adjacent literals: the line holds its start
    head = sig.text.split("(s)")[0] if "(s)" in sig.text else sig.text
    assert head in lines[line - 1], (version, sig.source, line, lines[line - 1])
    # and what vLLM prints from it (its %s filled in) is what the profile matches
    text = " ".join(re.findall(r'"([^"]*)"', "\n".join(lines[line - 1:line + 3])))
    printed = text.replace("%s", "", 1) if text.startswith("%s") else text
    printed = printed.replace("%s", "(1, 8192)").replace("%.3f", "1.250")
    assert sig.matches(printed), printed
