"""A second engine is one new file: the toyserve profile (tests/support/toy_engine.py)
is found, validated in an inventory, checked by the patch rules and judged by
evidence exactly like SGLang, and no module outside engines/sglang.py knows
SGLang's ready line, log prefix, aliases or environment.
"""
from __future__ import annotations

import ast
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from support import toy_engine
from fleetpatch import engines, evidence
from fleetpatch.engines.base import LaunchConfig
from fleetpatch.errors import Status, UsageError
from fleetpatch.evidence import Check, Observation, Subject
from fleetpatch.inventory import InventoryError, parse_inventory
from fleetpatch.patchset import PatchError, load_patch
from support.paths import REPO

TOY = toy_engine.PROFILE
SRC = REPO / "src" / "fleetpatch"
HOST, LABEL = "toy-01", "fast-fix@1"
SGLANG_READY = "The server is fired up and ready to roll!"


@pytest.fixture
def registered():
    engines.register(TOY)
    yield TOY
    engines._REGISTERED.pop("toyserve", None)


# ----------------------------------------------------------------- finding the profile
def test_a_registered_profile_is_a_known_kind_everywhere(registered):
    assert engines.get("toyserve") is TOY and engines.get("ToyServe") is TOY
    assert engines.kinds() == ("sglang", "toyserve", "vllm") and engines.KINDS == ("sglang", "toyserve", "vllm")
    inv = parse_inventory(textwrap.dedent("""\
        hosts:
          toy-01:
            address: 10.0.0.9
            engine: {kind: toyserve, python: /opt/toy/bin/python}
            server: {log: /var/log/toy.log, restart: {kind: systemd, unit: toy}}
        """))
    assert inv.hosts["toy-01"].engine.kind == "toyserve"
    assert engines.for_hosts(inv.hosts.values()) is TOY


def test_unknown_kinds_name_every_profile(registered):
    with pytest.raises(engines.UnknownEngine) as e:
        engines.get("tgi")
    assert "'tgi'" in str(e.value) and "sglang, toyserve, vllm" in str(e.value)
    with pytest.raises(InventoryError) as e:
        parse_inventory("hosts:\n  a: {address: h, engine: {kind: tgi, python: /p},"
                        " server: {log: /l, restart: {kind: systemd, unit: u}}}\n")
    assert "unknown engine kind 'tgi'; fleetpatch has profiles for sglang, toyserve, vllm" in str(e.value)


def test_an_engine_module_dropped_into_engines_is_found(tmp_path, monkeypatch):
    """The one-new-file claim itself: engines/toyserve.py, and nothing else, makes the kind."""
    assert "toyserve" not in engines.kinds()
    shutil.copy(toy_engine.__file__, tmp_path / "toyserve.py")
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "fleetpatch.engines.toyserve", raising=False)
    try:
        assert "toyserve" in engines.kinds()
        profile = engines.get("toyserve")
        assert type(profile).__module__ == "fleetpatch.engines.toyserve" and profile.ready_line == toy_engine.READY
    finally:
        engines._REGISTERED.pop("toyserve", None)
        sys.modules.pop("fleetpatch.engines.toyserve", None)


def test_hosts_of_two_engines_are_refused_with_their_names(registered):
    inv = parse_inventory(textwrap.dedent("""\
        defaults: {server: {log: /l, restart: {kind: systemd, unit: u}}}
        hosts:
          toy-01: {address: a, engine: {kind: toyserve, python: /p}}
          gpu-01: {address: b, engine: {python: /p}}
        """))
    with pytest.raises(UsageError) as e:
        engines.for_hosts(inv.hosts.values())
    assert "sglang: gpu-01; toyserve: toy-01" in str(e.value)


# ----------------------------------------------------------------- the patch rules
DIFF = """\
--- a/toyserve/decode/{name}.py
+++ b/toyserve/decode/{name}.py
@@ -1,2 +1,3 @@
 def step(batch):
+    log("{name} decoder patched")
     return batch
"""


def write_patch(root: Path, files=("fast", "slow"), markers=None) -> Path:
    folder = root / "fast-fix"
    folder.mkdir(parents=True)
    (folder / "toyserve-2.diff").write_text("".join(DIFF.format(name=n) for n in files))
    markers = markers if markers is not None else {"FastDecoder": "fast decoder patched",
                                                   "SlowDecoder": "slow decoder patched"}
    lines = "".join(f'  {k}: "{v}"\n' for k, v in markers.items())
    (folder / "patch.yaml").write_text(
        "name: fast-fix\nengine: toyserve\nmarkers:\n" + lines +
        'revisions:\n  - {rev: 1, diff: toyserve-2.diff, engine_versions: ">=2.0,<3"}\n')
    return root


