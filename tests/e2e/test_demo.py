"""`fleetpatch demo` end to end, as a user runs it (a subprocess, no TTY), and
`fleetpatch demo --down` leaving nothing behind.

The demo keeps its state in one per-user folder ($XDG_STATE_HOME/fleetpatch/demo;
the tests point $XDG_STATE_HOME at a temporary folder): the commands it prints
work from any folder, `--down` finds the fleet from any folder, and a second
`demo` never silently wipes what the user deployed on the demo fleet."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo import run as demo_run
from fleetpatch_demo import traffic as demo_traffic
from fleetpatch_demo.fleet import Fleet
from fleetpatch_demo.routerproc import router_command
from fleetpatch.router import Router
from support.demo_cli import fleetpatch, section
from support.marks import needs_fleet
from support.paths import REPO


def test_the_demo_patch_is_the_fixture():
    fixture = REPO / "tests" / "fixtures" / "patches" / "v2-only-beacon"
    shipped = demo_run.DEMO_PATCHES / "v2-only-beacon"
    assert (shipped / "sglang-0.5.9.r1.diff").read_bytes() == (fixture / "sglang-0.5.9.r1.diff").read_bytes()
    assert "allow_single_path" in (shipped / "patch.yaml").read_text()


def test_up_says_what_is_missing_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fleetmod, "SSHD", str(tmp_path / "no-sshd"))
    monkeypatch.setattr(demo_run.os, "geteuid", lambda: 1000)
    real_which = shutil.which
    monkeypatch.setattr(demo_run.shutil, "which", lambda t, *a, **k: None if t in ("sshd", "nsenter") else real_which(t))
    root = tmp_path / "demo"
    assert demo_run.up(root) == 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns here
    assert "apt-get install -y openssh-server" in out
    assert "needs root" in out and "mount namespace" in out
    assert "nsenter is missing" in out
    assert not root.exists()


def test_without_the_router_the_demo_says_so_in_one_line_and_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_traffic.routerproc, "router_command", lambda: None)
    assert demo_run._launch_router(demo_run._console(), tmp_path / "demo") is None
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    assert "sglang-router is not installed" in out and "runs without a router" in out
    assert "pip install sglang-router" in out
    assert not (tmp_path / "demo").exists(), "nothing is started or created"


ROUTER = router_command() is not None
TOTALS = re.compile(r"^Router traffic (during the rollout|until Ctrl-C): (\d+) requests sent, (\d+) served, "
                    r"(\d+) failed, (\d+) cut \((\d+) of them streams\)\.$", re.M)


def router_totals(out: str) -> dict:
    m = TOTALS.findall(out)
    assert len(m) == 1, out
    sent, served, failed, cut, streams = map(int, m[0][1:])
    return {"sent": sent, "served": served, "failed": failed, "cut": cut, "streams": streams}


def router_process_gone(doc: dict) -> bool:
    """No process of the router's session is left (a zombie awaiting its reaper holds nothing)."""
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and fields[3] == str(doc["pid"]):
            return False
    return True


def test_down_without_a_fleet_is_a_no_op(tmp_path):
    code, out = fleetpatch("demo", "--down", "--root", str(tmp_path / "none"), cwd=tmp_path)
    assert code == 0, out
    assert "nothing to stop" in out


def test_the_demo_s_state_is_one_per_user_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert demo_run.default_root() == tmp_path / "state" / "fleetpatch" / "demo"
    assert demo_run.down_command(demo_run.default_root()) == "fleetpatch demo --down"
    assert demo_run.down_command(tmp_path / "x") == f"fleetpatch demo --down --root {tmp_path / 'x'}"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # the XDG spec: ignored unless absolute
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert demo_run.default_root() == tmp_path / "home" / ".local" / "state" / "fleetpatch" / "demo"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert demo_run.default_root() == tmp_path / "home" / ".local" / "state" / "fleetpatch" / "demo"
    # --down from any folder looks in that one place, and says where it looked
    (tmp_path / "somewhere").mkdir()
    code, out = fleetpatch("demo", "--down", cwd=tmp_path / "somewhere", XDG_STATE_HOME=str(tmp_path / "state"))
    assert code == 0, out
    assert f"No demo fleet is recorded in {tmp_path / 'state' / 'fleetpatch' / 'demo'}: nothing to stop." in out
    assert not (tmp_path / "state").exists() and not any((tmp_path / "somewhere").iterdir())


