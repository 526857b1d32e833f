"""The execution probe on container hosts, as an operator checks it: a patch without markers
deployed into a container is verified by the lines it ran in the container's server (Debian
trixie's Python 3.13: lines mode); the motivating mistake fails with the contract's lines;
the probe is out of the container's site dir once the verdict is in, and after a rollback
that dir is byte-identical to before the deploy; verify-logs judges later by the records;
a killed laptop, a dead run and a container stopped before the verdict leave no probe for
the next start; a server started by `docker exec -d` is watched too. On a real Docker daemon."""
from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import yaml

from fleetpatch_demo import containerhost
from fleetpatch_demo.fleet import _free_ports
from support.paths import FIXTURE_PATCHES as FIXTURES

FIX = ("--patches", str(FIXTURES))
EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
CHECKOUT = "/sgl-workspace/sglang/python"
SITE = "/usr/local/lib/python3.13/dist-packages"   # where the image's python finds sglang (editable)
PROBE_DIR = "/var/tmp/fleetpatch-probe"
PTH = "zzz-fleetpatch-probe-"


def root(f, name: str) -> Path:
    """The container's files as the host sees them (the test runs as root in the host's pid namespace)."""
    return Path(f"/proc/{f.server_pid(name)}/root")


def probe_pths(f, name: str) -> list[str]:
    return sorted(p.name for p in (root(f, name) / SITE.lstrip("/")).iterdir() if p.name.startswith(PTH))


def probe_loaded(f, name: str) -> bool:
    """The probe is in and a process of the container (the restarted server) wrote its records."""
    try:
        records = root(f, name) / PROBE_DIR.lstrip("/") / "records"
        return bool(probe_pths(f, name) and any(records.iterdir()))
    except OSError:   # between the stop and the start: no root, or no records dir yet
        return False


def added_line(f, name: str, rel: str, text: str) -> int:
    lines = (root(f, name) / CHECKOUT.lstrip("/") / rel).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def snapshot(folder: Path) -> dict:
    """Names, bytes and modes below `folder` (the interpreter's own bytecode caches left out)."""
    out = {}
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in dirs + files:
            p = Path(top) / n
            st = p.lstat()
            out[str(p.relative_to(folder))] = (stat.S_IMODE(st.st_mode), p.read_bytes() if p.is_file() else None)
    return out


def held_open(tmp_path: Path) -> Path:
    """both-quiet with an `expect` line the server never prints: its verdict waits for the timeout."""
    folder = tmp_path / "patches"
    shutil.copytree(FIXTURES / "both-quiet", folder / "both-quiet")
    meta = yaml.safe_load((folder / "both-quiet" / "patch.yaml").read_text())
    meta["expect"] = ["a line this server never prints"]
    (folder / "both-quiet" / "patch.yaml").write_text(yaml.safe_dump(meta))
    return folder


def wait_until(check, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_patch_without_markers_is_verified_in_the_container_by_the_lines_it_ran(container_operator):
    op, f = container_operator, container_operator.fleet
    before = snapshot(root(f, "c1") / SITE.lstrip("/"))
    run = op.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "c1,c2", "--timeout", "60")
    assert run.code == 0, run
    for name, path, rel, other in (("c1", "EAGLEWorker", EAGLE, EAGLE_V2), ("c2", "EAGLEWorkerV2", EAGLE_V2, EAGLE)):
        host = run.host(name)
        assert host["status"] == "verified" and host["executed_path"] == path, run
        ex = host["execution"]
        assert ex["mode"] == "lines", ex   # the container's Python 3.13: sys.monitoring
        assert ex["ran"] == {rel: [added_line(f, name, rel, "self.fleetpatch_quiet")]}, ex
        assert ex["not_run"] == {other: "never imported"}, ex
        module = "sglang.srt.speculative." + rel.rsplit("/", 1)[1][:-3]
        assert ex["imported"] == {module: f"{CHECKOUT}/{rel}"}, "the path as the container's python sees it"
        assert ex["pid_namespace"] == "container" and ex["pids"] == [1], "the server is the container's pid 1"
        assert "executed (lines mode)" in host["message"] and "pids 1 in the container" in host["message"]
        # the worker is built before the server logs that it is ready: proved at start-up
        assert ex["proved_by"] == "startup" and "; proved by startup" in host["message"], host["message"]
        assert probe_pths(f, name) == [], "the probe is out of the container's site dir once the verdict is in"
    # the records stay in the container: verify-logs judges by them later, with the probe out
    again = op.run("verify-logs", "--patch", "both-quiet", *FIX, "--hosts", "c1")
    assert again.code == 0, again
    assert again.host("c1")["execution"]["ran"] == {EAGLE: [added_line(f, "c1", EAGLE, "self.fleetpatch_quiet")]}
    # rollback (its restart watched for imports only): the site dir as before the deploy
    back = op.run("rollback", "--hosts", "c1", *FIX)
    assert back.code == 0 and back.host("c1")["status"] == "rolled-back", back
    assert snapshot(root(f, "c1") / SITE.lstrip("/")) == before
    assert probe_pths(f, "c1") == []


