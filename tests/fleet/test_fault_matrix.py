"""The fault matrix (issue 8): each fault injected at each phase where it can happen,
then the host is checked and the same command rerun plainly.

After every injection the host must be consistent: every engine file byte-identical
to the pristine tree or to what the ledger says fleetpatch wrote (sha256 of each),
the ledger naming exactly the patch the files hold, no temp file or write journal
left, and the lock free. Then a plain rerun (no --break-lock) must converge and
leave the host consistent again. A summary (faults x phases tried, hosts consistent,
originals lost, locks needing a human) is printed at the end for the README.

Most faults need no SSH: they run on the local transport (the real agent, the real
SGLang files, the real stand-in server, a directory tree as the host). A cut SSH
session is injected on the real sshd fleet (the `fleet` fixture, tests/conftest.py).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support import clockstep
from support.marks import needs_fleet
from support.operator import Operator
from fleetpatch_demo import fleet as fleetmod
from support.waits import wait_for
from support.localhost import EAGLE, EAGLE_V2, LocalHost, job, sha256
from fleetpatch import steps

RESULTS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    yield
    if not RESULTS:
        return
    faults = sorted({r["fault"] for r in RESULTS})
    lines = [f"fault matrix: {len(RESULTS)} fault x phase cases ({len(faults)} faults: {', '.join(faults)})",
             f"  hosts consistent (after the fault; for a process killed with -9, once the next run has "
             f"finished its work): {sum(r['consistent'] for r in RESULTS)}/{len(RESULTS)}",
             f"  converged on a plain rerun: {sum(r['converged'] for r in RESULTS)}/{len(RESULTS)}",
             f"  originals lost: {sum(r['lost'] for r in RESULTS)}",
             f"  locks needing a human: {sum(r['human_lock'] for r in RESULTS)}"]
    for r in RESULTS:
        lines.append(f"    {r['fault']:<18} @ {r['phase']:<15} -> {r['status']}, rerun {r['rerun']}")
    text = "\n".join(lines)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\n" + text)
    out = os.environ.get("FLEETPATCH_MATRIX_SUMMARY")
    if out:
        Path(out).write_text(text + "\n")


SERVER_ARGS = "sglang/srt/server_args.py"


# --------------------------------------------------------------- checking

# created and deleted by the fixture patch helper-module
HELPER = "sglang/srt/speculative/fleetpatch_helper.py"
NGRAM = "sglang/srt/speculative/cpp_ngram/ngram_cache.py"


def engine_shas(lh: LocalHost) -> dict:
    """sha256 of every engine file a fixture patch touches; None for one that does not exist."""
    return {rel: sha256(lh.file(rel)) if lh.file(rel).exists() else None
            for rel in (EAGLE, EAGLE_V2, SERVER_ARGS, HELPER, NGRAM)}


def stray_files(lh: LocalHost) -> list[str]:
    return sorted(str(p) for p in lh.root.rglob("*") if (".fleetpatch-" in p.name or p.name in ("writing.json",
                                                                                              "lock-busy"))
                  and p.name != fleetmod.TOKEN_FILE)   # the demo fleet's own mark of a host tree


def check(lh: LocalHost, pristine: dict) -> list[str]:
    """What is wrong with the host (empty: consistent)."""
    problems = []
    ledger = lh.ledger()
    expected = dict(pristine)
    for entry in sorted(ledger.get("patches", {}).values(), key=lambda e: e.get("seq", 0)):
        for rel, rec in entry["files"].items():
            expected[rel] = rec["after"]
            if rec.get("backup") is None:   # a created file: nothing was there to keep
                continue
            backup = lh.state / rec["backup"]
            if not backup.exists() or sha256(backup) != rec["before"]:
                problems.append(f"the backup of {rel} is missing or not what it replaced")
    now = engine_shas(lh)
    for rel, sha in now.items():
        if sha != expected[rel]:
            problems.append(f"{rel} is neither the original nor what the ledger records")
    if stray_files(lh):
        problems.append(f"stray files: {stray_files(lh)}")
    if lh.lock.exists():
        problems.append(f"the lock is left: {lh.lock.read_text()}")
    return problems


def originals_lost(lh: LocalHost, pristine: dict) -> bool:
    """No copy of the original bytes of a changed file is left (not in place, not in a backup)."""
    backups = {sha256(p) for p in (lh.state / "backups").rglob("*") if p.is_file()} if (lh.state / "backups").exists() else set()
    now = engine_shas(lh)
    return any(now[rel] != sha and sha is not None and sha not in backups for rel, sha in pristine.items())


def record(fault: str, phase: str, lh: LocalHost, pristine: dict, result, rerun, killed: bool = False,
           lock_left: bool = False) -> None:
    """Check the host after the fault, rerun plainly, check again; assert and record.
    A process killed with -9 cannot tidy up after itself: its debris (a half-done write,
    its journal, a temp file, its lock) must be finished by the next run, so for those
    the host is judged after the rerun."""
    after_fault = [] if killed else check(lh, pristine)
    if lock_left:   # kept, with its note, by an agent whose channel ended after it changed the host
        after_fault = [p for p in after_fault if not p.startswith("the lock is left")]
    lost = originals_lost(lh, pristine)
    again = rerun()
    after_rerun = check(lh, pristine)
    human_lock = again.status == "locked"
    RESULTS.append({"fault": fault, "phase": phase, "status": str(getattr(result, "status", result)),
                    "rerun": str(again.status), "consistent": not after_fault and not after_rerun, "converged":
                    not after_rerun and again.status in ("verified", "already-applied", "rolled-back", "ok"),
                    "lost": lost, "human_lock": human_lock})
    assert not lost, f"{fault} @ {phase}: an original is lost"
    assert not after_fault, f"{fault} @ {phase}: {after_fault}; result: {getattr(result, 'message', result)}"
    assert not human_lock, f"{fault} @ {phase}: the rerun needs --break-lock: {again.message}"
    assert not after_rerun, f"{fault} @ {phase}, after the rerun: {after_rerun}; rerun: {again.message}"
    assert again.status in ("verified", "already-applied", "rolled-back", "ok"), again.message


def deploy(lh, patch="spec-path-beacon"):
    return steps.deploy(job(lh, patch)[0], lh.host())


def rollback_all(lh):
    return steps.rollback(job(lh, None)[0], lh.host())


# ------------------------------------------------ kill -9 of the agent

AGENT_HARNESS = """
import json, os, signal, sys
sys.path.insert(0, {src!r})
from fleetpatch.agent import session
where, nth, package = {where!r}, {nth!r}, {package!r}
real_rename, seen = os.rename, []
def rename(src, dst):
    hit = {{"backup": "/backups/" in dst, "write": dst.startswith(package + os.sep),
           "restart": dst.endswith(".pid")}}[where]
    if hit:
        seen.append(dst)
        if len(seen) == nth:
            os.kill(os.getpid(), signal.SIGKILL)
    real_rename(src, dst)
