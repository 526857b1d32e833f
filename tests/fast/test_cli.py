"""The command line a person meets, run as a person runs it: the installed
program (`python -m fleetpatch`) and `invoke -r <repo>`, in a subprocess, with
an inventory whose hosts are a loopback listener that counts connections, so
"no host was contacted" is checked, not assumed."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.forkcli import run_many
from support.listeners import Listener
from support.paths import REPO
from support.terminal import on_a_terminal, program_env

COMMANDS = ["fetch", "check-patch", "deploy-patch", "verify-logs", "rollback", "status", "rollout", "demo"]
FLEET_COMMANDS = [c for c in COMMANDS if c != "demo"]


env = program_env


def fleetpatch(*args, cwd=None, timeout=180, **kw):
    return subprocess.run([sys.executable, "-m", "fleetpatch", *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout, env=env(), stdin=subprocess.DEVNULL, **kw)


def invoke(*args, cwd=None):
    exe = shutil.which("invoke") or pytest.skip("no invoke program on PATH")
    return subprocess.run([exe, "-r", str(REPO), *args], cwd=cwd or REPO, capture_output=True, text=True,
                          timeout=60, env=env(), stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def listener():
    lst = Listener(lambda conn: conn.close())   # where the inventory's hosts are: counts who dials it
    yield lst
    lst.close()


def write_inventory(path: Path, port: int, names=("a01", "a02")) -> Path:
    doc = yaml.safe_load((REPO / "hosts.yaml").read_text())
    doc["hosts"] = {n: {"address": "127.0.0.1", "port": port} for n in names}
    doc["groups"] = {"canary": [names[0]]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def workdir(tmp_path, listener):
    write_inventory(tmp_path / "hosts.yaml", listener.port)
    return tmp_path


# ------------------------------------------------------------------ 1. help

@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_always_works_for_every_command(cmd, workdir):
    for args in ([cmd, "--help"], [cmd, "--hosts", "a01", "--no-such-flag", "-h"], [cmd, "--patch", "--help"]):
        r = fleetpatch(*args, cwd=workdir)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        assert " ".join(r.stdout.split()).startswith(f"Usage: fleetpatch {cmd} {USAGE[cmd]} "), (args, r.stdout)
        assert r.stderr == ""
    for args in ([cmd, "--help"], [cmd, "--hosts", "--help"] if cmd != "demo" else [cmd, "--root", "--help"]):
        r = invoke(*args, cwd=workdir)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        said = " ".join(r.stdout.split())
        assert f"{cmd} [--options]" in said or f"invoke {cmd} {USAGE[cmd]} " in said, r.stdout
        assert "--inventory" in r.stdout or cmd == "demo", r.stdout


# The usage line names the options a command cannot run without (as one line: it may wrap).
SELECT = "(--hosts A,B | --group GROUP)"
USAGE = {"check-patch": "--patch NAME[@REV] [--options]", "deploy-patch": f"--patch NAME[@REV] {SELECT} [--options]",
         "rollout": f"--patch NAME[@REV] {SELECT} [--options]", "rollback": f"{SELECT} [--options]",
         **{c: "[--options]" for c in ("fetch", "verify-logs", "status", "demo")}}


@pytest.mark.parametrize("columns", [None, "60", "100"])
def test_help_fits_the_terminal_or_80_columns_piped(columns):
    """Piped with no $COLUMNS help is 80 wide; else as wide as $COLUMNS says; no word is cut."""
    width = int(columns or 80)
    cmds = [None, *COMMANDS]
    runs = run_many([[cmd, "--help"] if cmd else ["--help"] for cmd in cmds], REPO,
                    env(**({"COLUMNS": columns} if columns else {})))
    for cmd, r in zip(cmds, runs):
        lines = r.stdout.splitlines()
        assert r.returncode == 0 and max(len(line) for line in lines) <= width, (cmd, columns, r.stdout)
        flat = " ".join(r.stdout.split())
        if cmd == "rollout":   # each flag's help whole, across its lines
            assert ("--canary=N canary hosts when the inventory has no `canary` group, a whole number (default 1; "
                    "0 skips the canary stage)") in flat, r.stdout
        if cmd == "demo":
            assert ("Run the demo: a local fleet of 4 sshd hosts, the shipped patch rolled out under traffic "
                    "through sglang-router (when installed), a one-path patch caught twice.") in flat, r.stdout
    assert columns != "100" or any(len(line) > 80 for line in lines), "a wider terminal is used"


def test_on_a_terminal_help_is_wrapped_to_its_width():
    code, out = on_a_terminal([sys.executable, "-m", "fleetpatch", "demo", "--help"], REPO, columns=60, lines=40,
                              env=env(TERM="xterm"))
    assert code == 0
    text = out.replace("\r\n", "\n")
    assert max(len(line) for line in text.splitlines()) <= 60, text
    assert "a one-path patch caught twice." in " ".join(text.split()), text


def test_fetch_and_status_list_only_the_options_that_apply_to_them():
    sys.path.insert(0, str(REPO / "src"))
    from fleetpatch.cli import task_flags
    for cmd in ("fetch", "status"):
        assert "--patches" not in task_flags(cmd) and "--patch" not in task_flags(cmd), cmd
        assert "--patches" not in fleetpatch(cmd, "--help").stdout
    r = fleetpatch("status", "--patches", "x")
    assert r.returncode == 2 and "unknown option --patches" in r.stderr, r.stderr


def test_top_level_help_lists_only_fleetpatch_s_options_and_whole_sentences():
    r = fleetpatch("--help")
    assert r.returncode == 0, r.stderr
    options = set(re.findall(r"(?m)^\s+(-\S+?)[,= \[]", r.stdout))
    assert options == {"-h", "-V", "-l"}, r.stdout
    for invoke_only in ("--pty", "--dry", "--prompt-for-sudo-password", "--echo", "--hide", "--warn-only"):
        assert invoke_only not in r.stdout
    # a command's line, and the lines of its description wrapped below it
    listed = {name: " ".join(text.split()) for name, text in
              re.findall(r"(?m)^  ([a-z-]+) {2,}(.+(?:\n {4,}.+)*)$", r.stdout.split("Subcommands:")[1])}
    assert sorted(listed) == sorted(COMMANDS)
    for cmd, line in listed.items():
        assert line[0].isupper() and line.endswith(".") and len(line.split()) >= 5, (cmd, line)


def test_invoke_s_options_are_refused_not_silently_taken():
    r = fleetpatch("--pty", "status")
    assert r.returncode == 2
    assert r.stderr.strip() == "fleetpatch: error: unknown option --pty; see fleetpatch --help"


# ------------------------------------------------------------------ 2. bad values

NUMBERS = {"parallel": ["abc", "-1", "0", "1.5"], "canary": ["x", "-1"], "batch": ["x", "0", "-2"],
           "max-failures": ["many", "-1"], "timeout": ["soon", "0", "-3", "nan"]}


def bad_values(cmd: str, flags: set[str], tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, the flag the error must name) for every flag of `cmd` that takes a
    value: every bad number for rollout (it has them all), one per flag elsewhere."""
    base = ["--hosts", "a01"] if cmd != "demo" else []
    patch = ["--patch", "spec-path-beacon"] if cmd in ("check-patch", "deploy-patch", "rollout") else []
    out = []
    for flag, values in NUMBERS.items():
        if f"--{flag}" in flags:
            out += [([cmd, *base, *patch, f"--{flag}", v], f"--{flag}") for v in values[:None if cmd == "rollout" else 1]]
    bad = {"--inventory": str(tmp / "missing.yaml"), "--hosts": "nosuch", "--group": "nosuch",
           "--patches": str(tmp / "no-dir"), "--report": "/proc/fleetpatch/report.json",
           "--on-failure": "maybe", "--dest": "/proc/fleetpatch/sources"}
    for flag, value in bad.items():
        if flag in flags:
            b = [] if flag in ("--hosts", "--group") else base
            out.append(([cmd, *b, *patch, flag, value], {"--inventory": "missing.yaml", "--hosts": "nosuch",
                                                         "--group": "nosuch"}.get(flag, flag)))
    if "--patch" in flags:
        out.append(([cmd, *base, "--patch", "no/such patch"], "no/such patch"))
    out.append(([cmd, *base, "--no-such-flag"], "--no-such-flag"))
    out.append(([cmd, *base, "--report"], "--report") if "--report" in flags else ([cmd, "--root"], "--root"))
    return out


