"""The probe in real interpreters: functions mode on this machine's Python 3.11 (in a venv made
for the test), lines and functions mode on Debian trixie's Python 3.13 (a debootstrap root, run
with chroot). Each test runs a small "server" that imports a patched module with a hot loop,
spawns a child with multiprocessing spawn, and prints what it computed; the probe's records are
then judged by the laptop-side verdict."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fleetpatch.probe import install as probe_install
from fleetpatch.probe.verdict import NEVER_IMPORTED, NOT_CHANGED, execution_block, parse_records

TRIXIE = Path(os.environ.get("FLEETPATCH_TRIXIE_ROOT", "/var/cache/fleetpatch-test/trixie-root"))

HOT = '''"""A patched module: a hot loop, a function only a spawned child runs, one that never runs."""
import os


def loop(n):
    total = 0
    for i in range(n):
        total += step(i)  # added
    return total


def step(i):
    if i % 2:
        return i * 2  # added
    return i


def child_entry(path):
    value = step(3) + LEVEL  # added
    with open(path, "w") as f:
        f.write(str(value))


def unused():
    return 42  # added


class Holder:
    def method(self):
        return 1


LEVEL = 7  # added
'''

SERVER = '''import json, multiprocessing, sys
import toypkg.hot as hot
import toypkg.other


def main():
    total = hot.loop(20000)
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=hot.child_entry, args=(sys.argv[1],))
    child.start()
    child.join()
    with open(sys.argv[1]) as f:
        from_child = f.read()
    print(json.dumps({"total": total, "child_exit": child.exitcode, "from_child": from_child,
                      "hot_file": hot.__file__, "globals_seen": sorted(k for k in vars(hot) if "probe" in k)}))


if __name__ == "__main__":
    main()
'''

EXPECTED_TOTAL = sum(i * 2 if i % 2 else i for i in range(20000))
HOT_ADDED = [n for n, line in enumerate(HOT.splitlines(), 1) if line.endswith("# added")]
LINE_OF = {key: next(n for n, line in enumerate(HOT.splitlines(), 1) if key in line and line.endswith("# added"))
           for key in ("total += step", "return i * 2", "value = step(3)", "return 42", "LEVEL = 7")}


class Interp:
    """A Python to run the server with: argv prefix, and the root its paths are seen under."""

    def __init__(self, argv, root: Path | None, name: str, mode: str | None):
        self.argv = argv
        self.root = root
        self.name = name
        self.mode = mode      # plan mode: None (the best the interpreter has) or "functions"

    def host(self, inner: str) -> Path:
        return Path(str(self.root) + inner) if self.root else Path(inner)

    def run(self, args, env=None, check=True):
        cmd = ([shutil.which("chroot") or "/usr/sbin/chroot", str(self.root)] if self.root else []) + self.argv + list(args)
        full = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        full.update(env or {})
        return subprocess.run(cmd, capture_output=True, text=True, env=full, check=check, timeout=300)


def clear_dead_probes(root: Path) -> None:
    """The root outlives test runs: a run killed mid-test (Ctrl-C, a timeout) leaves its probe's
    .pth in the root's site dirs, pointing at a temporary folder that is gone. Those are taken
    out; a live run's (its runtime still there) is left alone."""
    for pth in root.glob(f"usr/*/lib/python3*/*-packages/{probe_install.PTH_PREFIX}*{probe_install.PTH_SUFFIX}"):
        runtime = re.search(r"open\('([^']+)'", pth.read_text(errors="replace"))
        if runtime is None or not Path(runtime.group(1)).exists():
            pth.unlink(missing_ok=True)


