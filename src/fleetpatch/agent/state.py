"""The agent's state: one AgentState per session, created by `session.serve` (or by
a test) and passed explicitly to every step that needs it. Nothing else in the
agent holds state between calls."""
import json
import os
import select
import sys
import threading
import time

from .apikey import scrub
from .base import REPLY_PREFIX
from .lock import Renewal


class RequestReader(object):
    """Request lines from fd 0, read unbuffered past what stage two of the boot
    read exactly, so nothing the laptop sent can sit unseen in a buffer."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""
        self.eof = False

    def poll(self, wait, wake=None):
        """The next line (without its newline) if one arrives within `wait` s
        (None: wait forever); None if not, or at the end (then `eof` is set), or as
        soon as `wake` (a LogWatch) sees the log written."""
        deadline = None if wait is None else time.monotonic() + wait
        while b"\n" not in self.buf:
            if self.eof:
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            watched = wake.fds() if wake is not None else []
            r, _, _ = select.select([self.fd] + watched, [], [], left)
            if not r:
                return None
            if self.fd not in r:
                wake.drain()
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


MUTATING = ("apply", "rollback", "restart")


REFUSALS = ("drift", "locked", "conflict")   # refused before anything was written


class Session(object):
    """What this process did to the host, for the end of the channel."""

    def __init__(self):
        self.lock_req = None     # the request whose lock this session took and still holds
        self.changed = []        # mutating ops that ran (or may have written before failing)
        self.restart_window = None   # the restart of the request answered last, for a follow `after_restart`

    def done(self, req, result):
        if req.get("op") == "probe" and result.get("locked"):
            self.lock_req = req
        elif req.get("op") == "unlock" and self.lock_req and req.get("lock_token") == self.lock_req.get("lock_token"):
            self.lock_req = None
        elif req.get("op") in MUTATING:
            self.changed.append(req["op"])

    def failed(self, req, code):
        if req.get("op") in MUTATING and code not in REFUSALS:
            self.changed.append(req["op"])


class AgentState(object):
    """Everything the agent keeps while it serves one session, in one place:

    session    what this process did to the host (Session), for the end of the channel
    renewal    the thread renewing the lock this process holds (lock.Renewal)
    following  the follow in progress: its decision (record) asks whether the log was cut
    requests   the RequestReader of the channel while serving (a follow reads its decision there)
    gone       stdout broken or SIGHUP: nobody reads the replies any more
    boot       how agentboot loaded each module (cached / compiled), for the probe's answer
    emit_lock  the ticker's lines and the request's must not interleave
    probe      this run's probe while it is in the server's interpreter: {site_dir, token} (probing.py)
    secrets    the servers' API keys the agent read (apikey.known_key): masked in every line it writes
    """

    def __init__(self, boot=None, out=None):
        self.session = Session()
        self.renewal = Renewal()
        self.following = None
        self.requests = None
        self.gone = False
        self.boot = boot
        self.emit_lock = threading.Lock()
        self.out = out   # None: sys.stdout as it is when a line is written
        self.probe = None
        self.secrets = set()

    def emit(self, obj):
        """One reply line. A laptop that is gone must not stop the step in progress:
        the write fails quietly and the state notes the channel is gone."""
        if self.gone:
            return
        if self.secrets:   # a key never leaves the host: not in a log line, an answer or an error
            obj = scrub(obj, tuple(self.secrets))   # a snapshot: another thread may add one
        line = REPLY_PREFIX + json.dumps(obj, sort_keys=True) + "\n"
        out = self.out or sys.stdout
        with self.emit_lock:
            try:
                out.write(line)
                out.flush()
            except (IOError, OSError, ValueError):
                self.gone = True