def test_the_motivating_mistake_in_a_container_fails_with_the_contracts_lines(container_operator):
    op, f = container_operator, container_operator.fleet
    run = op.run("deploy-patch", "--patch", "v2-only-quiet", *FIX, "--hosts", "c1", "--force", "--timeout", "60")
    assert run.code != 0, run
    host = run.host("c1")
    assert host["status"] == "not-executed", run
    msg = host["message"]
    assert "FAIL c1  v2-only-quiet@1 never executed" in msg
    assert "no line this patch adds ran in the server (pid 1 in the container) within " in msg, msg
    assert f"    {EAGLE_V2}: never imported" in msg
    assert f"    {EAGLE}: imported, but the patch does not change it" in msg
    assert f"  the server runs EAGLEWorker ({EAGLE})" in msg
    assert "    cause: SGLANG_ENABLE_SPEC_V2 is not set" in msg
    assert host["execution"]["ran"] == {} and host["execution"]["mode"] == "lines"
    assert probe_pths(f, "c1") == []


def test_no_probe_on_a_container_host_still_refuses_a_patch_without_markers(container_operator):
    op, f = container_operator, container_operator.fleet
    run = op.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "c1", "--no-probe")
    assert run.code == 2 and "--no-probe judges by markers alone" in run.output, run
    assert f.commands("c1") == [], "refused before any host is contacted"


def test_a_killed_laptop_leaves_no_probe_in_the_container_and_a_dead_runs_goes_at_the_next_lock(container_operator,
                                                                                              tmp_path):
    op, f = container_operator, container_operator.fleet
    patches = held_open(tmp_path)
    laptop = subprocess.Popen([sys.executable, "-m", "fleetpatch", "deploy-patch", "--patch", "both-quiet",
                               "--patches", str(patches), "--hosts", "c1", "--timeout", "120"], cwd=op.workdir,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: probe_loaded(f, "c1"), what="the restarted server to load the probe")
    finally:
        laptop.send_signal(signal.SIGKILL)
        laptop.wait()
    wait_until(lambda: probe_pths(f, "c1") == [], 30, "the agent to take its probe out when its channel ended")
    # an agent killed outright leaves its .pth in the container: the next run's lock takes it out
    (root(f, "c1") / SITE.lstrip("/") / f"{PTH}deadrun.pth").write_text("import sys\n")
    run = op.run("rollback", "--hosts", "c1", *FIX, "--break-lock")
    assert run.code == 0, run
    assert probe_pths(f, "c1") == []


def test_a_container_stopped_before_the_verdict_starts_again_without_the_probe(container_operator, tmp_path):
    """The probe comes out of the stopped container's writable layer: its next start loads none."""
    op, f = container_operator, container_operator.fleet
    patches = held_open(tmp_path)
    laptop = subprocess.Popen([sys.executable, "-m", "fleetpatch", "deploy-patch", "--patch", "both-quiet",
                               "--patches", str(patches), "--hosts", "c1", "--timeout", "120"], cwd=op.workdir,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: probe_loaded(f, "c1"), what="the restarted server to load the probe")
        f.docker_cli("stop", "-t", "5", f.hosts["c1"].container_name)
        out, _ = laptop.communicate(timeout=120)
    finally:
        if laptop.poll() is None:
            laptop.kill()
    assert laptop.returncode == 1 and "the server process is not running" in out, out
    f.docker_cli("start", f.hosts["c1"].container_name)
    f.wait_healthy(["c1"])
    assert probe_pths(f, "c1") == [], out