def test_every_bad_flag_value_is_one_line_exit_2_and_no_host_is_contacted(workdir, listener):
    sys.path.insert(0, str(REPO / "src"))
    from fleetpatch.cli import task_flags
    cases = [case for cmd in COMMANDS for case in bad_values(cmd, set(task_flags(cmd)), workdir)]
    assert len(cases) > 60
    before = listener.accepted
    runs = run_many([argv for argv, _ in cases], workdir, env())
    for (argv, named), r in zip(cases, runs):
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("fleetpatch: error: "), (argv, r.stderr)
        assert named in lines[0], (argv, lines[0])
        assert "Traceback" not in r.stdout + r.stderr
        assert r.stdout == "", (argv, r.stdout)
    assert listener.accepted == before, "a bad command line contacted a host"


def test_under_invoke_a_bad_value_is_the_same_one_line_and_exit_2(workdir, listener):
    before = listener.accepted
    r = invoke("status", "--parallel", "abc", cwd=workdir)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == "fleetpatch: error: --parallel: expected a whole number of 1 or more, got 'abc'"
    r = invoke("rollout", "--patch", "spec-path-beacon", "--hosts", "a01", "--report", str(workdir), cwd=workdir)
    assert r.returncode == 2 and "is a directory" in r.stderr and len(r.stderr.splitlines()) == 1
    assert listener.accepted == before