os.rename = rename
session.main(json.loads(sys.stdin.readline()))
"""


def run_killed_agent(lh: LocalHost, req: dict, where: str, nth: int, package: str) -> int:
    src = str(Path(steps.__file__).resolve().parents[2])
    code = AGENT_HARNESS.format(src=src, where=where, nth=nth, package=package)
    proc = subprocess.run([str(lh.python), "-c", code], input=json.dumps(req) + "\n", text=True,
                          capture_output=True, timeout=60)
    return proc.returncode


def apply_request(lh: LocalHost, patch: str = "spec-path-beacon") -> tuple[dict, str]:
    j, host = job(lh, patch)
    reply = steps.probe(steps.Remote(host, transport=j.transport(host)), host, j, steps.revision_files(j), True)
    plan, revision = steps.make_plan(j, host, reply)
    req = dict(steps.base_request(host, j), op="apply", package_dir=reply["package_dir"], name=j.patch.name,
               rev=revision.rev, label=plan.label, diff_sha256=revision.diff_sha256,
               files=steps.apply_files(reply, plan), lock_token=None)
    return req, reply["package_dir"]


@pytest.mark.parametrize("phase,nth", [("backup", 2), ("write", 1), ("write", 2), ("restart", 1)])
def test_agent_killed_during_deploy(lh, phase, nth):
    pristine = engine_shas(lh)
    req, package = apply_request(lh)
    assert run_killed_agent(lh, req, phase, nth, package) == -9
    try:
        record("kill-9 agent", f"{phase}#{nth}" if phase == "write" else phase, lh, pristine, "killed",
               lambda: deploy(lh), killed=True)
    finally:
        kill_orphans(lh)


def test_agent_killed_between_a_create_and_a_modify(lh):
    """helper-module's diff creates a file, deletes one, then changes both workers: the
    agent dies after the create (the first rename into the package) and the delete, at
    the second rename. The next run's recovery removes the created file and puts the
    deleted one back; the rerun then deploys it whole."""
    pristine = engine_shas(lh)
    req, package = apply_request(lh, "helper-module")
    assert run_killed_agent(lh, req, "write", 2, package) == -9
    assert lh.file(HELPER).exists() and not lh.file(NGRAM).exists(), "killed after the create and the delete"
    assert sha256(lh.file(EAGLE)) == pristine[EAGLE], "and before the first modify"
    try:
        record("kill-9 agent", "create/modify", lh, pristine, "killed", lambda: deploy(lh, "helper-module"),
               killed=True)
    finally:
        kill_orphans(lh)
    assert lh.file(HELPER).exists() and not lh.file(NGRAM).exists(), "the rerun deployed the whole revision"


def rollback_request(lh: LocalHost, name: str) -> tuple[dict, str]:
    """The agent's rollback request for patch `name` on the host, and its package dir."""
    j, host = job(lh, None)
    reply = steps.probe(steps.Remote(host, transport=j.transport(host)), host, j, [], False)
    req = dict(steps.base_request(host, j), op="rollback", package_dir=reply["package_dir"],
               name=name, force=False, lock_token=None)
    return req, reply["package_dir"]


