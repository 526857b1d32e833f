"""What every part of the agent shares: the protocol, its file names, the refusal
type, and the state dir's paths and atomic writes.

The protocol (every request, reply and the ledger record) is `protocol.py`,
sent with the agent's modules. On a host agentboot loads it as
AGENT_MODULE_NAME beside this package (fleetpatch itself is not installed
there); on the laptop (tests) it is the package's own.
"""
import errno
import hashlib
import json
import os
import sys
import time

if __name__.split(".")[0] == "fleetpatch":   # imported on the laptop (tests)
    from .. import protocol, redact
else:                                        # on a host: agentboot loaded them from stdin, before this
    protocol = sys.modules["fleetpatch_protocol"]
    redact = sys.modules[protocol.REDACT_MODULE_NAME]

REPLY_PREFIX = protocol.REPLY_PREFIX
LEDGER = protocol.LEDGER_FILE
LOCK = protocol.LOCK_FILE
pack = protocol.pack
unpack = protocol.unpack
TMP_MARK = ".fleetpatch-"   # in the name of every temp file fleetpatch writes: `.NAME.fleetpatch-PID.tmp`


class AgentError(Exception):
    """A refusal the laptop reports as the host's status (code) with a message."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code
        self.message = message


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def cpu_s():
    """This process's own CPU so far (user + system, all its threads, seconds; its children
    not counted): the report's `agent_cpu_s`, what the agent cost the host up to that reply.
    process_time, not os.times: the latter counts in clock ticks (10 ms)."""
    return round(time.process_time(), 4)


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def expand(path):
    return os.path.expanduser(path) if path else path


def state_path(req, *parts):
    base = expand(req["state_dir"])
    if os.path.islink(base):
        # followed, every write of fleetpatch's would land wherever the link points (or,
        # dangling, nowhere): the state dir must be a directory of its own
        raise AgentError("error", "engine.state_dir %s is a symlink (to %s); fleetpatch keeps its ledger, lock and "
                         "backups only in a real directory: point engine.state_dir at one"
                         % (base, os.readlink(base)))
    path = os.path.join(base, *parts)
    if parts:
        refuse_links(base, path, "in the state dir")
    return path


def refuse_links(base, path, where):
    """No component below `base` up to `path` may be a symlink: a write through one lands
    outside the directory fleetpatch owns there, and a rename over one replaces the link."""
    rel = os.path.relpath(path, base)
    cur = base
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise AgentError("error", "%s is a symlink (to %s) %s; fleetpatch writes only regular files inside "
                             "the package and its state dir, so nothing was written; replace the link by the "
                             "file or directory it points to, then rerun" % (cur, os.readlink(cur), where))


def ensure_dir(path, mode=0o700):
    if not os.path.isdir(path):
        os.makedirs(path, mode)


def ensure_state_dir(path):
    """The state dir, made 0700, or tightened when it exists: the agent runs as root and
    trusts what is in it (ledger, journal, backups, lock), so nobody else may write there.
    Read and search bits stay (a server run as another user reaches its probe dir below)."""
    ensure_dir(path)
    st = os.lstat(path)
    if st.st_mode & 0o022:
        os.chmod(path, st.st_mode & 0o7755)


def open_log(path, flags):
    """The server's log file (an fd), opened as root without following a symlink at its name:
    followed, the server's output would be written into, or read out of, whatever file the
    link names."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise AgentError("error", "the server log %s is a symlink (to %s); fleetpatch opens the log as root and "
                         "follows no link there, so nothing was read or written through it; set `log` to the file "
                         "itself (%s)" % (path, target, target))


def atomic_write(path, data, like=None, meta=None):
    """Write beside the target and rename over it. The file gets the mode and owner of
    `like` (a path), else `meta` ({mode, uid, gid}: a file created, or one put back after
    it was deleted), else those of the file it replaces, else mode 0644."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, ".%s%s%d.tmp" % (os.path.basename(path), TMP_MARK, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        ref = like if like is not None else (path if meta is None and os.path.exists(path) else None)
        if ref is not None:
            meta = file_meta(ref, follow=True)
        if meta is not None:
            os.chmod(tmp, meta["mode"])
            try:
                os.chown(tmp, meta["uid"], meta["gid"])
            except OSError:
                pass  # not root: the file is ours anyway
        else:
            os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def file_meta(path, follow=False):
    """The mode bits and owner of `path`, as atomic_write and the ledger keep them."""
    st = os.stat(path) if follow else os.lstat(path)
    return {"mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid}


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (IOError, OSError, ValueError):
        return None
