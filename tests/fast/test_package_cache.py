"""Where the engine package is, once the site step found it, is kept in the state dir
(issue 34): the agent starts with -S, and the step runs every .pth of the engine's Python.
The kept answer holds only while nothing the step reads changed: a .pth edited, added
or removed in a site dir, or the package's file gone, runs the step again. Each run is
a real `python -S` process, as the agent is, with a real .pth in a real user site."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support.paths import REPO

ASK = """
import json, sys
from fleetpatch.agent import package
where = package.package_dir("pkgx_cache_probe", sys.argv[1])
print(json.dumps({"dir": where, "site_ran": not package.site_pending()}))
"""


def ask(env, cache):
    out = subprocess.run([sys.executable, "-S", "-c", ASK, str(cache)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def checkout(tmp_path, name):
    """A source tree holding the package, as an editable install leaves it."""
    (tmp_path / name / "pkgx_cache_probe").mkdir(parents=True)
    (tmp_path / name / "pkgx_cache_probe" / "__init__.py").write_text("")
    return tmp_path / name


def user_site(tmp_path):
    """(the environment of a python whose user site is under tmp_path, that site dir, made)."""
    base = tmp_path / "userbase"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYTHONUSERBASE": str(base),
           "PYTHONPATH": str(REPO / "src")}
    site_dir = base / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    site_dir.mkdir(parents=True)
    return env, site_dir


def test_the_site_step_runs_again_only_when_a_pth_or_the_package_changes(tmp_path):
    env, site_dir = user_site(tmp_path)
    pth = site_dir / "__editable__.pkgx.pth"
    one, two = checkout(tmp_path, "one"), checkout(tmp_path, "two")
    pth.write_text(str(one) + "\n")
    cache = tmp_path / "state" / "package-cache.json"
    cache.parent.mkdir()

    assert ask(env, cache) == {"dir": str(one), "site_ran": True}   # first: the site step finds it
    assert ask(env, cache) == {"dir": str(one), "site_ran": False}  # then: the kept answer, no .pth run

    pth.write_text(str(two) + "\n")   # re-pointed (re-installed elsewhere): the .pth changed
    os.utime(pth, ns=(1, 1))          # even with the same size, and a stamp set back
    assert ask(env, cache) == {"dir": str(two), "site_ran": True}
    assert ask(env, cache) == {"dir": str(two), "site_ran": False}

    (two / "pkgx_cache_probe" / "__init__.py").unlink()   # the kept answer's file is gone
    os.rename(two / "pkgx_cache_probe", tmp_path / "moved")
    pth.write_text(str(two) + "\n")
    os.utime(pth, ns=(1, 1))
    (site_dir / "other.pth").write_text(str(one) + "\n")   # another .pth added: a new key
    assert ask(env, cache) == {"dir": str(one), "site_ran": True}


def test_a_cache_that_cannot_be_written_or_read_costs_only_the_site_step(tmp_path):
    env, site_dir = user_site(tmp_path)
    one = checkout(tmp_path, "one")
    (site_dir / "x.pth").write_text(str(one) + "\n")
    missing = tmp_path / "no-such-state" / "package-cache.json"
    assert ask(env, missing) == {"dir": str(one), "site_ran": True}
    assert ask(env, missing) == {"dir": str(one), "site_ran": True}
    torn = tmp_path / "torn.json"
    torn.write_text('{"abc": ')
    assert ask(env, torn) == {"dir": str(one), "site_ran": True}
    assert ask(env, torn) == {"dir": str(one), "site_ran": False}   # rewritten whole


def test_a_package_created_since_in_a_directory_a_pth_puts_first_is_found(tmp_path):
    env, site_dir = user_site(tmp_path)
    first = tmp_path / "first"
    first.mkdir()
    second = checkout(tmp_path, "second")
    (site_dir / "paths.pth").write_text(f"# two checkouts\n{first}\n{second}\n")
    cache = tmp_path / "package-cache.json"
    assert ask(env, cache) == {"dir": str(second), "site_ran": True}
    assert ask(env, cache) == {"dir": str(second), "site_ran": False}
    (first / "pkgx_cache_probe").mkdir()   # no .pth touched: the directory it names changed
    (first / "pkgx_cache_probe" / "__init__.py").write_text("")
    assert ask(env, cache) == {"dir": str(first), "site_ran": True}