def test_agent_killed_during_rollback(lh):
    pristine = engine_shas(lh)
    assert deploy(lh).ok
    req, package = rollback_request(lh, "spec-path-beacon")
    patched_pid = lh.server_pid()
    assert run_killed_agent(lh, req, "write", 2, package) == -9
    record("kill-9 agent", "rollback", lh, pristine, "killed", lambda: rollback_all(lh), killed=True)
    assert lh.is_pristine()
    assert lh.server_pid() not in (None, patched_pid), "the server no longer runs the patched code"
    assert RESULTS[-1]["rerun"] == "rolled-back"


def test_agent_killed_while_rolling_back_a_create_and_a_delete(lh):
    """Rollback of helper-module goes file by file in path order: the deleted ngram_cache.py
    is put back, eagle_worker.py restored, and the agent dies at eagle_worker_v2.py, before
    the created helper is removed. The next run's recovery completes the rollback."""
    pristine = engine_shas(lh)
    assert deploy(lh, "helper-module").ok
    req, package = rollback_request(lh, "helper-module")
    patched_pid = lh.server_pid()
    assert run_killed_agent(lh, req, "write", 3, package) == -9
    assert lh.file(NGRAM).exists() and lh.file(HELPER).exists(), "killed half-way through the rollback"
    record("kill-9 agent", "rollback/create", lh, pristine, "killed", lambda: rollback_all(lh), killed=True)
    assert engine_shas(lh) == pristine and not lh.file(HELPER).exists()
    assert lh.server_pid() not in (None, patched_pid), "the server no longer runs the patched code"


def kill_orphans(lh: LocalHost) -> None:
    keep = lh.server_pid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == keep:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sglang_standin" in cmd and f"{lh.port}".encode() in cmd:
            os.kill(int(pid), signal.SIGKILL)


# -------------------------------------------- kill -9 of fleetpatch itself

LAPTOP = """
import os, sys
sys.path[:0] = [os.path.dirname({tests!r}), {src!r}]   # tests/, above this tier's folder
from support.localhost import LocalHost, job
from pathlib import Path
import fleetpatch.steps as steps
lh = LocalHost.__new__(LocalHost)
lh.__dict__.update({state!r})
lh.root, lh.env, lh.site = Path(lh.root), Path(lh.env), Path(lh.site)
host = lh.host(env={{"FLEETPATCH_STANDIN_STARTUP_DELAY": "3"}})
j, _ = job(lh, host=host)
steps.deploy(j, host)
"""