def trixie_root() -> Path:
    """The Debian trixie root, built once (debootstrap, about 30 s) and kept in a fixed place."""
    if (TRIXIE / "usr/bin/python3").exists():
        if os.geteuid() != 0 or not shutil.which("chroot"):
            pytest.skip("Python 3.13 lines mode runs the trixie root with chroot: run as root")
        clear_dead_probes(TRIXIE)
        return TRIXIE
    if os.geteuid() != 0 or not shutil.which("debootstrap") or not shutil.which("chroot"):
        pytest.skip("Python 3.13 lines mode needs a Debian trixie root: run as root with debootstrap installed")
    TRIXIE.parent.mkdir(parents=True, exist_ok=True)
    with open(TRIXIE.parent / ".trixie.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (TRIXIE / "usr/bin/python3").exists():
            build = TRIXIE.with_name(TRIXIE.name + ".build")
            shutil.rmtree(build, ignore_errors=True)
            done = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", "trixie", str(build),
                                   "http://deb.debian.org/debian"], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"debootstrap of trixie failed (no Debian mirror?): {done.stderr.strip()[-300:]}")
            build.rename(TRIXIE)
    return TRIXIE


@pytest.fixture(params=["py3.11-functions", "py3.13-lines", "py3.13-functions"])
def interp(request, tmp_path):
    if request.param.startswith("py3.11"):
        if sys.version_info[:2] != (3, 11):
            pytest.skip("this machine's Python is not 3.11")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
        yield Interp([str(tmp_path / "venv/bin/python")], None, request.param, None)
        return
    root = trixie_root()
    mode = "functions" if request.param.endswith("functions") else None
    yield Interp(["/usr/bin/python3"], root, request.param, mode)


@pytest.fixture
def work(interp):
    """A scratch dir the server sees (inside the chroot where there is one): inst/, copy/, probe/."""
    inner = f"/tmp/fptest-{uuid.uuid4().hex[:10]}"
    host = interp.host(inner)
    host.mkdir(parents=True)
    for where in ("inst", "copy"):
        pkg = host / where / "toypkg"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "hot.py").write_text(HOT)
        (pkg / "other.py").write_text("VALUE = 1\n")
    (host / "server.py").write_text(SERVER)
    yield inner, host
    shutil.rmtree(host, ignore_errors=True)


