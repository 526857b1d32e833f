"""Hostile input: generated hosts.yaml, patch.yaml and .diff files (hypothesis).

The documents are valid ones with random damage (a value of any type, shape or
size in any place, keys dropped, renamed or added), YAML text with its bytes
mangled, and random diff-like text. The only outcomes allowed are a valid
result or a usage error (exit 2) whose message starts with the file and, when
the document is a mapping, names the key; never another exception.
"""
from __future__ import annotations

import copy
import datetime
import math
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import note as _hypothesis_note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from fleetpatch.diffapply import DiffError, apply_file, parse_diff
from fleetpatch.engines import sglang
from fleetpatch.errors import UsageError
from fleetpatch.inventory import RESTART_KINDS, Host, InventoryError, load_inventory, parse_inventory
from fleetpatch.patchset import Patch, PatchError, load_patch, parse_ref

def note(text: str) -> None:
    if currently_in_test_context():
        _hypothesis_note(text)


SCALE = float(os.environ.get("FLEETPATCH_PROPERTY_SCALE", "1"))
SETTINGS = settings(max_examples=int(100 * SCALE), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# ------------------------------------------------------------------ generated values

KNOWN_KEYS = [
    # every key of hosts.yaml and patch.yaml, so that damage lands on keys the loaders know
    "defaults", "groups", "hosts", "address", "user", "port", "identity_file", "known_hosts",
    "connect_timeout", "gateway", "engine", "server", "kind", "python", "state_dir", "log", "health_url",
    "ready_timeout", "restart", "start", "env", "workdir", "pidfile", "stop_grace", "unit", "program", "config",
    "name", "summary", "revisions", "markers", "expect", "forbid", "allow_single_path", "rev", "diff",
    "engine_versions", "regex", "EAGLEWorker", "EAGLEWorkerV2", "all", "h1", "h2",
]
TRICKY_STRINGS = [
    "", " ", "all", "journal", "~", "..", "../x", "/etc/passwd", "a/b", "a\\b", "x\x00y", "\r\n", "é", "[/]",
    "{python}", "command", "systemd", "supervisor", "sglang", "vllm", "==0.5.9", ">=0.5.8,<0.5.10", "not a spec",
    "0.5.9", "h1", "h2", "root@h1:22", "user@[::1]:2222", "host:99999", "http://x", "ftp://x", "yes", "0x1F",
    "1e309", ".nan", "r1.diff", "r2.diff", "patch.yaml", "a{4294967296}", "(", "", "x" * 300, "EAGLEWorker",
]
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(TRICKY_STRINGS), st.text(max_size=12),
    st.dates(min_value=datetime.date(1, 1, 1)),
)
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=8), st.integers(-3, 3), st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=8,
)


def _paths(node, prefix=()):
    """Every place in a document: (path, container) pairs, the document itself first."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


LEAF_VALUES = ["", " ", "x\x00y", "a{4294967296}", "..", "/etc/passwd", "a/b", "not a spec", "journal", "all",
               "h1", "x" * 300, None, True, 0, -1, 65536, 2**64, 1.5, float("nan"), float("inf"), [], {}, ["x"],
               {"x": 1}, datetime.date(2001, 2, 3)]


def every_leaf_replaced(base):
    """(path, document) for every place of `base` holding each of LEAF_VALUES: exhaustive, not sampled."""
    for path in _paths(base):
        if not path:
            continue
        for value in LEAF_VALUES:
            doc = copy.deepcopy(base)
            _get(doc, path[:-1])[path[-1]] = value
            yield path, doc


@st.composite
def damaged(draw, base):
    """`base` with one to four random changes, each at a random place."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        places = list(_paths(doc))
        path = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["replace", "drop", "add", "rename"]))
        if not path:
            if action == "replace":
                doc = draw(values)
            elif isinstance(doc, dict):
                doc[draw(keys)] = draw(values)
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        if action == "replace":
            parent[last] = draw(values)
        elif action == "drop":
            del parent[last]
        elif action == "add":
            target = _get(doc, path)
            if isinstance(target, dict):
                target[draw(keys)] = draw(values)
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), draw(values))
            else:
                parent[last] = draw(values)
        elif isinstance(parent, dict):  # rename
            parent[draw(keys)] = parent.pop(last)
    return doc


# libyaml when there is one: the tests spend their time in YAML, not in fleetpatch
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dump(doc, flow: bool) -> str:
    try:
        return yaml.dump(doc, Dumper=_DUMPER, default_flow_style=flow, allow_unicode=True, sort_keys=False)
    except (yaml.YAMLError, ValueError, TypeError):  # e.g. a None key in a flow mapping: not our concern
        return yaml.safe_dump(str(doc))


