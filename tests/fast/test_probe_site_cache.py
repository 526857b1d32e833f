"""The site directory the probe's .pth goes into is asked of the server's interpreter once
(issue 34, 3): that query starts the interpreter with every .pth of the host. Its answer is
kept in the state dir and asked again only when the interpreter, its venv or its
environment changed, or the site dir it named is gone."""
from __future__ import annotations

import os
import sys

from fleetpatch.agent import probing


def counting_python(tmp_path):
    """A real interpreter behind a wrapper that notes each run in a file."""
    runs = tmp_path / "runs"
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\necho run >> {runs}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper), (lambda: len(runs.read_text().splitlines()) if runs.exists() else 0)


def test_the_site_query_runs_once_until_the_interpreter_or_its_environment_changes(tmp_path):
    python, runs = counting_python(tmp_path)
    req = {"state_dir": str(tmp_path / "state")}
    os.makedirs(req["state_dir"])
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    first = probing.cached_site_info(req, python, env)
    assert runs() == 1
    assert probing.cached_site_info(req, python, env) == first and runs() == 1   # the kept answer

    # another environment that steers site is another key; the first one is still kept
    probing.cached_site_info(req, python, dict(env, PYTHONNOUSERSITE="1"))
    assert runs() == 2
    probing.cached_site_info(req, python, env)
    assert runs() == 2

    # the interpreter changed (a venv recreated, python upgraded in place): asked again
    (tmp_path / "bin" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    probing.cached_site_info(req, python, env)
    assert runs() == 3


def test_a_kept_answer_whose_site_dir_is_gone_is_asked_again(tmp_path):
    python, runs = counting_python(tmp_path)
    req = {"state_dir": str(tmp_path / "state")}
    os.makedirs(req["state_dir"])
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    probing.cached_site_info(req, python, env)
    cache = probing.read_json(os.path.join(req["state_dir"], probing.SITE_CACHE))
    (key, info), = cache.items()
    gone = str(tmp_path / "gone-site")
    info = dict(info, site_packages=[gone], path=[gone] + info["path"])
    probing.atomic_write(os.path.join(req["state_dir"], probing.SITE_CACHE), probing.json.dumps({key: info}).encode())
    assert not probing.still_holds(info)
    again = probing.cached_site_info(req, python, env)
    assert runs() == 2 and gone not in again["site_packages"]


def test_the_runtime_is_compiled_once_per_interpreter_and_by_the_servers_own_build(tmp_path):
    """The runtime's compiled code is kept in the state dir (issue 34): a deploy loads it instead of
    compiling 600 lines; for a server of another build, that build compiles it (one run of it),
    and the code it gives is the one that build loads (its stamp)."""
    import marshal
    from fleetpatch.probe import install as probe_install
    python, runs = counting_python(tmp_path)
    req = {"state_dir": str(tmp_path / "state")}
    os.makedirs(req["state_dir"])
    source = probe_install.runtime_source()
    seen = str(tmp_path / "probe" / "runtime.py")

    own = probing.runtime_code_for(req, python, source, seen, False)
    assert runs() == 0 and own.partition(b"\0")[0] == probe_install.code_stamp()
    assert marshal.loads(own.partition(b"\0")[2]).co_filename == seen
    assert probing.runtime_code_for(req, python, source + b"\nCHANGED = 1\n", seen, False) != own   # another runtime

    other = probing.runtime_code_for(req, python, source, str(tmp_path / "elsewhere.py"), True)
    assert runs() == 1 and marshal.loads(other.partition(b"\0")[2]).co_filename == str(tmp_path / "elsewhere.py")
    assert probing.runtime_code_for(req, python, source, str(tmp_path / "elsewhere.py"), True) == other
    assert runs() == 1      # kept: asked once
    assert probe_install.compiled_by(["/nonexistent/python"], source, seen) is None