def snapshot(folder: Path) -> dict:
    """Names, bytes and modes of everything below `folder`."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(folder))] = (st.st_mode, p.read_bytes() if p.is_file() else None)
    return out


def site_dir(interp) -> str:
    out = interp.run(["-c", probe_install.SITE_QUERY]).stdout
    return probe_install.site_dir_from(json.loads(out))


def deploy(interp, inner, host, plan_mode=None):
    """Install the probe watching toypkg (hot: patched; other: a sibling; never: never imported)."""
    added = {"toypkg/hot.py": HOT_ADDED, "toypkg/never.py": [3]}
    plan = probe_install.make_plan(added, f"{inner}/inst", watch=["toypkg/other.py"], mode=plan_mode or interp.mode)
    site_inner = site_dir(interp)
    token = uuid.uuid4().hex[:12]
    probe_install.install(str(interp.host(site_inner)), str(host / "probe"), token, plan,
                          probe_dir_seen=f"{inner}/probe")
    return site_inner, token, plan, added


def run_server(interp, inner, pythonpath):
    done = interp.run([f"{inner}/server.py", f"{inner}/child.out"], env={"PYTHONPATH": pythonpath})
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_probe_records_the_lines_that_ran_in_the_server_and_its_spawned_child(interp, work):
    inner, host = work
    site_inner = site_dir(interp)
    before = snapshot(interp.host(site_inner))
    _, token, plan, added = deploy(interp, inner, host)
    result, stderr = run_server(interp, inner, f"{inner}/inst")

    # the server computed what it computes without the probe, and nothing of the probe shows
    assert result["total"] == EXPECTED_TOTAL and result["child_exit"] == 0 and result["from_child"] == "13"
    assert "Error" not in stderr and "Traceback" not in stderr, stderr
    files = probe_install.read_records(str(host / "probe"))
    block = execution_block(files, plan, added)
    assert not any(name.endswith("/disabled") for name in files), files
    want_mode = "functions" if interp.name.endswith("functions") else "lines"
    assert block["mode"] == want_mode, block
    ran = set(block["ran"]["toypkg/hot.py"])
    assert {LINE_OF["total += step"], LINE_OF["return i * 2"], LINE_OF["value = step(3)"],
            LINE_OF["LEVEL = 7"]} <= ran
    assert LINE_OF["return 42"] not in ran
    assert ran <= set(HOT_ADDED)
    assert block["imported"]["toypkg.hot"] == f"{inner}/inst/toypkg/hot.py"
    assert block["not_run"] == {"toypkg/never.py": NEVER_IMPORTED, "toypkg/other.py": NOT_CHANGED}

    # the child's own line is recorded under the child's pid, not the server's
    procs = parse_records(files)
    server = [p for p in procs.values() if p["process"] and p["process"]["argv"][:1] == [f"{inner}/server.py"]]
    assert len(server) == 1
    server_pid = server[0]["process"]["pid"]
    children = [p for p in procs.values() if p["process"] and p["process"]["ppid"] == server_pid
                and any(name.startswith(("L-", "F-")) for name, _ in p["records"])]
    assert len(children) == 1, procs
    child_lines = {o.get("line") for n, o in children[0]["records"] if n.startswith("L-")}
    child_lines |= {n for name, o in children[0]["records"] if name.startswith("F-") for n in o["lines"]}
    assert LINE_OF["value = step(3)"] in child_lines
    server_lines = {o.get("line") for n, o in server[0]["records"] if n.startswith("L-")}
    server_lines |= {n for name, o in server[0]["records"] if name.startswith("F-") for n in o["lines"]}
    assert LINE_OF["value = step(3)"] not in server_lines
    assert server_pid in block["pids"] and children and len(block["pids"]) >= 2

    # a hot loop wrote each record once (a count record is one file per function, rewritten in place)
    assert sum(1 for name in files if name.startswith(f"{server_pid}-") and "toypkg.hot" in name
               and "/C-" not in name) <= len(HOT_ADDED) + 1

    # out again: the site directory is as it was, byte for byte
    assert probe_install.remove(str(interp.host(site_inner)), token) == [probe_install.pth_name(token)]
    assert snapshot(interp.host(site_inner)) == before
    again, _ = run_server(interp, inner, f"{inner}/inst")
    assert again["globals_seen"] == []
    assert probe_install.read_records(str(host / "probe")).keys() == files.keys()

    counts = {json.loads(data)["unit"]: json.loads(data)["count"] for name, data in files.items()
              if name.startswith(f"{server_pid}-") and "/C-toypkg.hot-" in name}
    if want_mode == "lines":   # step() ran 20000 times: it is counted only until its added line ran (its 2nd call)
        assert counts["loop"] == 1 and counts["step"] == 2, counts


def test_a_module_loaded_from_another_file_is_named_with_both_paths(interp, work):
    inner, host = work
    site_inner, token, plan, added = deploy(interp, inner, host)
    try:
        result, _ = run_server(interp, inner, f"{inner}/copy:{inner}/inst")
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
    assert result["total"] == EXPECTED_TOTAL and result["hot_file"] == f"{inner}/copy/toypkg/hot.py"
    block = execution_block(probe_install.read_records(str(host / "probe")), plan, added)
    assert block["ran"] == {}
    assert block["not_run"]["toypkg/hot.py"] == (
        f"loaded from another file ({inner}/copy/toypkg/hot.py instead of {inner}/inst/toypkg/hot.py)")
    assert block["imported"]["toypkg.hot"] == f"{inner}/copy/toypkg/hot.py"
    # nothing was instrumented in the copy: the server ran it untouched
    assert result["globals_seen"] == []


def test_a_bad_plan_turns_the_probe_off_and_the_server_runs_as_without_it(interp, work):
    inner, host = work
    site_inner, token, plan, added = deploy(interp, inner, host)
    (host / "probe" / "plan.json").write_text("{not json")
    try:
        result, stderr = run_server(interp, inner, f"{inner}/inst")
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
    assert result["total"] == EXPECTED_TOTAL and result["child_exit"] == 0 and result["globals_seen"] == []
    assert "Traceback" not in stderr
    files = probe_install.read_records(str(host / "probe"))
    reasons = [json.loads(data)["reason"] for name, data in files.items() if name.endswith("/disabled")]
    assert reasons and all("starting: JSONDecodeError" in r for r in reasons), reasons
    block = execution_block(files, plan, added)
    assert block["mode"] == "unavailable" and "turned itself off" in block["message"]
    assert block["not_run"]["toypkg/hot.py"] == NEVER_IMPORTED


def test_a_records_dir_the_server_cannot_write_leaves_the_server_untouched(interp, work):
    inner, host = work
    site_inner, token, plan, added = deploy(interp, inner, host)
    shutil.rmtree(host / "probe" / "records")
    (host / "probe" / "records").write_text("not a directory")
    try:
        result, stderr = run_server(interp, inner, f"{inner}/inst")
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
    assert result["total"] == EXPECTED_TOTAL and result["from_child"] == "13"
    assert "Traceback" not in stderr


def test_a_stale_probe_of_a_killed_run_is_found_and_removed(interp, work):
    inner, host = work
    site_inner = site_dir(interp)
    site = interp.host(site_inner)
    before = snapshot(site)
    _, old, _, _ = deploy(interp, inner, host)
    (site / f".{probe_install.pth_name('cut-short')}.tmp").write_text("half")   # an install cut short
    assert probe_install.stale_probes(str(site), current="another-run") == [probe_install.pth_name(old)]
    removed = probe_install.remove(str(site))
    assert sorted(removed) == sorted([probe_install.pth_name(old), f".{probe_install.pth_name('cut-short')}.tmp"])
    assert snapshot(site) == before


TRACER = '''import json, sys
import torch                       # the stand-in below: its compiler says when it is "compiling"
import toypkg.hot as hot

torch.compiler.compiling = True    # the first call of step() happens while tracing
hot.step(3)
torch.compiler.compiling = False
hot.step(5)                        # then it runs for real
hot.loop(3)
print(json.dumps({"ok": True}))
'''

STAND_IN_TORCH = '''class compiler:
    compiling = False

    @staticmethod
    def is_compiling():
        return compiler.compiling


class cuda:
    @staticmethod
    def is_initialized():
        return False
'''


def test_a_line_first_seen_while_traced_is_recorded_as_traced_then_as_run(interp, work):
    inner, host = work
    (host / "tracer.py").write_text(TRACER)
    (host / "standin").mkdir()
    (host / "standin" / "torch.py").write_text(STAND_IN_TORCH)
    site_inner, token, plan, added = deploy(interp, inner, host)
    try:
        done = interp.run([f"{inner}/tracer.py"], env={"PYTHONPATH": f"{inner}/standin:{inner}/inst"})
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
    assert json.loads(done.stdout) == {"ok": True}
    files = probe_install.read_records(str(host / "probe"))
    traced = [json.loads(v) for k, v in files.items() if k.split("/")[1].startswith("T-")]
    assert traced and all(t["traced"] == "torch.compile" for t in traced)
    block = execution_block(files, plan, added)
    assert LINE_OF["return i * 2"] in block["ran"]["toypkg/hot.py"]   # it ran for real later
    assert LINE_OF["return i * 2"] not in block["traced"].get("toypkg/hot.py", [])


STAND_IN_GUARDS = '''"""Stand-in for torch._guards: the TracingContext TorchDynamo holds while it traces."""
import threading

_tls = threading.local()


class TracingContext:
    def __init__(self):
        self.loc_in_frame = None

    @staticmethod
    def try_get():
        return getattr(_tls, "ctx", None)

    @staticmethod
    def set_current_loc(filename, lineno, frame_name):
        TracingContext.try_get().loc_in_frame = (filename, lineno, frame_name)
'''

DYNAMO_LIKE = '''import json, sys
import torch._guards as guards     # the stand-in, imported after the probe loaded, as `import torch` does
import toypkg.hot as hot


def trace(fn):
    """What TorchDynamo does to a function it compiles or inlines: it steps through its lines
    without running them, announcing each; the one call it runs is a guard marked constant."""
    code = fn.__code__
    ctx = guards._tls.ctx = guards.TracingContext()
    try:
        for line in sorted({n for _, _, n in code.co_lines() if n}):
            guards.TracingContext.set_current_loc(code.co_filename, line, code.co_name)
        table = vars(hot).get("__fleetpatch_probe__")
        if table and getattr(table[0], "_dynamo_marked_constant", False):
            fn()
    finally:
        guards._tls.ctx = None
    return ctx.loc_in_frame


loc = trace(hot.unused)            # never runs for real
trace(hot.Holder().method)         # holds no added line
hot.step(5)                        # runs for real
print(json.dumps({"loc": loc, "wrapped": hasattr(guards.TracingContext.set_current_loc, "__wrapped__")}))
'''


def test_a_line_torch_compile_only_traced_is_recorded_as_traced(interp, work):
    """Stand-in Dynamo: lines mode is told the traced lines through TracingContext.set_current_loc,
    functions mode by its guard, which Dynamo calls at trace time (test_probe_torch.py: real torch)."""
    inner, host = work
    (host / "dynamo_like.py").write_text(DYNAMO_LIKE)
    (host / "standin" / "torch").mkdir(parents=True)
    (host / "standin" / "torch" / "__init__.py").write_text("")
    (host / "standin" / "torch" / "_guards.py").write_text(STAND_IN_GUARDS)
    site_inner, token, plan, added = deploy(interp, inner, host)
    try:
        done = interp.run([f"{inner}/dynamo_like.py"], env={"PYTHONPATH": f"{inner}/standin:{inner}/inst"})
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
    got = json.loads(done.stdout)
    # torch's own function still did its work, and the probe wrapped it only in lines mode
    assert got["loc"][0] == f"{inner}/inst/toypkg/hot.py" and got["loc"][2] == "unused"
    assert got["wrapped"] is (not interp.name.endswith("functions"))
    files = probe_install.read_records(str(host / "probe"))
    assert not any(name.endswith("/disabled") for name in files), files
    traced = [json.loads(v) for k, v in files.items() if k.split("/")[1].startswith("T-")]
    assert traced and all(t["traced"] == "torch.compile" for t in traced)
    block = execution_block(files, plan, added)
    assert block["traced"] == {"toypkg/hot.py": [LINE_OF["return 42"]]}
    assert LINE_OF["return i * 2"] in block["ran"]["toypkg/hot.py"]
    assert LINE_OF["return 42"] not in block["ran"]["toypkg/hot.py"]


@pytest.mark.parametrize("interp", ["py3.13-lines"], indirect=True)   # tool ids exist on Python 3.12+
def test_taken_monitoring_tool_ids_make_the_probe_fall_back_to_functions(interp, work):
    inner, host = work
    site_inner = site_dir(interp)
    taker = interp.host(site_inner) / "aaa-fptest-take-tools.pth"
    taker.write_text("import sys; sys.monitoring.use_tool_id(3, 'a'); sys.monitoring.use_tool_id(4, 'b')\n")
    try:
        _, token, plan, added = deploy(interp, inner, host)
        try:
            result, _ = run_server(interp, inner, f"{inner}/inst")
        finally:
            probe_install.remove(str(interp.host(site_inner)), token)
    finally:
        taker.unlink()
    assert result["total"] == EXPECTED_TOTAL
    files = probe_install.read_records(str(host / "probe"))
    block = execution_block(files, plan, added)
    assert block["mode"] == "functions" and LINE_OF["return i * 2"] in block["ran"]["toypkg/hot.py"]
    notes = {json.loads(v)["note"] for k, v in files.items() if k.endswith("/process.json")}
    assert notes == {"no free sys.monitoring tool id (4, 3 taken)"}


# ----------------------------------------------------------------- forked children (issue 31, 6)

FORK_SERVER = '''import json, os, sys
import toypkg.hot as hot


def main():
    total = hot.loop(20000)          # the parent runs the added lines first: lines mode disables them
    pid = os.fork()                  # a scheduler forked as vLLM forks its workers
    if pid == 0:
        code = 0 if hot.loop(10) == sum(i * 2 if i % 2 else i for i in range(10)) else 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"total": total, "child": pid, "child_status": status}))


if __name__ == "__main__":
    main()
'''


def local_python(minimum=(3, 12)):
    """A Python of at least `minimum` on this machine (python3.13, python3.12 on PATH or built by
    pyenv), or None."""
    pyenv = Path(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))) / "versions"
    candidates = [shutil.which(name) for name in ("python3.13", "python3.12")]
    candidates += [str(p) for p in sorted(pyenv.glob("3.1[2-9]*/bin/python3"), reverse=True)]
    for found in candidates:
        if found:
            done = subprocess.run([found, "-c", "import sys; print(sys.version_info >= %r)" % (minimum,)],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == "True":
                return found
    return None


@pytest.fixture(params=["py3.11-functions", "py3.12+-lines"])
def fork_interp(request, tmp_path):
    """functions mode on this machine's 3.11; lines mode on the trixie root's 3.13, else a local 3.12+."""
    if request.param.startswith("py3.11"):
        if sys.version_info[:2] != (3, 11):
            pytest.skip("this machine's Python is not 3.11")
        python = sys.executable
    elif (TRIXIE / "usr/bin/python3").exists() and os.geteuid() == 0 and shutil.which("chroot"):
        yield Interp(["/usr/bin/python3"], TRIXIE, request.param, None)
        return
    else:
        python = local_python()
        if python is None:
            pytest.skip("lines mode needs Python 3.12+: no trixie root and no python3.12/3.13 here")
    subprocess.run([python, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    yield Interp([str(tmp_path / "venv/bin/python")], None, request.param, None)


def test_a_forked_child_records_the_lines_its_parent_already_ran_under_its_own_pid(fork_interp, tmp_path):
    """The parent runs the added lines (lines mode then disables them for the whole process), then
    forks; the child runs the same lines. A fork-safe probe records them under both pids."""
    interp = fork_interp
    inner = f"/tmp/fptest-{uuid.uuid4().hex[:10]}"
    host = interp.host(inner)
    pkg = host / "inst" / "toypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "hot.py").write_text(HOT)
    (host / "server.py").write_text(FORK_SERVER)
    try:
        site_inner, token, plan, added = deploy(interp, inner, host)
        try:
            done = interp.run([f"{inner}/server.py"], env={"PYTHONPATH": f"{inner}/inst"})
        finally:
            probe_install.remove(str(interp.host(site_inner)), token)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["total"] == EXPECTED_TOTAL and result["child_status"] == 0, (result, done.stderr)
        files = probe_install.read_records(str(host / "probe"))
        assert not any(name.endswith("/disabled") for name in files), files
        block = execution_block(files, plan, added)
        assert block["mode"] == ("functions" if interp.name.endswith("functions") else "lines"), block

        lines_by_pid = {}
        for entry in parse_records(files).values():
            proc = entry["process"] or {}
            ran = {o["line"] for n, o in entry["records"] if n.startswith("L-")}
            ran |= {line for n, o in entry["records"] if n.startswith("F-") for line in o["lines"]}
            lines_by_pid.setdefault(proc.get("pid"), set()).update(ran)
            if proc.get("pid") == result["child"]:
                assert proc.get("forked_from", "").startswith(f"{proc['ppid']}-"), proc
        parent = next(pid for pid in lines_by_pid if pid != result["child"])
        for key in ("total += step", "return i * 2"):
            assert LINE_OF[key] in lines_by_pid[parent], (key, lines_by_pid)
            assert LINE_OF[key] in lines_by_pid[result["child"]], (key, lines_by_pid)
        assert {parent, result["child"]} <= set(block["pids"])
    finally:
        shutil.rmtree(host, ignore_errors=True)


# ---------------------------------------------------------------------- how far the code got (issue 31)

WORKER_V1 = '''class EAGLEWorker:
    def forward_batch_generation(self, batch):
        return len(batch)

    def other(self):
        return 0
'''

WORKER_V2 = '''class EAGLEWorkerV2:
    def forward_batch_generation(self, batch):
        n = len(batch)
        if n >= 4:
            n += 100  # added
        return n
'''

REACH_SERVER = '''import json, os, sys, time
import toypkg.{module} as worker


def serve(size, times):
    w = worker.{cls}()
    return [w.forward_batch_generation(list(range(size))) for _ in range(times)]


first = serve(1, {calls})
with open(sys.argv[1] + ".phase1", "w") as f:
    f.write(json.dumps(first))
if {second}:
    deadline = time.time() + 240
    while not os.path.exists(sys.argv[1] + ".go") and time.time() < deadline:
        time.sleep(0.02)
    print(json.dumps({{"first": first, "second": serve(8, 1)}}))
else:
    print(json.dumps({{"first": first}}))
'''


def reach_setup(interp, inner, host, module, cls, calls, second):
    pkg = host / "inst" / "toypkg"
    (pkg / "worker.py").write_text(WORKER_V1)
    (pkg / "worker_v2.py").write_text(WORKER_V2)
    (host / "reach.py").write_text(REACH_SERVER.format(module=module, cls=cls, calls=calls, second=second))
    added = {"toypkg/worker_v2.py": [5]}
    plan = probe_install.make_plan(added, f"{inner}/inst", watch={"toypkg/worker.py": ["toypkg/worker_v2.py"]},
                                   mode=interp.mode)
    site_inner = site_dir(interp)
    token = uuid.uuid4().hex[:12]
    probe_install.install(str(interp.host(site_inner)), str(host / "probe"), token, plan,
                          probe_dir_seen=f"{inner}/probe")
    return site_inner, token, plan, added


def test_the_one_path_mistake_names_the_sibling_function_that_ran_and_how_often(interp, work):
    from fleetpatch.probe.verdict import reach
    inner, host = work
    site_inner, token, plan, added = reach_setup(interp, inner, host, "worker", "EAGLEWorker", 12, False)
    try:
        done = interp.run([f"{inner}/reach.py", f"{inner}/out"], env={"PYTHONPATH": f"{inner}/inst"})
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
    assert json.loads(done.stdout.splitlines()[-1]) == {"first": [1] * 12} and "Traceback" not in done.stderr
    got = reach(execution_block(probe_install.read_records(str(host / "probe")), plan, added), added)
    assert got["status"] == "not-executed", got
    # counted exactly up to 8, then at powers of two: 12 calls read as "at least 8"
    assert got["lines"] == ["  EAGLEWorker.forward_batch_generation (worker.py) ran at least 8 times; "
                            "this patch changes only worker_v2.py"]


def test_a_gated_line_is_unproven_then_the_running_server_proves_it_after_the_probe_went_out(interp, work):
    """Lines mode: the function ran 3 times with a batch of 1, its `if n >= 4` line never did:
    unproven, naming the function, its count and the line. The .pth goes out (as after a verdict);
    the running server keeps watching, and a batch of 8 later proves it (proved_by traffic).
    Functions mode (3.8-3.11) tells the same: its guard for the line is inside the `if`."""
    import time as clock
    from fleetpatch.probe.verdict import Timeline, reach
    inner, host = work
    site_inner, token, plan, added = reach_setup(interp, inner, host, "worker_v2", "EAGLEWorkerV2", 3, True)
    out = interp.host(f"{inner}/out")
    cmd = ([shutil.which("chroot") or "/usr/sbin/chroot", str(interp.root)] if interp.root else []) + interp.argv
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": f"{inner}/inst"}
    server = subprocess.Popen(cmd + [f"{inner}/reach.py", f"{inner}/out"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(6000):
            if Path(str(out) + ".phase1").exists() or server.poll() is not None:
                break
            clock.sleep(0.02)
        probe_install.remove(str(interp.host(site_inner)), token)   # the verdict is in: the .pth goes out
        first = reach(execution_block(probe_install.read_records(str(host / "probe")), plan, added), added)
        verdict_at = clock.time()
        Path(str(out) + ".go").write_text("")
        stdout, stderr = server.communicate(timeout=240)
    finally:
        probe_install.remove(str(interp.host(site_inner)), token)
        if server.poll() is None:
            server.kill()
    assert json.loads(stdout.splitlines()[-1]) == {"first": [1, 1, 1], "second": [108]}, stderr
    later = reach(execution_block(probe_install.read_records(str(host / "probe")), plan, added), added,
                  Timeline(ready_at=verdict_at - 60, smoke_to=verdict_at))
    assert first["status"] == "unproven", first
    assert first["lines"][0] == ("  EAGLEWorkerV2.forward_batch_generation (worker_v2.py) ran 3 times, but no line "
                                 "this patch adds ran: line 5 of toypkg/worker_v2.py never did (its condition "
                                 "never held)")
    assert later == {"status": "verified", "proved_by": "traffic", "lines": []}