@pytest.mark.parametrize("phase", ["verify", "write"])
def test_fleetpatch_killed(lh, phase):
    """The laptop's process dies (kill -9) while the host restarts and verifies, or right
    after the agent got the files; a plain rerun from the same machine takes over the dead
    run's lock (its pid is provably gone) and converges."""
    pristine = engine_shas(lh)
    state = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(lh).items()}
    code = LAPTOP.format(tests=str(Path(__file__).parent), src=str(Path(steps.__file__).resolve().parents[2]),
                         state=state)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    marker = "Uvicorn running" if phase == "verify" else None
    try:
        if marker:
            assert wait_for(lambda: lh.log.exists() and marker in lh.log.read_text())
        else:
            assert wait_for(lambda: (lh.state / "ledger.json").exists())
        proc.kill()
        proc.wait()
        assert wait_for(lambda: not agents_running(lh), timeout=15)
        record("kill-9 fleetpatch", phase, lh, pristine, "killed", lambda: deploy(lh), killed=True)
    finally:
        if proc.poll() is None:
            proc.kill()


def agent_processes():
    """(pid, command line) of every fleetpatch agent process on this machine."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"fleetpatch-agent" in cmd:
                yield int(pid), cmd


def agents_running(lh: LocalHost) -> bool:
    return any(str(lh.python).encode() in cmd for _, cmd in agent_processes())


# ------------------------------------------ full disk, read-only, immutable

def mount(*argv) -> None:
    subprocess.run(["mount", *argv], check=True, capture_output=True)


def umount(path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def full_tmpfs(directory: Path) -> None:
    """Put `directory` (its files kept) on a tmpfs with no room left."""
    keep = directory.with_name(directory.name + ".orig")
    directory.rename(keep)
    directory.mkdir()
    mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(directory))
    subprocess.run(["cp", "-a", f"{keep}/.", str(directory)], check=True)
    with open(directory / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    (directory / "filler").chmod(0o644)


def release_tmpfs(directory: Path) -> None:
    """Move the (possibly changed) files back to the real directory."""
    (directory / "filler").unlink()
    keep = directory.with_name(directory.name + ".orig")
    subprocess.run(["cp", "-a", f"{directory}/.", str(keep)], check=True)
    umount(directory)
    directory.rmdir()
    keep.rename(directory)


@pytest.mark.parametrize("phase", ["backup", "write"])
def test_disk_full(lh, phase):
    pristine = engine_shas(lh)
    where = lh.state if phase == "backup" else lh.file(EAGLE).parent
    full_tmpfs(where)
    try:
        r = deploy(lh)
        assert r.status == "error" and ("no engine file was changed" in r.message or "put back" in r.message), \
            r.message
        assert "No space left" in r.message
    finally:
        release_tmpfs(where)
    record("disk full", phase, lh, pristine, r, lambda: deploy(lh))


def test_read_only_package(lh):
    pristine = engine_shas(lh)
    spec = lh.file(EAGLE).parent
    mount("--bind", str(spec), str(spec))
    try:
        mount("-o", "remount,ro,bind", str(spec))
        r = deploy(lh)
        assert r.status == "error" and "Read-only file system" in r.message, r.message
    finally:
        umount(spec)
    record("read-only package", "write", lh, pristine, r, lambda: deploy(lh))


def chattr(flag: str, path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


@pytest.mark.parametrize("phase", ["write", "rollback"])
def test_immutable_file(lh, phase):
    pristine = engine_shas(lh)
    if phase == "rollback":
        assert deploy(lh).ok
    chattr("+i", lh.file(EAGLE_V2))
    try:
        r = deploy(lh) if phase == "write" else rollback_all(lh)
        assert not r.ok and "put back" in r.message, r.message
    finally:
        chattr("-i", lh.file(EAGLE_V2))
    record("immutable file", phase, lh, pristine, r, (lambda: deploy(lh)) if phase == "write" else
           (lambda: rollback_all(lh)))


# ------------------------------------------------------------ the server

def test_crash_loop(lh):
    """A patch that kills the server at start, with --on-failure rollback: rolled back,
    and the same command again rolls back again (the host never stays broken)."""
    pristine = engine_shas(lh)
    r = steps.deploy(job(lh, "crash-in-init", on_failure="rollback")[0], lh.host())
    assert r.status == "rolled-back", r.message
    record("crash loop", "restart", lh, pristine, r,
           lambda: steps.deploy(job(lh, "crash-in-init", on_failure="rollback")[0], lh.host()))


@pytest.mark.parametrize("what", ["rotate", "truncate", "delete"])
def test_log_changed_during_verification(lh, what):
    pristine = engine_shas(lh)
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "1.5"})

    def meddle():
        if not wait_for(lambda: lh.log.exists() and "Uvicorn running" in lh.log.read_text()):
            return
        if what == "rotate":
            os.rename(lh.log, lh.log.with_name(lh.log.name + ".1"))
            lh.log.write_text("")
        elif what == "truncate":
            time.sleep(0.3)   # lines cut before anyone read them are lost to every reader (copytruncate too)
            os.truncate(lh.log, 0)
        else:
            lh.log.unlink()

    t = threading.Thread(target=meddle, daemon=True)
    t.start()
    r = steps.deploy(job(lh, host=host)[0], host)
    t.join()
    assert r.status == "verified", r.message
    record(f"log {what}", "verify", lh, pristine, r, lambda: deploy(lh))


def test_connection_stalled_during_verification(lh):
    """The agent stops answering mid-follow (SIGSTOP: a stalled link looks the same from
    the laptop): the wait ends at its bound, the result says so with the patch and version,
    and the lock is released on a fresh channel within its own bound."""
    pristine = engine_shas(lh)
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "1"})
    stopped = []

    def stall():
        if wait_for(lambda: lh.log.exists() and "Uvicorn running" in lh.log.read_text()):
            for pid, cmd in agent_processes():
                if str(lh.python).encode() in cmd:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)

    t = threading.Thread(target=stall, daemon=True)
    t.start()
    started = time.monotonic()
    try:
        # The follow's bound must outlast the server's start (1 s of delay, longer on a loaded
        # machine): a bound that passed before the stall ended the run as "never became ready".
        r = steps.deploy(job(lh, host=host, timeout=4)[0], host)
    finally:
        t.join()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    took = time.monotonic() - started
    assert stopped, "the agent was stalled"
    assert r.status == "timeout" and "connection was lost during the verification" in r.message, r.message
    assert r.patch == "spec-path-beacon@1" and r.engine_version == "0.5.9"
    assert took < 60, f"the stalled run took {took:.0f}s"
    record("connection stalled", "verify", lh, pristine, r, lambda: deploy(lh))


def test_two_runs_at_once(lh):
    pristine = engine_shas(lh)
    results = []
    threads = [threading.Thread(target=lambda: results.append(deploy(lh))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(str(r.status) for r in results)
    assert statuses in (["locked", "verified"], ["already-applied", "verified"]), [r.message for r in results]
    record("two runs at once", "probe", lh, pristine, "/".join(statuses), lambda: deploy(lh))


# ------------------------------------------------------------ a clock step

@pytest.fixture(scope="session")
def sleep_shim(tmp_path_factory):
    if clockstep.MISSING:
        if os.environ.get("CI"):   # .ci/run installs them: CI must not pass by skipping the clock step
            pytest.fail(f"{clockstep.MISSING}: .ci/run should have installed them")
        pytest.skip(clockstep.MISSING)
    return clockstep.build_shim(tmp_path_factory.mktemp("faketime"))


@pytest.fixture
def clock(lh, sleep_shim):
    """The host's python (the agent's and the server's) runs under libfaketime."""
    c = clockstep.Clock(lh.root, lh.python, sleep_shim)
    lh.engine_python = c.python
    return c


