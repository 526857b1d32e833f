"""The agent keeps its install-time work on the watched modules (rewritten with their guards and
compiled, the sibling's counted names) in its state dir, keyed by the files' bytes, the added
lines and the build (issue 34): a file already seen costs a read. What a server start then loads
must be what it would have loaded without the cache, for the file as it is now."""
from __future__ import annotations

import json
import marshal
import os
import sys

import pytest

from fleetpatch.probe import install as probe_install
from support.probed_start import probed_start

MODULE = "def hot(x):\n    y = x + 1\n    return y  # added\n\n\ndef cold(x):\n    return x - 1\n"

needs_functions = pytest.mark.skipif(sys.version_info >= (3, 12), reason="functions mode runs on 3.8-3.11 by default")


def install(tmp_path, token, lines, cache):
    plan = {"version": 1, "mode": "functions",
            "modules": {"fp_cache_probed": {"path": "fp_cache_probed.py", "lines": lines,
                                            "expected": str(tmp_path / "mods" / "fp_cache_probed.py")}}}
    probe_install.remove(str(tmp_path / "site"))
    probe_install.install(str(tmp_path / "site"), str(tmp_path / ("probe-" + token)), token, plan,
                          cache_dir=str(cache) if cache else None)
    ready = marshal.loads((tmp_path / ("probe-" + token) / probe_install.PROBE_PLAN_NAME).read_bytes())
    return ready["modules"]["fp_cache_probed"]


def start(tmp_path, token, call):
    """One interpreter start that imports the module and calls `call`: (the records' names,
    whether the start had to import `ast`: it rewrote the module itself)."""
    out = probed_start(tmp_path, "import fp_cache_probed as m\nm.%s(1)\nprint('ast' in sys.modules)\n" % call)
    records = probe_install.read_records(str(tmp_path / ("probe-" + token)))
    return records, out.strip() == "True"


def lines_ran(records):
    out = set()
    for name, data in records.items():
        kind = name.split("/", 1)[1]
        if kind.startswith(("L-", "F-")):
            out |= {int(n) for n in json.loads(data).get("lines", [])}
    return out


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "mods" / "fp_cache_probed.py").write_text(MODULE)
    return tmp_path


@needs_functions
def test_a_file_seen_before_is_served_from_the_cache_with_its_stat_of_now(tree):
    cache = tree / "state" / "probe-plans"
    first = install(tree, "one", [3], cache)
    assert len(os.listdir(cache)) == 1
    # the same bytes, touched: the entry is used, and the stat the start checks is today's
    path = tree / "mods" / "fp_cache_probed.py"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10 ** 9))
    second = install(tree, "two", [3], cache)
    assert len(os.listdir(cache)) == 1
    st = path.stat()
    assert second["compiled"]["stat"] == [st.st_ino, st.st_size, st.st_mtime_ns] != first["compiled"]["stat"]
    assert second["compiled"]["table"] == first["compiled"]["table"]
    assert (tree / "probe-two" / second["compiled"]["file"]).read_bytes() == \
        (tree / "probe-one" / first["compiled"]["file"]).read_bytes()
    records, rewrote = start(tree, "two", "hot")
    assert 3 in lines_ran(records), sorted(records)
    assert not rewrote      # the cached compiled module was loaded


@needs_functions
def test_other_bytes_or_other_lines_are_worked_out_anew(tree):
    cache = tree / "state" / "probe-plans"
    install(tree, "one", [3], cache)
    moved = install(tree, "two", [7], cache)      # another line of the same file
    assert len(os.listdir(cache)) == 2
    records, rewrote = start(tree, "two", "cold")
    assert 7 in lines_ran(records) and not rewrote, sorted(records)
    # the file edited (a line in front): the entry of the old bytes must not be used
    path = tree / "mods" / "fp_cache_probed.py"
    path.write_text("import os\n" + MODULE)
    edited = install(tree, "three", [4], cache)
    assert len(os.listdir(cache)) == 3 and edited["compiled"]["table"] != moved["compiled"]["table"]
    records, rewrote = start(tree, "three", "hot")
    assert 4 in lines_ran(records) and not rewrote, sorted(records)


@needs_functions
def test_a_torn_cache_entry_is_worked_out_again(tree):
    cache = tree / "state" / "probe-plans"
    install(tree, "one", [3], cache)
    (entry,) = os.listdir(cache)
    (cache / entry).write_bytes(b"\x00torn")
    again = install(tree, "two", [3], cache)
    assert again.get("compiled")
    records, rewrote = start(tree, "two", "hot")
    assert 3 in lines_ran(records) and not rewrote, sorted(records)
