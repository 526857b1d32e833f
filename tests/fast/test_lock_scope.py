"""One lock scope: whatever raises after the lock is taken, the lock is released
(with --on-failure rollback: after the rollback), the host's files are pristine
or fully patched, and the result says `error` with the exception's text.

A bug is injected in this process (monkeypatch) at each step after the locking
probe; the host is a real tree reached by the local transport, with the real
agent and the real stand-in server."""
from __future__ import annotations

import pytest

from support.localhost import EAGLE, EAGLE_V2, LocalHost, job, sha256
from fleetpatch import evidence, steps
from fleetpatch.remote import Remote


class Injected(Exception):
    pass


TEXT = "injected bug after the lock"


def boom(*a, **kw):
    raise Injected(TEXT)


def around_call(monkeypatch, op, before=None, after=None):
    """Run `before`/`after` around the agent call `op` (after: with its reply)."""
    orig = Remote.call

    def call(self, name, request, timeout=300, **kw):
        if name == op and before:
            before()
        out = orig(self, name, request, timeout, **kw)
        if name == op and after:
            after(out)
        return out

    monkeypatch.setattr(Remote, "call", call)


def inject_probe_reply(mp, lh):
    mp.setattr(steps.deploying, "_deploy_locked", boom)


def inject_plan(mp, lh):
    mp.setattr(steps.diffapply, "apply_file", lambda *a: {}[TEXT])  # a KeyError inside make_plan


def inject_before_apply(mp, lh):
    around_call(mp, "apply", before=lambda: boom())


def inject_apply_reply(mp, lh):
    around_call(mp, "apply", after=lambda out: boom())


def inject_restart(mp, lh):
    mp.setattr(steps.restarting, "launch_after_restart", boom)


def inject_follow(mp, lh):
    mp.setattr(evidence, "judge", boom)


def inject_ledger_update(mp, lh):
    mp.setattr(steps.follow, "ledger_update", boom)


INJECTIONS = [  # (where, the state the engine files must be in afterwards)
    (inject_probe_reply, "pristine"),
    (inject_plan, "pristine"),
    (inject_before_apply, "pristine"),
    (inject_apply_reply, "patched"),
    (inject_restart, "patched"),
    (inject_follow, "patched"),
    (inject_ledger_update, "patched"),
]


def files_state(lh: LocalHost) -> str:
    changed = [sha256(lh.file(rel)) != lh.pristine[rel] for rel in (EAGLE, EAGLE_V2)]
    return "patched" if all(changed) else "pristine" if not any(changed) else "HALF-PATCHED"


@pytest.mark.parametrize("inject,state", INJECTIONS, ids=[i.__name__[len("inject_"):] for i, _ in INJECTIONS])
@pytest.mark.parametrize("on_failure", ["keep", "rollback"])
def test_an_unexpected_exception_after_the_lock_releases_it(lh, monkeypatch, inject, state, on_failure):
    j, host = job(lh, on_failure=on_failure)
    with monkeypatch.context() as mp:
        inject(mp, lh)
        r = steps.deploy(j, host)
    assert r.status == "error", r.message
    assert TEXT in r.message and "h1" in r.message
    assert not lh.lock.exists(), "the next run must not need --break-lock"
    assert files_state(lh) == state


def test_the_lock_is_held_through_the_rollback_after_a_failure_and_released_when_it_raises(lh, monkeypatch):
    """crash-in-init fails verification; --on-failure rollback restores the files under
    the same lock; a bug after the restore still releases the lock."""
    held = []
    around_call(monkeypatch, "rollback", before=lambda: held.append(lh.lock.exists()),
                after=lambda out: boom())
    j, host = job(lh, "crash-in-init", on_failure="rollback")
    r = steps.deploy(j, host)
    assert held == [True], "the lock is kept from the failed verification into the rollback"
    assert r.status == "error" and TEXT in r.message
    assert not lh.lock.exists()
    assert files_state(lh) == "pristine", "the rollback restored the originals before the bug"
    again = steps.deploy(job(lh)[0], host)
    assert again.status == "verified", "a plain rerun converges, no --break-lock"


def test_the_lock_is_held_until_the_rollback_ends(lh, monkeypatch):
    seen = []
    orig = steps.follow_and_judge

    def spy(run, watch):
        seen.append((watch.want_markers, lh.lock.exists()))
        return orig(run, watch)

    monkeypatch.setattr(steps.follow, "follow_and_judge", spy)
    j, host = job(lh, "crash-in-init", on_failure="rollback")
    r = steps.deploy(j, host)
    assert r.status == "rolled-back", r.message
    assert seen == [(True, True), (False, True)], "held while verifying and while rolling back"
    assert not lh.lock.exists() and files_state(lh) == "pristine"
    assert r.round_trips == 6, "probe+lock, apply+restart, follow, probe, rollback+restart, follow+unlock"