@pytest.mark.parametrize("seconds", [3600, -3600])
def test_clock_step_during_verification(lh, clock, seconds):
    """The host's wall clock jumps an hour (NTP, an operator's `date -s`) after the
    restart, while the agent follows the fresh log: the deploy still verifies within
    its timeout (no false timeout, no wait of an hour) and releases the lock."""
    pristine = engine_shas(lh)
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "1.5"})
    stepped = []

    def step():
        if wait_for(lambda: lh.log.exists() and lh.log.stat().st_size > 0):   # the server has started
            clock.step(seconds)
            stepped.append(lh.log.read_text().count("Uvicorn running"))

    t = threading.Thread(target=step, daemon=True)
    t.start()
    started = time.monotonic()
    r = steps.deploy(job(lh, host=host, timeout=8)[0], host)
    t.join()
    took = time.monotonic() - started
    assert stepped == [0], "the clock was stepped before the server was ready"
    assert abs(clock.now_offset() - seconds) < 60, "the host's clock is stepped"
    assert r.status == "verified", r.message
    assert took < 8, f"took {took:.1f}s"
    record("clock step", f"verify {seconds // 3600:+d}h", lh, pristine, r, lambda: deploy(lh))


def test_clock_step_while_the_server_stops(lh, clock):
    """The clock jumps an hour ahead while the agent waits for the old server's graceful
    exit (a rollback's restart): the server keeps its TERM grace (it is not SIGKILLed at
    once by a wall-clock deadline), the host is rolled back and the lock released."""
    pristine = engine_shas(lh)
    # the old server takes 2 s to exit after its SIGTERM: wide enough for the step to land
    # inside it on a loaded machine (0.7 s was missed once, with a bench sharing the cores)
    host = lh.host(env={"FLEETPATCH_STANDIN_SIGTERM_POLL": "2.0"})
    assert steps.deploy(job(lh, host=host)[0], host).ok
    old = lh.server_pid()
    stepped = []

    def stopping() -> bool:   # the old server got its SIGTERM: /health says 503 until it exits
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{lh.port}/health", timeout=0.5).close()
        except urllib.error.HTTPError as e:
            return e.code == 503
        except OSError:
            pass
        return False

    def step():
        if wait_for(stopping):
            clock.step(3600)
            stepped.append(lh.server_pid() == old and "Gracefully exiting" not in lh.log.read_text())

    t = threading.Thread(target=step, daemon=True)
    t.start()
    r = steps.rollback(job(lh, None, host=host)[0], host)
    t.join()
    assert stepped == [True], "the clock was stepped while the old server was stopping"
    assert r.status == "rolled-back", r.message
    # a wall-clock deadline would have SIGKILLed it at the step, before its exit line
    assert "Gracefully exiting" in lh.log.read_text(), "the old server had its TERM grace"
    assert lh.server_pid() not in (None, old)
    record("clock step", "stop +1h", lh, pristine, r, lambda: rollback_all(lh))


