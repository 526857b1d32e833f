"""The probe's runtime is compiled once, by the agent (issue 34, 3): the .pth loads that code
in an interpreter of the agent's exact build, and compiles the source as before in any
other (a stamp that does not match, a code file that is missing or torn)."""
from __future__ import annotations

import json

import pytest

from fleetpatch.probe import install as probe_install
from support.probed_start import probed_start

MODULE = "def hot(x):\n    return x + 1  # added\n"


def start(tmp_path):
    """One interpreter start that reads the site dir and runs the added line; the records it left."""
    probed_start(tmp_path, "import fp_code_probed as m\nm.hot(1)\n")
    return probe_install.read_records(str(tmp_path / "probe"))


@pytest.fixture
def probed(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "mods" / "fp_code_probed.py").write_text(MODULE)
    plan = {"version": 1, "modules": {"fp_code_probed": {"path": "fp_code_probed.py", "lines": [2],
                                                         "expected": str(tmp_path / "mods" / "fp_code_probed.py")}}}
    probe_install.install(str(tmp_path / "site"), str(tmp_path / "probe"), "codetest", plan)
    return tmp_path


def ran(records) -> bool:
    return any(name.split("/", 1)[1][:2] in ("L-", "F-") for name in records)


def test_the_agents_compiled_runtime_is_what_a_server_of_its_build_loads(probed):
    code = (probed / "probe" / probe_install.CODE_NAME).read_bytes()
    assert code.startswith(probe_install.code_stamp() + b"\0")
    # the source spoiled: only the compiled code can still run the probe
    (probed / "probe" / probe_install.RUNTIME_NAME).write_text("this is not python\n")
    records = start(probed)
    assert ran(records), sorted(records)


@pytest.mark.parametrize("spoil", ["another build", "torn", "missing"])
def test_any_other_build_or_a_spoiled_code_file_compiles_the_source_as_before(probed, spoil):
    path = probed / "probe" / probe_install.CODE_NAME
    if spoil == "another build":
        path.write_bytes(repr(("2.7.18 (default)", "cpython-27")).encode() + b"\0" + path.read_bytes().split(b"\0", 1)[1])
    elif spoil == "torn":
        path.write_bytes(path.read_bytes()[:200])
    else:
        path.unlink()
    records = start(probed)
    assert ran(records), sorted(records)
    process = [json.loads(v) for k, v in records.items() if k.endswith("/process.json")]
    assert process, sorted(records)


def test_for_a_server_of_another_minor_nothing_is_compiled_and_its_start_compiles_the_source(tmp_path):
    """A container's interpreter (its version read from its site dir, never run by the agent) of another
    minor than the agent's cannot load the agent's code: none is written, and the probe still runs."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "mods" / "fp_code_probed.py").write_text(MODULE)
    plan = {"version": 1, "modules": {"fp_code_probed": {"path": "fp_code_probed.py", "lines": [2],
                                                         "expected": str(tmp_path / "mods" / "fp_code_probed.py")}}}
    # the server sees the probe dir at another path (as in a container's root), and its Python is 2.7
    (tmp_path / "probe-as-the-server-sees-it").symlink_to(tmp_path / "probe")
    probe_install.install(str(tmp_path / "site"), str(tmp_path / "probe"), "codetest", dict(plan, python_version="2.7"),
                          probe_dir_seen=str(tmp_path / "probe-as-the-server-sees-it"))
    assert not (tmp_path / "probe" / probe_install.CODE_NAME).exists()
    records = start(tmp_path)
    assert ran(records), sorted(records)


def test_for_a_server_of_this_minor_the_code_is_written(tmp_path):
    (tmp_path / "site").mkdir()
    this = "%d.%d" % __import__("sys").version_info[:2]
    probe_install.install(str(tmp_path / "site"), str(tmp_path / "probe"), "codetest",
                          {"version": 1, "modules": {}, "python_version": this},
                          probe_dir_seen=str(tmp_path / "probe-as-the-server-sees-it"))
    assert (tmp_path / "probe" / probe_install.CODE_NAME).read_bytes().startswith(probe_install.code_stamp() + b"\0")