@st.composite
def mangled(draw, text: str):
    """`text` with a few characters inserted, deleted or replaced."""
    chars = list(text)
    for _ in range(draw(st.integers(1, 5))):
        pos = draw(st.integers(0, len(chars)))
        what = draw(st.sampled_from(["insert", "delete", "replace"]))
        ch = draw(st.sampled_from(list(":-[]{}&*!|>'\"#%@`,? \n\t\\") + ["!!int ", "!!float ", "2001-02-30",
                                                                            "*a", "&a ", "<<: ", "\x00", "\ufeff"]))
        if what == "insert" or not chars:
            chars.insert(pos, ch)
        elif what == "delete":
            del chars[min(pos, len(chars) - 1)]
        else:
            chars[min(pos, len(chars) - 1)] = ch
    return "".join(chars)


# ------------------------------------------------------------------ hosts.yaml

BASE_INVENTORY = {
    "defaults": {
        "user": "root", "port": 22, "connect_timeout": 10, "identity_file": "~/.ssh/id_ed25519",
        "engine": {"kind": "sglang", "python": "/opt/sglang/.venv/bin/python", "state_dir": "/var/lib/fleetpatch"},
        "server": {
            "log": "/data/logs/sglang.log", "health_url": "http://127.0.0.1:30000/health", "ready_timeout": 1800,
            "restart": {"kind": "command", "start": "{python} -m sglang.launch_server --port 30000",
                        "env": {"SGLANG_ENABLE_SPEC_V2": "True"}, "workdir": "/data", "pidfile": "/run/sglang.pid",
                        "stop_grace": 10},
        },
    },
    "groups": {"canary": ["h1"], "rest": ["h2", "h3"]},
    "hosts": {
        "h1": {"address": "10.1.230.174"},
        "h2": {"address": "10.1.230.175", "port": 2222, "gateway": "h1"},
        "h3": {"address": "10.1.230.176", "gateway": "jump@bastion:22",
               "server": {"log": "journal", "restart": {"kind": "systemd", "unit": "sglang.service"}}},
    },
}
FILE = "fuzz/hosts.yaml"


def _names_a_key_of(key: str, doc, known=()) -> bool:
    """The error's key starts at a key of the document, or at one the loader requires and misses."""
    shown = [str(k) for k in [*doc, *known]] + [repr(k) for k in doc if isinstance(k, str)]
    shown += [{None: "null", True: "true", False: "false"}.get(k, "") for k in doc if k is None or isinstance(k, bool)]
    return any(key == k or key.startswith(f"{k}.") or key.startswith(f"{k}[") for k in shown if k)


def as_read(text):
    """The document as YAML reads the text back (PyYAML does not round-trip every string: '\\x85' becomes ' ')."""
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except Exception:  # noqa: BLE001 - invalid YAML: no document to compare keys with
        return None


def _about_the_whole_file(msg: str) -> bool:
    # fleetpatch's YAML is stricter than safe_load (duplicate keys) and its text must be UTF-8
    return "not valid YAML" in msg or "not UTF-8" in msg


def check_inventory(text: str):
    """parse_inventory(text) is a sound Inventory or an InventoryError naming the file (and key)."""
    doc = as_read(text)
    try:
        inv = parse_inventory(text, FILE)
    except InventoryError as e:
        msg = str(e)
        note(f"error: {msg}")
        assert isinstance(e, UsageError)
        assert e.file == FILE and msg.startswith(FILE + ": "), msg
        if e.key is not None:
            assert msg.startswith(f"{FILE}: {e.key}: "), msg
        if isinstance(doc, dict) and not _about_the_whole_file(msg):
            assert e.key is not None and _names_a_key_of(e.key, doc, ["hosts"]), msg
        return None
    assert inv.hosts
    for name, h in inv.hosts.items():
        assert isinstance(h, Host) and h.name == name
        hash(h)
        assert isinstance(h.address, str) and h.address.strip()
        assert h.port is None or (type(h.port) is int and 1 <= h.port <= 65535)
        assert isinstance(h.connect_timeout, (int, float)) and math.isfinite(h.connect_timeout)
        assert h.connect_timeout > 0
        assert h.server.restart.kind in RESTART_KINDS
        assert isinstance(h.engine.python, str) and h.engine.python.strip()
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in h.server.restart.env.items())
        assert h.server.ready_timeout > 0 and h.server.restart.stop_grace >= 0
        assert set(h.groups) <= set(inv.groups)
        if h.jump is not None:
            assert h.jump.port is None or 1 <= h.jump.port <= 65535
    for members in inv.groups.values():
        assert set(members) <= set(inv.hosts)
    return inv