def test_the_sibling_rule_uses_the_engines_own_pairs(tmp_path):
    with pytest.raises(PatchError) as e:
        load_patch("fast-fix", [write_patch(tmp_path, files=("fast",))], TOY)
    assert "changes toyserve/decode/fast.py but not its sibling toyserve/decode/slow.py" in str(e.value)


def test_the_marker_rule_uses_the_engines_own_paths(tmp_path):
    root = write_patch(tmp_path, markers={"FastDecoder": "fast decoder patched"})
    manifest = root / "fast-fix" / "patch.yaml"
    manifest.write_text(manifest.read_text() + "executed: off\n")   # markers alone judge: the marker rule holds
    with pytest.raises(PatchError) as e:
        load_patch("fast-fix", [root], TOY)
    assert "changes toyserve/decode/slow.py (code path SlowDecoder)" in str(e.value)
    assert "has no marker for SlowDecoder" in str(e.value)


# ----------------------------------------------------------------- judged like sglang
@pytest.fixture
def patch(tmp_path):
    return load_patch("fast-fix", [write_patch(tmp_path)], TOY)[0]


def launch(*flags, env=None):
    return LaunchConfig(["/opt/toy/bin/python", "-m", "toyserve", *flags], dict(env or {}), "process")


def judge(patch, lines, launch_=None, first=1, want_markers=True, server_info=None, alive=True,
          since_ready=10.0, timed_out=False):
    obs = Observation(list(lines), first, server_info, alive, True, since_ready, timed_out)
    subject = Subject(TOY, "2.1", launch_ or launch("--decoder", "fast"), HOST)
    v = evidence.verdict(obs, subject, Check.of(patch, LABEL, want_markers))
    assert "sglang" not in v.message.lower() and "speculative" not in v.message
    return v


def toy(text, rank=0):
    return f"toy[worker {rank}] {text}"


def test_verified_on_the_path_that_runs(patch):
    v = judge(patch, [toy("decoder selected: fast"), toy("fast decoder patched"), toy(toy_engine.READY)], first=40)
    assert (v.status, v.final, v.executed_path) == (Status.VERIFIED, True, "FastDecoder")
    assert v.message.splitlines()[0] == \
        'OK   toy-01  fast-fix@1 verified on FastDecoder (log line 41 "fast decoder patched")'
    assert '    evidence: log line 40 "decoder selected: fast"' in v.message
    assert v.markers_seen == [{"path": "FastDecoder", "line_no": 41, "text": "fast decoder patched"}]


def test_the_marker_of_the_other_path_never_verifies(patch):
    window = [toy("decoder selected: slow"), toy("fast decoder patched"), toy(toy_engine.READY)]
    v = judge(patch, window, launch("--decoder", "slow"))
    assert (v.status, v.executed_path) == (Status.NOT_EXECUTED, "SlowDecoder")
    assert "  the server runs SlowDecoder (toyserve/decode/slow.py)" in v.message
    assert "cause: --decoder slow selects SlowDecoder" in v.message
    assert 'marker for SlowDecoder not seen: "slow decoder patched"' in v.message
    assert "marker for FastDecoder seen (log line 2" in v.message and "does not run FastDecoder" in v.message


def test_an_inherited_marker_verifies_the_subclass(patch):
    window = [toy("decoder selected: turbo"), toy("fast decoder patched"), toy(toy_engine.READY)]
    v = judge(patch, window, launch(env={"TOYSERVE_DECODER": "turbo"}))
    assert (v.status, v.executed_path) == (Status.VERIFIED, "TurboDecoder")
    assert "verified on TurboDecoder via FastDecoder code" in v.message


def test_no_path_runs_in_the_engines_words(patch):
    v = judge(patch, [toy("decoder selected: none"), toy(toy_engine.READY)], launch("--decoder", "none"))
    assert (v.status, v.executed_path) == (Status.NOT_EXECUTED, None)
    assert "  the server runs no decoder" in v.message and "no decoder runs" in v.message


def test_readiness_is_the_engines_ready_line_not_sglangs(patch):
    window = [toy("decoder selected: fast"), toy("fast decoder patched"), toy(SGLANG_READY)]
    v = judge(patch, window, since_ready=None)
    assert (v.status, v.missing) == (Status.PENDING, ["the server to be ready"])
    v = judge(patch, window, since_ready=None, timed_out=True)
    assert v.status == Status.TIMEOUT and f'no "{toy_engine.READY}" in the 3 log lines' in v.message


