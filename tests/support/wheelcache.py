"""The engines' wheels that fast-tier tests read from the machine's cache, and their fetch.

The fast tier never downloads: a test whose wheel is not cached skips. The e2e tier fetches
every release, but in one run of the whole suite on a fresh machine a fast test can come
before it and skip, so `.ci/run` fetches these first (`python3 tests/support/wheelcache.py`).
"""
from __future__ import annotations

import sys

# the releases the fast tier's vLLM tests read (tests/fast/test_vllm_*.py take theirs from here)
VLLM_RELEASES = ("0.10.2", "0.11.0", "0.20.2", "0.27.0", "0.33.0", "0.34.0")
SGLANG_WHEELS = ("0.5.9",)   # tests/fast/test_vllm_members.py serves it by HTTP range


def fetch() -> list[str]:
    """Fetch what is not cached yet; returns what could not be fetched (offline: those tests skip)."""
    from fleetpatch.engines import sglang_wheel, vllm_wheel

    missed = []
    for version in VLLM_RELEASES:
        try:
            vllm_wheel.members(version)
        except RuntimeError as e:
            missed.append(str(e))
    for version in SGLANG_WHEELS:
        try:
            sglang_wheel.download(version)
        except (RuntimeError, OSError) as e:
            missed.append(f"sglang=={version}: {e}")
    return missed


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="Fetch the engine wheels that fast-tier tests read, where this "
                                        "machine's cache lacks them (offline: those tests skip).").parse_args()
    missed = fetch()
    for line in missed:
        print(f"wheelcache: {line}; the fast tests that read it skip", file=sys.stderr)
    sys.exit(0)