def test_the_base_inventory_is_valid():
    inv = check_inventory(dump(BASE_INVENTORY, False))
    assert inv is not None and list(inv.hosts) == ["h1", "h2", "h3"]


def test_every_place_of_the_inventory_with_every_odd_value():
    count = 0
    for path, doc in every_leaf_replaced(BASE_INVENTORY):
        check_inventory(dump(doc, False))
        count += 1
    assert count > 500


@SETTINGS
@given(doc=damaged(BASE_INVENTORY), flow=st.booleans())
def test_damaged_inventory(doc, flow):
    text = dump(doc, flow)
    note(text)
    check_inventory(text)


@SETTINGS
@given(data=st.data())
def test_mangled_inventory_text(data):
    text = data.draw(mangled(dump(BASE_INVENTORY, data.draw(st.booleans()))))
    note(text)
    check_inventory(text)


@SETTINGS
@given(doc=values)
def test_any_document_as_inventory(doc):
    check_inventory(dump(doc, False))


@settings(SETTINGS, max_examples=int(40 * SCALE))
@given(raw=st.binary(max_size=64), name=st.sampled_from(["hosts.yaml", "dir", "missing.yaml"]))
def test_inventory_file_bytes(raw, name):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        if name == "dir":
            path.mkdir()
        elif name != "missing.yaml":
            path.write_bytes(raw)
        try:
            load_inventory(path)
        except InventoryError as e:
            assert str(e).startswith(f"{path}: "), str(e)


@settings(SETTINGS, max_examples=int(60 * SCALE))
@given(hosts=st.one_of(st.none(), st.text(max_size=12), st.lists(st.sampled_from(["h1", "h2", "x", " ", ""]))),
       group=st.one_of(st.none(), st.sampled_from(["all", "canary", "rest", "nope", ""])),
       changes=st.booleans())
def test_selecting_hosts(hosts, group, changes):
    inv = parse_inventory(dump(BASE_INVENTORY, False), FILE)
    try:
        chosen = inv.select(hosts, group, changes_hosts=changes)
    except UsageError as e:
        assert str(e) and "Traceback" not in str(e)
        return
    assert chosen and all(isinstance(h, Host) for h in chosen)


# ------------------------------------------------------------------ patch.yaml

V1 = "sglang/srt/speculative/eagle_worker.py"
V2 = "sglang/srt/speculative/eagle_worker_v2.py"


def _hunk(path: str) -> str:
    return f"--- a/{path}\n+++ b/{path}\n@@ -10,3 +10,4 @@\n ctx1\n ctx2\n+x = 1\n ctx3\n"


GOOD_DIFF = _hunk(V1) + _hunk(V2)
BASE_MANIFEST = {
    "name": "fz",
    "summary": "fuzzed manifest",
    "engine": "sglang",
    "revisions": [
        {"rev": 1, "diff": "r1.diff", "engine_versions": "==0.5.9"},
        {"rev": 2, "diff": "r2.diff", "engine_versions": ">=0.5.8,<0.5.9"},
    ],
    "markers": {"EAGLEWorker": "fz: EAGLEWorker", "EAGLEWorkerV2": {"regex": "fz: EAGLEWorkerV2 .*"}},
    "expect": ["ready"],
    "forbid": ["Traceback (most recent call last)"],
}


@pytest.fixture(scope="module")
def patch_root():
    with tempfile.TemporaryDirectory(prefix="fleetpatch-fuzz-") as d:
        folder = Path(d) / "fz"
        folder.mkdir()
        (folder / "r1.diff").write_text(GOOD_DIFF)
        (folder / "r2.diff").write_text(GOOD_DIFF)
        (folder / "sub").mkdir()
        yield Path(d)


def check_manifest(root: Path, text, ref: str = "fz"):
    doc = as_read(text)
    manifest = root / "fz" / "patch.yaml"
    manifest.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape"))
    try:
        patch, rev = load_patch(ref, [root], sglang.PROFILE)
    except PatchError as e:
        msg = str(e)
        note(f"error: {msg}")
        assert isinstance(e, UsageError)
        assert e.file is not None and msg.startswith(f"{e.file}: "), msg
        assert e.file in (str(manifest), *(str(p) for p in (root / "fz").iterdir())), msg
        if e.key is not None:
            assert msg.startswith(f"{e.file}: {e.key}: "), msg
        if isinstance(doc, dict) and e.file == str(manifest) and not _about_the_whole_file(msg):
            assert e.key is not None and _names_a_key_of(e.key, doc, ["name", "engine", "revisions"]), msg
        return None
    assert isinstance(patch, Patch) and patch.name == "fz" and patch.revisions
    assert [r.rev for r in patch.revisions] == sorted({r.rev for r in patch.revisions})
    for r in patch.revisions:
        assert r.files and all(f.path.startswith("sglang/") for f in r.files)
        patch.label(r)
        r.admits("0.5.9")
    for m in patch.markers.values():
        m.matches("fz: EAGLEWorker line")
        m.describe()
    return patch