# --------------------------------------------------- the SSH session cut

@needs_fleet
def test_ssh_session_killed_during_verification(operator, fleet):
    """kill -9 of the host's sshd session while fleetpatch follows the log: the report says
    the connection was lost, with the patch and the engine version; a plain rerun converges."""
    name = "v1a"
    h = fleet.hosts[name]
    inv = operator.inventory()
    inv["hosts"][name]["server"]["restart"]["env"]["FLEETPATCH_STANDIN_STARTUP_DELAY"] = "3"
    operator.write_inventory(inv)
    pristine = {rel: sha256(h.site_packages / rel) for rel in (EAGLE, EAGLE_V2)}
    killed = []

    start = h.log_path.stat().st_size if h.log_path.exists() else 0

    def restarted() -> bool:   # the new server's start, not the one the reset left running
        return h.log_path.exists() and b"Uvicorn running" in h.log_path.read_bytes()[start:]

    def cut():
        if not wait_for(restarted, 60):
            return
        for pid in session_pids(h.sshd_pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass

    t = threading.Thread(target=cut, daemon=True)
    t.start()
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", name)
    t.join()
    assert killed, "an sshd session was killed"
    rep = run.host(name)
    assert "connection was lost during the verification" in rep["message"], rep["message"]
    assert rep["patch"] == "spec-path-beacon@1" and rep["engine_version"] == "0.5.9"
    assert "without an answer: no output" not in rep["message"]
    assert wait_for(lambda: not agents_on(fleet, name), 20), "the cut agent ended (its lock-lost note written)"
    led = json.loads((h.state_dir / "ledger.json").read_text())
    patched = {rel: rec["after"] for rel, rec in led["patches"]["spec-path-beacon"]["files"].items()}
    assert {rel: sha256(h.site_packages / rel) for rel in patched} == patched, "the ledger matches the files"
    assert not list(h.host_dir.rglob("*.fleetpatch-*.tmp"))
    again = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", name)
    consistent = again.host(name)["status"] in ("verified", "already-applied") and not (h.state_dir / "lock").exists()
    RESULTS.append({"fault": "connection cut", "phase": "verify", "status": rep["status"],
                    "rerun": again.host(name)["status"], "consistent": True, "converged": consistent,
                    "lost": any(sha not in {sha256(p) for p in h.state_dir.rglob("*") if p.is_file()}
                                for rel, sha in pristine.items() if sha256(h.site_packages / rel) != sha),
                    "human_lock": again.host(name)["status"] == "locked"})
    assert consistent, again


def session_pids(sshd_pid: int) -> list[int]:
    """The per-connection sshd processes under a host's listening sshd."""
    try:
        with open(f"/proc/{sshd_pid}/task/{sshd_pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


# ------------------------- the SSH connection cut and stalled, at each phase

class FleetView:
    """A fleet host seen through the same checks as a local host (check, record)."""

    def __init__(self, fleet, name: str):
        self.h = fleet.hosts[name]
        self.root, self.state = self.h.host_dir, self.h.state_dir
        self.lock = self.state / "lock"

    def file(self, rel: str) -> Path:
        return self.h.site_packages / rel

    def ledger(self) -> dict:
        path = self.state / "ledger.json"
        return json.loads(path.read_text()) if path.exists() else {}


class Outcome:
    """One host's line of an operator run's report, as `record` reads a HostResult."""

    def __init__(self, run, name: str):
        rep = run.host(name)
        self.status, self.message, self.report = rep["status"], rep["message"], rep


def agents_on(fleet, name: str) -> list[int]:
    """The agent processes running in the host's namespace (children of its sshd sessions,
    or orphaned by a cut one)."""
    h = fleet.hosts[name]
    return [pid for pid, _ in agent_processes() if fleetmod._ns_ino(pid) == h.ns_ino]


def signal_sessions(h, sig) -> list[int]:
    done = []
    for pid in session_pids(h.sshd_pid):
        try:
            os.kill(pid, sig)
            done.append(pid)
        except OSError:
            pass
    return done


def health_code(h) -> int | None:
    try:
        with urllib.request.urlopen(h.health_url, timeout=0.5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def when(predicate, action, timeout: float = 30):
    """Run `action` on a thread once `predicate` holds; .join() returns what it did (or None)."""
    box = []
    t = threading.Thread(target=lambda: box.append(action() if wait_for(predicate, timeout) else None),
                         daemon=True)
    t.start()

    class Waiter:
        @staticmethod
        def join():
            t.join()
            return box[0] if box else None
    return Waiter


@pytest.fixture
def on_v1b(fleet, pristine, tmp_path):
    """An operator for host v1b alone: only it is reset before (and after) the case,
    not the whole fleet, to keep these cases at a few seconds each."""
    pristine.restore(fleet, ["v1b"])
    yield Operator(fleet, tmp_path)
    pristine.restore(fleet, ["v1b"])


def deploy_on(operator, name, *extra):
    return operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", name, *extra)


def rollback_on(operator, name, *extra):
    return operator.run("rollback", "--hosts", name, *extra)


def triggers(h) -> dict:
    """When each phase is under way on the host, seen from outside it:
    probe  - the run's lock exists (taken with the probe, before any file is written);
    apply  - the old server got its SIGTERM (/health 503): the agent's apply request is
             restarting it, the files written just before;
    verify - the new server is up (its ready line in the log after this point)."""
    start = h.log_path.stat().st_size if h.log_path.exists() else 0
    return {"probe": lambda: (h.state_dir / "lock").exists(),
            "apply": lambda: health_code(h) == 503,
            "rollback": lambda: health_code(h) == 503,
            "verify": lambda: h.log_path.exists() and b"Uvicorn running" in h.log_path.read_bytes()[start:]}


@needs_fleet
@pytest.mark.parametrize("phase", ["probe", "apply", "rollback"])
def test_ssh_session_cut(on_v1b, fleet, phase):
    """kill -9 of the host's sshd session processes while the run probes, while its apply
    request restarts the server (files written), and while a rollback restarts it. The
    report says the connection was lost and names the patch; the files are pristine or
    what the ledger says; a plain rerun converges."""
    name = "v1b"
    h, view = fleet.hosts[name], FleetView(fleet, name)
    pristine = engine_shas(view)
    if phase == "rollback":
        assert deploy_on(on_v1b, name).host(name)["status"] == "verified"
    # probe: as soon as the agent runs. The lock appearing is too late a sign: the apply
    # follows the probe's answer within milliseconds.
    trigger = (lambda: bool(agents_on(fleet, name))) if phase == "probe" else triggers(h)[phase]
    cut = when(trigger, lambda: signal_sessions(h, signal.SIGKILL))
    run = rollback_on(on_v1b, name) if phase == "rollback" else deploy_on(on_v1b, name)
    assert cut.join(), "an sshd session was killed"
    out = Outcome(run, name)
    assert out.status in ("error", "unreachable", "timeout"), out.message
    said = {"probe": "(the connection was cut or the host's sshd session killed",
            "apply": "the connection was lost during the write and restart of spec-path-beacon@1",
            "rollback": "the connection was lost during the rollback"}[phase]
    assert said in out.message, out.message
    assert "exited -1" not in out.message, out.message
    if phase != "probe":
        assert out.report["patch"] == "spec-path-beacon@1" and out.report["engine_version"] == "0.5.9", out.report
    assert wait_for(lambda: not agents_on(fleet, name), 20), "the cut agent ended"
    # An agent cut while still restarting keeps the run's release from freeing the lock under
    # it (whether it still was when the release came is a race); having changed the host it
    # keeps the lock at its end, with a note, and the next run from here takes it over.
    record("connection cut", phase, view, pristine, out,
           lambda: Outcome(rollback_on(on_v1b, name) if phase == "rollback" else deploy_on(on_v1b, name),
                           name), lock_left=phase != "probe")


def long_request(h, seconds: float) -> threading.Thread:
    """A /generate that runs `seconds` (0.01 s a token): the old server's graceful exit
    waits for it, so the apply's stop lasts until its stop_grace."""
    body = json.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": int(seconds / 0.01)}}).encode()

    def send():
        try:
            urllib.request.urlopen(urllib.request.Request(h.health_url.replace("/health", "/generate"), body,
                                                          {"Content-Type": "application/json"}),
                                   timeout=seconds + 10).read()
        except OSError:
            pass   # cut when the server is killed at the end of its grace
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


@needs_fleet
@pytest.mark.parametrize("phase", ["apply", "verify"])
def test_ssh_connection_stalled(on_v1b, fleet, phase):
    """SIGSTOP of the host's sshd session processes (the TCP connection stays open, nothing
    moves: a stalled link) while the apply request stops the old server (which waits out
    its 16 s grace for a request in flight), and while the run follows the fresh log.
    The laptop gives up within the bound it names (10 s without a byte from an agent that
    ticks every second), with the patch and engine version in the report.
    During apply the stalled agent is still at work: neither the run's release nor a
    plain rerun may free the lock under it; both say which agent holds it. Once the link
    moves again (SIGCONT) the agent finishes, finds its channel closed and ends; a plain
    rerun converges without --break-lock."""
    name = "v1b"
    h, view = fleet.hosts[name], FleetView(fleet, name)
    pristine = engine_shas(view)
    stopped: list[int] = []
    if phase == "apply":
        inv = on_v1b.inventory()
        inv["hosts"][name]["server"]["restart"]["stop_grace"] = 16
        on_v1b.write_inventory(inv)
        long_request(h, 30)
        time.sleep(0.5)
    try:
        stall = when(triggers(h)[phase], lambda: stopped.extend(signal_sessions(h, signal.SIGSTOP)) or stopped)
        started = time.monotonic()
        run = deploy_on(on_v1b, name, "--timeout", "3")
        took = time.monotonic() - started
        assert stall.join(), "an sshd session was stopped"
        out = Outcome(run, name)
        assert out.status == "timeout", out.message
        assert "connection stalled" in out.message and "for 10s" in out.message, out.message
        phase_words = "write and restart" if phase == "apply" else "verification"
        assert f"connection was lost during the {phase_words} of spec-path-beacon@1" in out.message, out.message
        assert out.report["patch"] == "spec-path-beacon@1" and out.report["engine_version"] == "0.5.9"
        assert took < 16, f"the stalled run took {took:.0f}s"
        if phase == "apply":
            said = re.search(r"the host agent \(pid (\d+)\) of the run holding the lock", out.message)
            assert said and int(said.group(1)) in agents_on(fleet, name), out.message
            working = int(said.group(1))
            assert "was NOT released" in out.message, out.message
            busy = deploy_on(on_v1b, name)
            assert busy.host(name)["status"] == "locked", busy.host(name)["message"]
            assert f"(pid {working})" in busy.host(name)["message"] and "still running its apply" in \
                busy.host(name)["message"], busy.host(name)["message"]
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        assert wait_for(lambda: not agents_on(fleet, name), 30), "the stalled agent ended once the link moved"
        record("connection stalled", f"{phase}/ssh", view, pristine, out,
               lambda: Outcome(deploy_on(on_v1b, name), name), lock_left=phase == "apply")
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
