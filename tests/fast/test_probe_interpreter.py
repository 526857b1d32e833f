"""The interpreter named (issue 31, 5): when the probe never loads because the server runs
another interpreter than engine.python, the message names the one the server was started
with (its argv[0] and its venv), never the binary behind a venv's python link, and the
advice to set engine.python to it is right to follow."""
from __future__ import annotations

import os

from fleetpatch import steps
from fleetpatch.errors import Status
from support.localhost import LocalHost, job


def test_a_server_run_by_another_venv_is_named_by_that_venv_and_the_advice_works(lh, template, tmp_path):
    other = LocalHost(tmp_path / "venv2-host", template, name="h1")   # venv2: its own copy of the engine
    start = lh.inventory()["hosts"]["h1"]["server"]["restart"]["start"].replace("{python}", str(other.python))
    host = lh.host(start=start)
    try:
        r = steps.deploy(job(lh, "both-quiet", host=host)[0], host)
        assert r.status == Status.NOT_EXECUTED and "the probe never loaded" in r.message, r.message
        behind_link = os.path.realpath(other.python)
        assert behind_link != str(other.python)    # a venv's python is a link: what /proc/PID/exe names
        assert f"was started with {other.python} (venv {other.env}), not {lh.python}" in r.message, r.message
        assert f"set engine.python to {other.python}," in r.message and behind_link not in r.message, r.message

        # the advice followed: engine.python is venv2's python, and the probe proves the patch there
        followed = other.host()   # engine.python: venv2's python, as the message says
        done = steps.deploy(job(other, "both-quiet", host=followed)[0], followed)
        assert done.ok and done.status == Status.VERIFIED, done.message
        assert "executed (" in done.message, done.message
    finally:
        lh.stop()
        other.stop()


def test_a_server_of_engine_python_itself_is_not_told_to_set_engine_python(lh):
    """The server runs engine.python, but with -S (its site-packages on PYTHONPATH only): the
    probe's .pth never runs. The advice must not be to set engine.python to what it already is."""
    start = lh.inventory()["hosts"]["h1"]["server"]["restart"]["start"].replace("{python}", "{python} -S")
    env = dict(lh.inventory()["hosts"]["h1"]["server"]["restart"]["env"], PYTHONPATH=str(lh.site))
    host = lh.host(start=start, env=env)
    try:
        r = steps.deploy(job(lh, "both-quiet", host=host)[0], host)
        assert r.status == Status.NOT_EXECUTED and "the probe never loaded" in r.message, r.message
        assert f"was started with {lh.python} (venv {lh.env}), engine.python itself" in r.message, r.message
        assert "set engine.python" not in r.message and os.path.realpath(lh.python) not in r.message, r.message
    finally:
        lh.stop()