def test_a_server_started_in_a_long_running_container_by_exec_is_watched(container_operator):
    """restart.kind command on a container host: the server started by `docker exec -d` loads the
    probe; the container's main process (started before it went in) does not count."""
    op, f = container_operator, container_operator.fleet
    port = _free_ports(1)[0]
    inv = op.inventory()
    argv = containerhost.server_argv(port, 4, 8)
    inv["hosts"]["c1"]["server"] = {
        "health_url": f"http://127.0.0.1:{port}/health", "log": "/tmp/fp-exec.log",
        "restart": {"kind": "command", "start": " ".join(["{python}", *argv[1:]]), "pidfile": "/tmp/fp-exec.pid",
                    "stop_grace": 5, "workdir": None, "env": None}}
    op.write_inventory(inv)
    run = op.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "c1", "--timeout", "60")
    assert run.code == 0 and run.host("c1")["status"] == "verified", run
    ex = run.host("c1")["execution"]
    inner = int((root(f, "c1") / "tmp/fp-exec.pid").read_text().split()[0])   # its pid in the container
    assert ex["mode"] == "lines" and ex["pids"] == [inner] and inner != 1, ex
    assert ex["ran"] == {EAGLE: [added_line(f, "c1", EAGLE, "self.fleetpatch_quiet")]}, ex
    assert probe_pths(f, "c1") == []


def generate(op, name: str, n: int = 1) -> None:
    """`n` /generate requests to the host's server, one after another (host network: its port is here)."""
    import json as _json
    import urllib.request
    health = op.inventory()["hosts"][name]["server"]["health_url"]
    url = health.rsplit("/", 1)[0] + "/generate"
    for _ in range(n):
        body = _json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 2}}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}),
                                    timeout=60) as answer:
            assert answer.status == 200


def test_how_far_the_code_got_unproven_then_proven_by_traffic_and_the_sibling_that_ran(container_operator):
    """Lines mode (the container's Python 3.13). A line in a branch of EAGLEWorker.__init__ that never
    holds: unproven, naming the function, its count and the line (exit 1). A line on the prefill path:
    proved at start-up by SGLang's warmup request (proved_by startup). The one-path
    mistake on the forward path: verify-logs names the sibling function that ran and how often."""
    op, f = container_operator, container_operator.fleet
    run = op.run("deploy-patch", "--patch", "gated-init", *FIX, "--hosts", "c1", "--timeout", "60")
    assert run.code == 1, run
    host = run.host("c1")
    line = added_line(f, "c1", EAGLE, "self.fleetpatch_gated")
    assert host["status"] == "unproven", run
    assert "FAIL c1  gated-init@1 unproven" in host["message"], host["message"]
    assert (f"EAGLEWorker.__init__ (eagle_worker.py) ran once, but no line this patch adds ran: line {line} of "
            f"{EAGLE} never did (its condition never held)") in host["message"], host["message"]
    assert "prove.concurrency" in host["message"] and "--bake" in host["message"]

    # A line on the prefill path runs for SGLang's warmup request, before the ready line (issue 31:
    # the container's server does not skip it): proved at start-up.
    run = op.run("deploy-patch", "--patch", "forward-extend", *FIX, "--hosts", "c2", "--timeout", "60")
    assert run.code == 0 and run.host("c2")["status"] == "verified", run
    ex = run.host("c2")["execution"]
    assert ex["proved_by"] == "startup", ex
    assert ex["ran"] == {EAGLE_V2: [added_line(f, "c2", EAGLE_V2, "self.fleetpatch_extend")]}, ex

    back = op.run("rollback", "--hosts", "c1", *FIX)
    assert back.code == 0, back
    run = op.run("deploy-patch", "--patch", "v2-only-forward", *FIX, "--hosts", "c1", "--force", "--timeout", "60")
    assert run.code == 1 and run.host("c1")["status"] == "not-executed", run
    generate(op, "c1")   # a request more: a prefill step, then decode steps
    later = op.run("verify-logs", "--patch", "v2-only-forward", *FIX, "--hosts", "c1")
    assert later.code == 1 and later.host("c1")["status"] == "not-executed", later
    # the warmup request, the smoke request and this one, one step each token (issue 31): counted
    # exactly up to 8, then at powers of two
    assert re.search(r"EAGLEWorker\.forward_batch_generation \(eagle_worker\.py\) ran at least \d+ times; this "
                     r"patch changes only eagle_worker_v2\.py", later.host("c1")["message"]), later.host("c1")["message"]