def test_a_number_flag_says_the_accepted_form():
    r = fleetpatch("rollout", "--patch", "spec-path-beacon", "--group", "all", "--batch", "0")
    assert r.stderr.strip() == "fleetpatch: error: --batch: expected a whole number of 1 or more, got 0"
    r = fleetpatch("deploy-patch", "--patch", "spec-path-beacon", "--group", "all", "--timeout", "soon")
    assert r.stderr.strip() == ("fleetpatch: error: --timeout: expected seconds (a number above 0, e.g. 30 or 2.5), "
                                "got 'soon'")


def test_an_unwritable_report_is_refused_before_any_host(workdir, listener):
    before = listener.accepted
    (workdir / "adir").mkdir()
    for path, why in ((workdir / "adir", "is a directory"),
                      (workdir / "hosts.yaml" / "r.json", "is a file, not a directory")):
        r = fleetpatch("status", "--report", str(path), cwd=workdir)
        assert r.returncode == 2, r
        assert why in r.stderr and f"--report {path}" in r.stderr
    assert listener.accepted == before


def test_a_report_in_a_folder_that_does_not_exist_is_refused_and_no_folder_is_made(workdir, listener):
    before = listener.accepted
    path = workdir / "nonexistent" / "deeper" / "x.json"
    for cmd in (["status"], ["deploy-patch", "--patch", "spec-path-beacon", "--hosts", "a01"]):
        r = fleetpatch(*cmd, "--report", str(path), cwd=workdir)
        assert r.returncode == 2, r
        assert r.stderr == (f"fleetpatch: error: --report {path}: the folder {path.parent} does not exist; "
                            f"make it first (mkdir -p {path.parent}) or give a path in a folder that exists\n")
        assert not (workdir / "nonexistent").exists()
    assert listener.accepted == before


def test_an_empty_host_name_is_refused_before_any_host(workdir, listener):
    before = listener.accepted
    for hosts in ("a01,,a02", "a01,"):
        r = fleetpatch("deploy-patch", "--patch", "spec-path-beacon", "--hosts", hosts, cwd=workdir)
        assert r.returncode == 2, r
        assert r.stderr.startswith(f"fleetpatch: error: --hosts {hosts!r}: host name 2 of "), r.stderr
        assert len(r.stderr.splitlines()) == 1
    assert listener.accepted == before


# ------------------------------------------------------------------ 3. unknown and short flags

def test_an_unknown_flag_is_named_with_a_suggestion(workdir):
    r = fleetpatch("status", "--host", "a01", cwd=workdir)
    assert r.returncode == 2
    assert r.stderr.strip() == ("fleetpatch: error: status: unknown option --host (did you mean --hosts?); "
                                "see fleetpatch status --help")
    r = fleetpatch("check-patch", "--patchs", "X", cwd=workdir)
    assert r.returncode == 2
    # one letter from --patch and one from --patches: both are named, the flag the user needs first
    assert r.stderr.strip() == ("fleetpatch: error: check-patch: unknown option --patchs (did you mean --patch or "
                                "--patches?); see fleetpatch check-patch --help")
    r = fleetpatch("deploy-patch", "-p", "X", cwd=workdir)
    assert r.returncode == 2 and "did you mean" not in r.stderr, r.stderr   # -v is no near miss of -p
    r = fleetpatch("stauts", cwd=workdir)
    assert r.returncode == 2 and "unknown command 'stauts' (did you mean status?)" in r.stderr


