"""The host's lock: take it (or find whose it is), check it, renew it while held,
release it (only the one this run holds)."""
import errno
import json
import os
import threading
import time

from .base import TMP_MARK, AgentError, LOCK, ensure_state_dir, now_iso, protocol, read_json, state_path
from .procs import pid_alive, proc_stat


LOCK_LOST = LOCK + "-lost"   # beside the lock: its holder's channel ended after it changed the host


LOCK_BUSY = LOCK + "-busy"   # beside the lock: the agent process now changing the host for the lock's run


def busy_elsewhere(req, token):
    """The note of another live agent process that is changing the host for the run
    `token` (its channel stalled or cut, it still works), or None."""
    busy = read_json(state_path(req, LOCK_BUSY))
    if not busy or busy.get("token") != token or busy.get("pid") == os.getpid() or not pid_alive(busy.get("pid")):
        return None
    stat = proc_stat(busy["pid"])
    if stat is not None and busy.get("start") is not None and stat.start != busy["start"]:
        return None
    return busy


def refuse_if_busy(req, token, doing):
    busy = busy_elsewhere(req, token)
    if busy:
        raise AgentError("locked", "the host agent (pid %s) of the run holding the lock %s is still running its %s "
                                   "on this host (its connection stalled or was cut); %s now would run two steps "
                                   "at once: it ends when its channel closes (or `kill %s` on the host), then rerun"
                         % (busy["pid"], state_path(req, LOCK), busy.get("op", "step"), doing, busy["pid"]))


def read_lock(req):
    """The lock, with `orphaned` when its holder's session ended without releasing it.
    (The note is a file of its own: the lock file is only ever created and removed.)
    `idle_s` (since the last renewal: the file's mtime) and `age_s` are measured here,
    on the host's clock, so the laptop's clock never enters the judgement."""
    path = state_path(req, LOCK)
    held = read_json(path)
    if held:
        lost = read_json(state_path(req, LOCK_LOST))
        if lost and lost.get("token") == held.get("token"):
            held["orphaned"] = lost
        now = time.time()
        try:
            held["idle_s"] = round(max(0.0, now - os.stat(path).st_mtime), 1)
        except OSError:
            pass
        if isinstance(held.get("since_epoch"), (int, float)):
            held["age_s"] = round(max(0.0, now - held["since_epoch"]), 1)
    return held


class Renewal(object):
    """While this process holds a lock, a thread touches the lock file's mtime every
    `renew_s` (whatever the main thread is doing: a restart, a long follow, a drain),
    so that a lock whose mtime stops moving is known to be left by a dead run. It
    touches the file it created through its own descriptor: a lock broken and taken
    by another run is a new file, which this never touches."""

    def __init__(self):
        self.token = None
        self.stop_event = None

    def start(self, path, token, period):
        if self.token == token:
            return
        self.stop()
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        event = threading.Event()

        def run():
            try:
                while not event.wait(period):
                    try:
                        os.utime(fd) if os.utime in os.supports_fd else os.utime(path)
                    except OSError:
                        return
            finally:
                os.close(fd)  # only this thread closes it: no other file can get its number meanwhile

        thread = threading.Thread(target=run, name="fleetpatch-lock-renewal")
        thread.daemon = True
        thread.start()
        self.token, self.stop_event = token, event

    def stop(self, token=None):
        if self.stop_event is not None and (token is None or token == self.token):
            self.stop_event.set()
            self.token = self.stop_event = None


LOCK_FIELDS = ("holder", "command", "laptop", "boot_id", "pid", "pid_start", "renew_s")   # copied from the claim


def take_lock(state, req, lock):
    """True when this run holds the lock now (taken, or already its own); False when
    another run's lock is there (the laptop judges it from `read_lock` and says why)."""
    ensure_state_dir(state_path(req))
    path = state_path(req, LOCK)
    if lock.get("force"):
        refuse_if_busy(req, (read_json(path) or {}).get("token"), "taking the lock over")
        for stale in (path, state_path(req, LOCK_LOST), state_path(req, LOCK_BUSY)):
            try:
                os.unlink(stale)
            except OSError:
                pass
    record = dict((k, lock[k]) for k in LOCK_FIELDS if k in lock)
    record.update(token=lock["token"], since=now_iso(), since_epoch=time.time())
    record.setdefault("renew_s", protocol.LOCK_RENEW_S)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise AgentError("error", "cannot create the lock %s (%s); no engine file was changed; fix the state "
                             "dir (free space, permissions), then rerun" % (path, e))
        held = read_lock(req) or {}
        if held.get("token") != lock["token"]:
            return False
    else:
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(record))
        except OSError as e:   # disk full: an empty lock would block every later run
            os.unlink(path)
            raise AgentError("error", "cannot write the lock %s (%s); no engine file was changed; free space in the "
                             "state dir, then rerun" % (path, e))
    state.renewal.start(path, lock["token"], float(record["renew_s"]))
    return True


def check_lock(req):
    token = req.get("lock_token")
    if not token:
        return
    held = read_lock(req)
    if not held or held.get("token") != token:
        raise AgentError("locked", "this run no longer holds the lock %s (holder now: %s)"
                         % (state_path(req, LOCK), (held or {}).get("holder", "nobody")))


def release_lock(state, req):
    """Remove this run's lock and its notes; another run's lock is never removed, even one
    that a --break-lock put there while this release was under way."""
    token = req.get("lock_token")
    if not token:
        return
    held = read_lock(req)
    ours = bool(held) and held.get("token") == token
    if ours:
        refuse_if_busy(req, token, "releasing it")
    state.renewal.stop(token)
    if ours:
        for name in (LOCK, LOCK_LOST, LOCK_BUSY):
            remove_if_ours(state_path(req, name), token)


def remove_if_ours(path, token):
    """Remove `path` (the lock or a note beside it) only if it holds `token`; True if it did.

    Reading the token and then unlinking the path would race with --break-lock: between
    the two, another run may remove this lock and create its own under the same name, and
    the unlink would remove that one. So the file is first renamed away, atomically, to a
    name only this process uses; what the rename took is then the file checked, and no
    other run can reach it meanwhile. Ours: it is removed. Another run's: it goes back
    under its name by os.link, which fails rather than replace a file made there since
    (a newer lock wins: the moved one is then dropped, as a --break-lock would have done),
    so a lock is never clobbered. It goes back as the same inode, so its holder's renewal
    thread keeps renewing it. A process that dies in between leaves the moved file under a
    temp name of its pid, which the next run's recover removes; the lock is then free,
    the safe side only for the run it belonged to, which check_lock then stops."""
    moved = os.path.join(os.path.dirname(path), ".%s-release%s%d.tmp" % (os.path.basename(path), TMP_MARK,
                                                                           os.getpid()))
    try:
        os.rename(path, moved)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    if (read_json(moved) or {}).get("token") == token:
        os.unlink(moved)
        return True
    try:
        os.link(moved, path)
    except OSError as e:
        if e.errno != errno.EEXIST:   # a filesystem without hard links: a copy, never over a newer file
            copy_back(moved, path)
    os.unlink(moved)
    return False


def copy_back(moved, path):
    """Put another run's lock back as a new file holding its bytes, unless `path` exists
    now. (Its holder renews the old inode, so it will read as idle; that changes only what
    is said about it, never who holds it.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "wb") as f, open(moved, "rb") as old:
        f.write(old.read())