def test_the_base_manifest_is_valid(patch_root):
    assert check_manifest(patch_root, dump(BASE_MANIFEST, False)) is not None


def test_every_place_of_the_manifest_with_every_odd_value(patch_root):
    count = 0
    for path, doc in every_leaf_replaced(BASE_MANIFEST):
        check_manifest(patch_root, dump(doc, False))
        count += 1
    assert count > 500


@SETTINGS
@given(doc=damaged(BASE_MANIFEST), flow=st.booleans())
def test_damaged_manifest(patch_root, doc, flow):
    text = dump(doc, flow)
    note(text)
    check_manifest(patch_root, text)


@SETTINGS
@given(data=st.data())
def test_mangled_manifest_text(patch_root, data):
    text = data.draw(mangled(dump(BASE_MANIFEST, data.draw(st.booleans()))))
    note(text)
    check_manifest(patch_root, text)


@settings(SETTINGS, max_examples=int(40 * SCALE))
@given(raw=st.binary(max_size=48))
def test_manifest_bytes(patch_root, raw):
    check_manifest(patch_root, raw)


@settings(SETTINGS, max_examples=int(80 * SCALE))
@given(ref=st.one_of(st.text(max_size=12), st.sampled_from(["fz", "fz@1", "fz@r2", "fz@0", "fz@3", "@1", "fz@",
                                                               "fz@@1", " fz ", "../fz"])))
def test_patch_references(patch_root, ref):
    (patch_root / "fz" / "patch.yaml").write_text(dump(BASE_MANIFEST, False))
    try:
        name, rev = parse_ref(ref)
    except PatchError as e:
        assert str(e).startswith("--patch"), str(e)
        return
    try:
        load_patch(ref, [patch_root], sglang.PROFILE)
    except PatchError as e:
        assert str(e), ref
    assert rev is None or rev >= 1


# ------------------------------------------------------------------ .diff text

DIFF_LINES = [
    "--- a/sglang/x.py\n", "+++ b/sglang/x.py\n", "--- /dev/null\n", "+++ /dev/null\n", "@@ -1,2 +1,3 @@\n",
    "@@ -0,0 +1 @@\n", "@@ -1 +0,0 @@\n", "@@ -3,0 +4 @@\n", "@@ -1,2 +1,3 @@ def f():\r\n", " a\n", "+b\n", "-c\n",
    " \n", "\n", "\\ No newline at end of file\n", "diff --git a/sglang/x.py b/sglang/x.py\n",
    "new file mode 100644\n", "deleted file mode 100644\n", "old mode 100644\n", "new mode 100755\n",
    "index 1111111..2222222 100644\n", "Binary files a/sglang/x.so and b/sglang/x.so differ\n",
    "rename from sglang/a.py\n", "rename to sglang/b.py\n", "--- a/sglang/x.py\t1970-01-01 00:00:00 +0000\n",
    '+++ "b/sglang/caf\\303\\251.py"\n', "+é\r\n", "-\x00\n", "garbage\n",
]


@settings(SETTINGS, max_examples=int(300 * SCALE))
@given(lines=st.lists(st.one_of(st.sampled_from(DIFF_LINES), st.text(max_size=6).map(lambda t: t + "\n")),
                      max_size=14),
       host=st.one_of(st.none(), st.binary(max_size=24), st.sampled_from([b"a\nc\n", b"a\nb\n", b"a\n"])))
def test_any_diff_text_is_parsed_or_refused(lines, host):
    text = "".join(lines)
    try:
        fds = parse_diff(text, "fuzz.diff")
    except DiffError as e:
        assert isinstance(e, UsageError)
        assert str(e).startswith("fuzz.diff: "), str(e)
        return
    for fd in fds:
        assert fd.path.startswith("sglang/") and ".." not in fd.path.split("/")
        r = apply_file(fd, host)
        assert r.state in ("applies", "creates", "deletes", "already-applied", "conflict")
        assert (r.new is not None) == (r.state in ("applies", "creates"))
