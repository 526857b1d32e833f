"""The probe's host side where the server may be hostile or in a container: records read only as
regular files in real folders; container paths never followed through a symlink; the server's
pids named in the namespace the records use; the verdict saying which namespace that is."""
import json
import os

import pytest

from fleetpatch.agent import container_probe
from fleetpatch.probe import install as probe_install
from fleetpatch.steps.execution import ExecutionView


def test_records_are_read_as_regular_files_only_never_through_a_link_nor_from_a_fifo(tmp_path):
    proc = tmp_path / "records" / "41-1"
    proc.mkdir(parents=True)
    (proc / "process.json").write_text('{"pid": 41}')
    secret = tmp_path / "host-secret"
    secret.write_text("not the probe's")
    (proc / "M-x.json").symlink_to(secret)
    os.mkfifo(proc / "L-x-3.json")   # an open of it would wait for a writer forever
    (tmp_path / "records" / "7-1").symlink_to(tmp_path)   # a process folder that leads elsewhere
    assert probe_install.read_records(str(tmp_path)) == {"41-1/process.json": b'{"pid": 41}'}


def test_a_container_path_through_a_symlink_is_refused(tmp_path):
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "tmp").symlink_to("/tmp")   # absolute: from the host it is the host's /tmp
    with pytest.raises(probe_install.ProbeInstallError, match="/var/tmp in the container is a symlink"):
        container_probe.no_links(str(tmp_path), container_probe.PROBE_DIR)
    (tmp_path / "usr").mkdir()
    assert container_probe.no_links(str(tmp_path), "/usr/lib") == str(tmp_path / "usr" / "lib")


def test_the_server_and_its_children_are_named_in_their_own_pid_namespace():
    me = os.getpid()   # this process's pid in its own namespace is the innermost of NSpid
    assert container_probe.inner_pid(me) == me
    assert container_probe.inner_pid(2 ** 22 + 1) is None
    ev = container_probe.inside_view({"t": "probe", "pid": me, "records": {}}, [me])
    assert ev["pid"] == me and ev["host_pid"] == me and ev["children"] == [me]
    assert ev["pid_namespace"] == "container"
    assert container_probe.version_of("/usr/local/lib/python3.13/dist-packages") == "3.13"
    assert container_probe.version_of("/opt/venv/site-packages") == ""


def test_the_block_says_its_pids_are_the_containers():
    plan = {"modules": {"m": {"path": "m.py", "expected": "/c/m.py", "lines": [3]}}, "label": "p@1"}
    records = {"1-5/process.json": json.dumps({"pid": 1, "ppid": 0, "mode": "lines"}),
               "1-5/L-m-3.json": json.dumps({"module": "m", "path": "m.py", "line": 3, "pid": 1}),
               "9-5/process.json": json.dumps({"pid": 9, "ppid": 1, "mode": "lines"})}
    view = ExecutionView({"installed": True})
    view.add({"t": "probe", "records": records, "plan": plan, "pid": 1, "children": [], "pid_namespace": "container"})
    block = view.block("p@1")
    assert block["pid_namespace"] == "container"
    assert block["pids"] == [1, 9] and block["ran"] == {"m.py": [3]}


def test_a_record_that_comes_later_is_in_the_next_judgement():
    """The view keeps its block between events (a follow judges far more often than the probe
    reports), so a record that arrives later must still reach the next judgement, and what a
    verdict writes into one block must not show in the next."""
    plan = {"modules": {"m": {"path": "m.py", "expected": "/c/m.py", "lines": [3]}}, "label": "p@1"}
    started = {"1-5/process.json": json.dumps({"pid": 1, "ppid": 0, "mode": "lines"})}
    view = ExecutionView({"installed": True})
    view.add({"t": "probe", "records": started, "plan": plan, "pid": 1, "children": []})
    first = view.block("p@1")
    assert first["pids"] == [1] and first["ran"] == {}
    first["proved_by"] = "startup"
    assert "proved_by" not in view.block("p@1")

    view.add({"t": "probe", "records": {"1-5/L-m-3.json": json.dumps({"module": "m", "path": "m.py", "line": 3,
                                                                      "pid": 1})}, "pid": 1})
    assert view.block("p@1")["ran"] == {"m.py": [3]}