@needs_fleet
def test_demo_up_then_down(tmp_path):
    """One demo run, then what a user does with it from other folders: the printed
    commands, a second `demo` after a rollback (refused, nothing changed), `--down`."""
    xdg = {"XDG_STATE_HOME": str(tmp_path / "state")}
    root = tmp_path / "state" / "fleetpatch" / "demo"
    here, elsewhere, third = tmp_path / "here", tmp_path / "elsewhere", tmp_path / "third"
    for d in (here, elsewhere, third):
        d.mkdir()
    try:
        code, out = fleetpatch("demo", cwd=here, **xdg)
        assert code == 0, out
        assert not any(here.iterdir()), "the demo writes nothing in the folder it was started from"
        state = json.loads((root / "fleet.json").read_text())
        assert sorted(state["hosts"]) == ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]
        assert state["running"]

        # 2. rollout: canary first, then the rest, each verified on the path it runs
        rollout = section(out, "2. rollout", "3. check-patch")
        assert "OK: rollout succeeded on all 4 hosts" in rollout, out
        for host, path in [("gpu-a01", "EAGLEWorkerV2"), ("gpu-a02", "EAGLEWorkerV2"),
                           ("gpu-a03", "EAGLEWorker"), ("gpu-a04", "EAGLEWorker")]:
            assert any(host in line and "verified" in line and f" {path} " in line
                       for line in rollout.splitlines()), (host, rollout)
        assert rollout.index("gpu-a01      queued canary") < rollout.index("queued batch 1")
        doc = json.loads((root / "reports" / "2-rollout.json").read_text())
        assert {h["status"] for h in doc["hosts"].values()} == {"verified"}
        # gpu-a02 runs two servers on its one install: each restarted and verified on its own
        inv = yaml.safe_load((root / "hosts.yaml").read_text())
        assert sorted(inv["hosts"]["gpu-a02"]["servers"]) == ["s0", "s1"]
        two = doc["hosts"]["gpu-a02"]["servers"]
        assert {s: (h["status"], h["executed_path"]) for s, h in two.items()} == \
            {"s0": ("verified", "EAGLEWorkerV2"), "s1": ("verified", "EAGLEWorkerV2")}, two
        assert "gpu-a02 runs two servers (s0, s1" in out
        if ROUTER:
            # the real router in front of the fleet, traffic through it for the whole rollout
            inv = yaml.safe_load((root / "hosts.yaml").read_text())
            router_url = inv["defaults"]["router"]["urls"][0]
            assert f"sglang-router up on {router_url}" in out
            t = router_totals(rollout)
            assert t["failed"] == 0 and t["cut"] == 0, t
            assert t["served"] == t["sent"] > 0 and t["streams"] > 0, t
            assert "0 failed, 0 cut: that is the drained rollout" in rollout
            assert re.search(r"^traffic +\d+s: \d+ requests sent, \d+ served, 0 failed, 0 cut, ", rollout, re.M), \
                "a plain traffic line while the rollout runs"
            for h in doc["hosts"].values():
                assert h["router"]["removed"] and h["router"]["readded"], h
            for s in ("s0", "s1"):   # each server of gpu-a02 left the router and came back on its own
                assert two[s]["router"]["removed"] and two[s]["router"]["readded"], two[s]
            assert f"Router traffic during the rollout: {t['sent']} requests sent" in section(out, "demo summary", None)
        else:
            assert "sglang-router is not installed" in out and "pip install sglang-router" in out

        # 3. check-patch: refused by the pre-flight check, nothing written
        check = section(out, "3. check-patch", "4. deploy-patch")
        for host in ("gpu-a03", "gpu-a04"):
            assert f"FAIL {host}  v2-only-beacon@1 would never execute (pre-flight)" in check, check
        assert "the server will run EAGLEWorker (sglang/srt/speculative/eagle_worker.py)" in check
        assert "cause: SGLANG_ENABLE_SPEC_V2 is not set" in check
        assert "nothing was written" in check
        assert "gpu-a01" not in check and "gpu-a02" not in check

        # 4. forced deploy: fails loudly, the server runs EAGLEWorker
        deploy = section(out, "4. deploy-patch --force", "5. deploy-patch")
        for host in ("gpu-a03", "gpu-a04"):
            assert f"FAIL {host}  v2-only-beacon@1 never executed" in deploy, deploy
        assert "the server runs EAGLEWorker (sglang/srt/speculative/eagle_worker.py)" in deploy
        assert 'evidence: log line' in deploy and "Overlap scheduler is disabled when spec v2 is off" in deploy
        assert "cause: SGLANG_ENABLE_SPEC_V2 is not set (and --speculative-eagle-topk 4 needs the v1 path)" in deploy
        # the probe watched: no line the patch adds ran (eagle_worker_v2.py never imported)
        assert "no line this patch adds ran in the server" in deploy, deploy
        assert "sglang/srt/speculative/eagle_worker_v2.py: never imported" in deploy
        assert "FAILED on 2 of 2 hosts: gpu-a03 (not-executed), gpu-a04 (not-executed)" in deploy
        if ROUTER:  # failed verification: kept out of the router, the others serve
            assert deploy.count("not put back into the router: it failed verification") == 2, deploy
            listed = {w.url for w in Router(router_url).list_workers() if w.healthy}
            assert listed == {inv["hosts"]["gpu-a01"]["server"]["url"],
                              *(s["url"] for s in inv["hosts"]["gpu-a02"]["servers"].values())}, listed

        assert_proof_steps(out, root)

        summary = section(out, "demo summary", None)
        assert "The demo behaved as expected" in summary
        assert "steps 3, 4 and 6 are meant to fail" in " ".join(summary.split())
        assert "The demo fleet stays up" in summary
        export = f"  export FLEETPATCH_INVENTORY={root / 'hosts.yaml'}"
        assert export in summary.splitlines(), summary
        assert "`fleetpatch demo --down` takes it down." in summary
        try_lines = [ln.strip() for ln in summary.splitlines() if ln.startswith("  fleetpatch ")]
        rollback_cmd, status_cmd = try_lines
        assert rollback_cmd.startswith("fleetpatch rollback --patch v2-only-beacon --patches /"), rollback_cmd
        assert f"--inventory {root / 'hosts.yaml'}" in rollback_cmd and status_cmd.endswith(str(root / "hosts.yaml"))

        # it keeps running after the command, and the printed line points everyday commands at it
        fleet = Fleet.attach(root)
        assert fleet.is_running()
        ports = [p for h in fleet.hosts.values() for p in (h.ssh_port, *h.http_ports)]
        assert set(ports) <= set(fleetmod._listening_ports())
        assert all(fleet._ns_members().values())
        env = {**os.environ, "FLEETPATCH_INVENTORY": str(root / "hosts.yaml"), "COLUMNS": "200"}
        proc = subprocess.run([sys.executable, "-m", "fleetpatch", "status"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=env)
        # gpu-a03/a04 keep the forced patch (no drift), and their last verification failed: a failing host
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "gpu-a04" in proc.stdout and "v2-only-beacon@1" in proc.stdout
        assert "FAILED on 2 of 4 hosts: gpu-a03 (not-executed), gpu-a04 (not-executed)" in proc.stdout, proc.stdout

        # the printed commands work from another folder, as printed
        code, status_out = run_printed(status_cmd, elsewhere)
        assert code == 1 and "gpu-a04 (not-executed)" in status_out, status_out
        assert demo_run._refuse_rerun(root, "fleetpatch demo --down") is None, "untouched: a rerun may restart it"
        code, rollback_out = run_printed(rollback_cmd, elsewhere)
        assert code == 0, rollback_out
        assert "OK: rollback succeeded on all 2 hosts" in rollback_out, rollback_out

        # a second demo now would wipe what the user did: refused, nothing changed
        before = demo_run._host_digests(fleet)
        code, again = fleetpatch("demo", cwd=elsewhere, **xdg)
        assert code == 2, again
        flat = " ".join(again.split())
        assert f"a demo fleet is already running in {root}" in flat, again
        assert "the SGLang files of gpu-a03, gpu-a04 changed since the demo ended" in flat, again
        assert "nothing was changed" in flat and "`fleetpatch demo --down`, then `fleetpatch demo`" in flat, again
        assert f"export FLEETPATCH_INVENTORY={root / 'hosts.yaml'}" in flat, again
        assert "Starting the fleet" not in again
        assert demo_run._host_digests(fleet) == before and fleet.is_running()
        assert json.loads((root / "fleet.json").read_text()) == state, "the same fleet, not a new one"

        assert_down_removes_everything(third, root, fleet, state, ports, down=("demo", "--down"), env=xdg)
        # what the demo made is gone; the laptop's agent-cache key (remote.cache_key_path) is no demo's
        left = tmp_path / "state" / "fleetpatch"
        assert not left.exists() or sorted(p.name for p in left.iterdir()) == ["agent-cache.key"]
    finally:
        if (root / "fleet.json").exists():
            Fleet.attach(root).stop()


def assert_proof_steps(out: str, root: Path) -> None:
    """Steps 5-8 (proof under traffic, fleetpatch_demo/proof.py) on gpu-a01, whose server runs with
    --skip-server-warmup: a forward-path patch proven by its smoke request, a gated one unproven
    until 8 requests at once make its batch, both rolled back."""
    reports = root / "reports"
    inv = yaml.safe_load((root / "hosts.yaml").read_text())
    assert inv["hosts"]["gpu-a01"]["server"]["restart"]["start"].endswith(" --skip-server-warmup")

    forward = section(out, "5. deploy-patch", "6. deploy-patch")
    assert "OK: deploy-patch succeeded on its one host: 1 verified" in forward, forward
    h = json.loads((reports / "5-deploy-step-count.json").read_text())["hosts"]["gpu-a01"]
    assert h["status"] == "verified" and h["patch"] == "step-count@1", h
    assert h["execution"]["proved_by"] == "smoke" and h["smoke"]["statuses"] == [200], h
    assert h["execution"]["ran"]["sglang/srt/speculative/eagle_worker_v2.py"], h["execution"]

    gated = section(out, "6. deploy-patch", "7. verify-logs")
    assert "FAIL gpu-a01  large-batch@1 unproven" in gated, gated
    h = json.loads((reports / "6-deploy-large-batch.json").read_text())["hosts"]["gpu-a01"]
    assert h["status"] == "unproven" and h["smoke"]["statuses"] == [200], h
    assert "forward_batch_generation (eagle_worker_v2.py) ran" in h["message"], h["message"]
    assert not h["execution"]["ran"], h["execution"]   # the function ran, its one added line did not

    traffic = section(out, "7. verify-logs", "8. rollback")
    assert "8 sent, 8 served, 0 failed." in traffic, traffic
    h = json.loads((reports / "7-verify-logs.json").read_text())["hosts"]["gpu-a01"]
    assert h["status"] == "verified" and h["patch"] == "large-batch@1", h
    assert h["execution"]["proved_by"] == "traffic", h["execution"]

    back = section(out, "8. rollback", "demo summary")
    for n, name in enumerate(("large-batch", "step-count")):
        h = json.loads((reports / f"8-rollback-{n + 1}-{name}.json").read_text())["hosts"]["gpu-a01"]
        assert h["status"] == "rolled-back" and h["smoke"]["statuses"] == [200], h
        assert "the restarted server answered its smoke request (HTTP 200)" in h["message"], h["message"]
    assert back.count("OK: rollback succeeded on its one host: 1 rolled-back") == 2, back
    summary = section(out, "demo summary", None)
    for line in ("5. deploy-patch  exit 0  step-count verified on gpu-a01 by its smoke request",
                 "6. deploy-patch  exit 1  large-batch unproven", "7. verify-logs   exit 0  large-batch verified",
                 "8. rollback      exit 0  large-batch, then step-count, rolled back on gpu-a01"):
        assert line in summary, summary


def run_printed(command: str, cwd: Path):
    """A command line the demo printed, run as printed (no FLEETPATCH_INVENTORY), from `cwd`."""
    argv = shlex.split(command)
    assert argv[0] == "fleetpatch", command
    env = {k: v for k, v in os.environ.items() if k != "FLEETPATCH_INVENTORY"}
    proc = subprocess.run([sys.executable, "-m", "fleetpatch", *argv[1:]], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**env, "COLUMNS": "200"}, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def fleet_processes(state: dict) -> list[int]:
    """Every process in one of the fleet's mount namespaces (its sshds, servers and sessions)."""
    inos = {h["ns_ino"] for h in state["hosts"].values() if h.get("ns_ino")}
    return [pid for pid in fleetmod._pids() if fleetmod._ns_ino(pid) in inos and fleetmod._alive(pid)]


def assert_down_removes_everything(cwd, root, fleet, state, ports, down=None, env=None):
    mount_point = fleet.mount_point
    router = demo_traffic.read_record(root)
    if ROUTER:  # it outlives the demo command, in front of the fleet its inventory names
        assert router is not None and not router_process_gone(router)
        ports = ports + demo_traffic.ports(router)
        assert set(demo_traffic.ports(router)) <= set(fleetmod._listening_ports())
    assert fleet_processes(state), "the fleet runs before --down"
    down = down or ("demo", "--down", "--root", str(root))
    code, out = fleetpatch(*down, cwd=cwd, **(env or {}))
    assert code == 0, out
    assert not fleet_processes(state), "no process of the fleet is left"
    assert "Stopped the demo fleet" in out
    if ROUTER:
        assert f"Stopped the router {router['url']} (pid {router['pid']})." in out
        assert router_process_gone(router), "no router process is left"
        # the clients were threads of the demo command: none of its processes is left either
        assert not [d for d in os.listdir("/proc") if d.isdigit() and _cmdline_has(d, str(root))], \
            "no process started for this demo is left"
    assert not any(fleetmod._alive(h["sshd_pid"]) and fleetmod._ns_ino(h["sshd_pid"]) == h["ns_ino"]
                   for h in state["hosts"].values()), "no sshd of the fleet is left"
    assert not set(ports) & set(fleetmod._listening_ports()), "every port is closed"
    assert not root.exists(), f"{root} is left: {sorted(p.name for p in root.iterdir())}"
    if demo_run._mounted_in_some_namespace(mount_point):  # another fleet (e.g. the suite's) uses it
        assert f"Kept the mount point {mount_point}: another fleet" in out
    else:
        assert not os.path.exists(mount_point), out
        assert f"Removed the empty mount point {mount_point}" in out
    code, out = fleetpatch(*down, cwd=cwd, **(env or {}))
    assert code == 0, out
    assert "nothing to stop" in out


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False


@needs_fleet
def test_ctrl_c_in_the_demo_lets_the_step_finish_its_hosts_and_says_where_the_fleet_is(tmp_path):
    root = tmp_path / "demo"
    env = {**os.environ, "COLUMNS": "200", demo_run.STARTUP_DELAY_ENV: "1.5"}
    env.pop("FLEETPATCH_INVENTORY", None)
    proc = subprocess.Popen([sys.executable, "-m", "fleetpatch", "demo", "--root", str(root)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    seen = []
    try:
        in_rollout = False
        for line in proc.stdout:
            seen.append(line)
            in_rollout = in_rollout or "2. rollout" in line
            # with a router: once the canary is past its drain and restart, so it has something to finish
            if in_rollout and (" verify" in line if ROUTER else line.rstrip().endswith(" restart")):
                break
        else:
            raise AssertionError("the rollout never restarted a host:\n" + "".join(seen))
        proc.send_signal(signal.SIGINT)  # as the terminal does: to the demo, not to its child
        rest, _ = proc.communicate(timeout=180)
        out = "".join(seen) + rest
        assert proc.returncode == 130, out
        assert "interrupted during step 'rollout'" in out
        assert "No host is left locked (checked)." in out
        assert f"  export FLEETPATCH_INVENTORY={root / 'hosts.yaml'}" in out.splitlines()
        assert "fleetpatch demo --down --root" in out and "takes it down" in out
        assert "3. check-patch" not in out, "no later step runs after Ctrl-C"
        assert "Traceback" not in out
        if ROUTER:
            t = router_totals(out)
            assert "Router traffic until Ctrl-C" in out
            assert t["failed"] == 0 and t["cut"] == 0 and t["served"] > 0, t
            assert "stays up in front of the fleet" in out
        doc = json.loads((root / "reports" / "2-rollout.json").read_text())
        assert doc["interrupted"] is True
        fleet = Fleet.attach(root)
        statuses = {n: h["status"] for n, h in doc["hosts"].items()}
        for n, st in statuses.items():
            assert st in ("verified", "rolled-back", "skipped"), statuses
            assert f"  {n}: {st}" in out
            assert not (fleet.hosts[n].state_dir / "lock").exists(), f"{n} is left locked"
        assert "verified" in statuses.values(), statuses  # the canary was in flight and finished
        state = json.loads((root / "fleet.json").read_text())
        ports = [p for h in fleet.hosts.values() for p in (h.ssh_port, *h.http_ports)]
        assert_down_removes_everything(tmp_path, root, fleet, state, ports)
    finally:
        if proc.poll() is None:
            proc.kill()
        if (root / "fleet.json").exists():
            Fleet.attach(root).stop()