def test_the_engines_failure_line_and_the_exception_are_quoted(patch):
    window = [toy("decoder selected: fast"), toy("FATAL: decoder crashed"), "Traceback (most recent call last):",
              "RuntimeError: out of blocks"]
    v = judge(patch, window, first=7, alive=False, since_ready=None)
    assert (v.status, v.final) == (Status.RESTART_FAILED, True)
    assert '  log line 8 "FATAL: decoder crashed"' in v.message
    assert '  log line 10 "RuntimeError: out of blocks"' in v.message
    assert [e.text for e in v.evidence] == ["FATAL: decoder crashed", "RuntimeError: out of blocks"]


def test_log_and_server_info_disagreeing_is_a_conflict(patch):
    window = [toy("decoder selected: FAST"), toy("fast decoder patched"), toy(toy_engine.READY)]
    assert judge(patch, window, server_info={"decoder": "fast"}).status == Status.VERIFIED   # same_fact: case
    v = judge(patch, window, server_info={"decoder": "slow"})
    assert (v.status, v.executed_path) == (Status.NOT_EXECUTED, None)
    assert v.cause == "evidence conflict: log says FastDecoder (line 1), server_info says SlowDecoder"


def test_rollback_is_judged_by_the_same_rules(patch):
    window = [toy("decoder selected: fast"), toy(toy_engine.READY)]
    assert judge(patch, window, want_markers=False).status == Status.ROLLED_BACK
    v = judge(patch, window + [toy("fast decoder patched")], want_markers=False)
    assert v.status == evidence.ROLLBACK_STILL_PATCHED and "the patched code still runs" in v.message


def test_judge_is_the_same_call_for_both_engines(patch):
    window = [toy("decoder selected: fast"), toy("fast decoder patched"), toy(toy_engine.READY)]
    obs = Observation(window, 1, None, True, True, 10.0, False)
    old = evidence.judge(obs, Subject(TOY, "2.1", launch("--decoder", "fast"), HOST), Check.of(patch, LABEL))
    assert old == evidence.verdict(obs, Subject(TOY, "2.1", launch("--decoder", "fast"), HOST),
                                   Check.of(patch, LABEL))


# ----------------------------------------------------------------- no SGLang outside its profile
# What only SGLang's profile may know: its ready line, its log prefix, the NEXTN alias,
# its environment, and the profile module itself.
SGLANG_ONLY = (SGLANG_READY, r"^\[\d{4}-\d{2}-\d{2}", "NEXTN", "SGLANG_", "VLLM_", "engines.sglang", "sglang.PROFILE")

# Known uses in modules other helpers own, each to go with its one-line change (see the
# engine branch's report). The list may only shrink: an entry that is no longer true fails too.
PENDING: dict = {}


def code_text(path: Path) -> str:
    """The code of a module without its docstrings and comments: string constants,
    names, attributes and imports, one per line."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            out.append(n.value)
        elif isinstance(n, ast.Attribute):
            out.append(f"{ast.unparse(n)}")
        elif isinstance(n, ast.ImportFrom):
            base = ("." * n.level) + (n.module or "")
            out += [f"{base}.{a.name}".replace("..", ".").lstrip(".") for a in n.names]
    return "\n".join(out)


def core_modules():
    skip = {"engines/sglang.py"}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        # engines/sglang_facts.py and sglang_wheel.py are the profile's own modules (its facts); so are
        # engines/vllm*.py of the vLLM profile, which names vLLM's own variables (VLLM_...)
        if rel not in skip and not rel.startswith(("demo/", "patches/", "engines/sglang_", "engines/vllm")):
            yield rel, path


@pytest.mark.parametrize("rel,path", list(core_modules()), ids=lambda x: x if isinstance(x, str) else "")
def test_no_module_but_the_profile_knows_sglang(rel, path):
    text = code_text(path)
    found = {s for s in SGLANG_ONLY if s in text}
    assert found == PENDING.get(rel, set()), (
        f"{rel}: SGLang-specific {sorted(found - PENDING.get(rel, set()))} belongs in engines/sglang.py "
        f"(the profile's attributes); no longer there: {sorted(PENDING.get(rel, set()) - found)}")


def test_the_scan_sees_what_it_looks_for():
    text = code_text(SRC / "engines" / "sglang.py")
    assert {SGLANG_READY, "NEXTN", "SGLANG_"} <= {s for s in SGLANG_ONLY if s in text}