def test_no_short_flag_means_two_things_the_only_one_is_v(workdir):
    for cmd in COMMANDS:
        help_text = fleetpatch(cmd, "--help").stdout
        assert "--hosts" in help_text or cmd == "demo"
        shorts = re.findall(r"(?m)^\s+(-[a-zA-Z])[ ,=]", help_text)
        assert shorts == ([] if cmd == "demo" else ["-v"]), (cmd, help_text)
        assert cmd == "demo" or "-v, --verbose" in help_text
    # -p was --patch in one command and --parallel in another, -m --timeout and --max-failures
    for cmd, short in (("deploy-patch", "-p"), ("rollout", "-p"), ("rollout", "-m"), ("deploy-patch", "-m"),
                       ("status", "-i")):
        r = fleetpatch(cmd, short, "1", cwd=workdir)
        assert r.returncode == 2, (cmd, short, r.stdout)
        assert f"unknown option {short}" in r.stderr


# ------------------------------------------------------------------ 5. counts

def test_unreachable_hosts_are_counted_as_unreachable_and_the_stop_is_true(tmp_path):
    closed = []
    for _ in range(3):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        closed.append(s.getsockname()[1])
        s.close()
    doc = yaml.safe_load((REPO / "hosts.yaml").read_text())
    doc["hosts"] = {f"h{i}": {"address": "127.0.0.1", "port": closed[i % 3]} for i in range(5)}
    doc["groups"] = {}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(doc))
    r = fleetpatch("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "0", "--batch", "3",
                   "--report", "r.json", cwd=tmp_path)
    assert r.returncode == 1, r
    out = r.stdout
    stopped = [line for line in out.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1
    assert "more than --max-failures 0" in stopped[0]
    assert "in the end 3 unreachable (h0, h1, h2)" in stopped[0]
    assert "2 hosts not started (skipped, untouched)" in stopped[0]
    last = out.splitlines()[-1]
    assert last.startswith("FAILED on 3 of 5 hosts: h0 (unreachable), h1 (unreachable), h2 (unreachable)")
    assert "3 unreachable, 2 skipped" in last and "failed" not in last.split("—")[1].split(";")[0]
    import json
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["counts"] == {"unreachable": 3, "skipped": 2}
    assert doc["stopped"] == stopped[0]


def test_one_host_is_one_host(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    write_inventory(tmp_path / "hosts.yaml", port, names=("solo",))
    r = fleetpatch("status", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1].startswith("FAILED on 1 of 1 host: solo (unreachable) — 1 unreachable")


# ------------------------------------------------------------------ 6. pipes and TTYs

def test_off_a_tty_nothing_is_cut_or_wrapped(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    long_names = ("gpu-" + "a" * 70 + "-01", "gpu-" + "b" * 70 + "-02")
    write_inventory(tmp_path / "hosts.yaml", port, names=long_names)
    r = fleetpatch("status", cwd=tmp_path)
    assert r.returncode == 1
    assert "…" not in r.stdout
    table_rows = [line for line in r.stdout.splitlines() if long_names[0] in line]
    assert table_rows and any("no (unreachable)" in line for line in table_rows), r.stdout
    message = [line for line in r.stdout.splitlines() if line.startswith(long_names[1] + " (")]
    assert message and message[0].endswith("check the port and that sshd runs"), r.stdout


def test_on_a_tty_the_live_view_shows_each_host_s_stage(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    write_inventory(tmp_path / "hosts.yaml", port, names=("c1", "b1", "b2", "b3"))
    code, out = on_a_terminal([sys.executable, "-m", "fleetpatch", "rollout", "--patch", "spec-path-beacon",
                               "--group", "all", "--batch", "2", "--max-failures", "9", "--on-failure", "keep"],
                              tmp_path, env=env(COLUMNS="160", LINES="50", TERM="xterm"), timeout=60)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert "stage" in text
    assert re.search(r"c1\s+│\s+canary", text), text
    assert re.search(r"b1\s+│\s+batch 1 of 2", text) and re.search(r"b3\s+│\s+batch 2 of 2", text), text


def test_output_whose_reader_went_away_ends_without_a_traceback():
    """`fleetpatch --help | head -1` when head has already exited: every write meets a
    closed pipe (the read end is closed before fleetpatch starts, so it always does)."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "fleetpatch", "--help"], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    finally:
        os.close(w)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_loading_the_program_leaves_the_interpreter_as_python_made_it():
    """No stand-in modules in sys.modules and the garbage collector untouched: a
    test runner or a program that imports fleetpatch.cli gets Python as usual."""
    code = ("import gc, sys, fleetpatch.cli\n"
            "fakes = [k for k in ('invoke.vendor.yaml', 'unittest.mock') if k in sys.modules\n"
            "         and sys.modules[k].__name__ != k]\n"
            "print(gc.isenabled(), gc.get_freeze_count(), fakes)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "0", "[]"]
