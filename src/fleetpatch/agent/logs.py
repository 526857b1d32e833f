"""Readers of the server's output since a restart: the log file (followed across
rotation and truncation, woken by inotify where it can) or the unit's journal."""
import atexit
import os
import struct
import subprocess
import time

from .base import AgentError, expand, open_log
from .ledger import load_ledger
from .container import open_container_log, uses_container_log
from .restart import journal_argv, uses_journal


def add_lines(batches, source, line_no, data, final):
    """Append the complete lines of `data` as one batch; returns (next line_no, the
    unfinished tail). A final read keeps the tail as a line of its own."""
    lines = data.split(b"\n")
    partial = lines.pop()
    if final and partial:
        lines.append(partial)
        partial = b""
    if lines:
        batches.append((source, line_no, [l.decode("utf-8", "replace").rstrip("\r") for l in lines]))
    return line_no + len(lines), partial


def find_inode(path, inode):
    """Where the log `path` went by rename (logrotate: path.1, path-DATE, ...): the file
    beside it, named after it, with that inode."""
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in sorted(names):
        if name.startswith(base):
            try:
                if os.stat(os.path.join(directory, name)).st_ino == inode:
                    return os.path.join(directory, name)
            except OSError:
                continue
    return None


class LogFollower(object):
    """Reads a log from a recorded (inode, offset), following the file the server writes.

    A log renamed away (logrotate without copytruncate) is still the server's until
    it reopens its log: the follower keeps reading the recorded inode and moves to
    the new file under the log's name only once that file gets lines (the writer
    moved), finishing the old one first. A log truncated in place is read from its
    start again. Reads are bounded (READ_CHUNK a batch, READ_BUDGET a call), so a
    chatty server cannot make the agent hold its whole log.

    Lines are numbered from where the reading starts: line 1 is the first after the recorded
    offset (the restart's), as in the journal; a file read from its start (rotated in, or cut)
    numbers from its own first line. Nothing before the offset is read, so the work before the
    first line is judged does not grow with the log's size: `bytes_read` counts what was read."""

    READ_CHUNK = 1 << 20
    READ_BUDGET = 4 << 20

    def __init__(self, path, inode, offset):
        self.path = expand(path)
        self.fh = None
        self.ino = None
        self.line_no = 1       # line number (from where the current file's reading began) of the next full line
        self.bytes_read = 0    # of the log, in all: what this follower cost the host's disk
        self.partial = b""
        self.files = []
        self.more = False      # the last read stopped at its budget: more is waiting
        self.truncated = False
        cur = self._stat(self.path)
        if inode is not None and cur is not None and cur.st_ino != inode:
            old = self._find_inode(inode)
            if old is not None:
                self._open(old, offset)
                return
            offset = 0  # the old file is gone: the new one holds all there is
        if cur is not None and cur.st_size < offset:
            offset = 0  # truncated since the restart
        if cur is not None:
            self._open(self.path, offset)

    @staticmethod
    def _stat(path):
        try:
            return os.stat(path)
        except OSError:
            return None

    def _find_inode(self, inode):
        return find_inode(self.path, inode)

    def _open(self, path, offset):
        self.fh = os.fdopen(open_log(path, os.O_RDONLY), "rb")
        self.ino = os.fstat(self.fh.fileno()).st_ino
        self.line_no = 1
        self.fh.seek(offset)
        self.partial = b""
        self.files.append(path)

    def read(self):
        """New complete lines: list of (file, first_line_no, [lines])."""
        batches = []
        self.budget = self.READ_BUDGET
        if self.fh is None:
            if self._stat(self.path) is not None:
                self._open(self.path, 0)
            else:
                return batches
        self._drain(batches)
        if self.budget <= 0:
            self.more = True
            return batches
        self.more = False
        cur = self._stat(self.path)
        if cur is not None and cur.st_ino != self.ino:
            # Renamed away: the server writes the old inode until it reopens its log.
            # The new file having lines says it has; finish the old one, then move.
            if cur.st_size > 0:
                self._drain(batches, final=True)
                self.fh.close()
                self._open(self.path, 0)
                self._drain(batches)
        elif cur is not None and cur.st_size < self.fh.tell():
            self.truncated = True   # what was read before the cut can never be read again
            self._drain(batches, final=True)
            self.fh.close()
            self._open(self.path, 0)
            self._drain(batches)
        self.more = self.budget <= 0
        return batches

    def _drain(self, batches, final=False):
        """Read what is there in bounded chunks, up to this call's budget."""
        while self.budget > 0:
            data = self.fh.read(min(self.READ_CHUNK, self.budget))
            self.budget -= len(data)
            self.bytes_read += len(data)
            if not data:
                break
            self.line_no, self.partial = add_lines(batches, self.files[-1], self.line_no, self.partial + data, False)
            if len(self.partial) > self.READ_CHUNK:   # a "line" without end: pass it on in pieces
                self.line_no, self.partial = add_lines(batches, self.files[-1], self.line_no, self.partial, True)
        if final and self.partial:
            self.line_no, self.partial = add_lines(batches, self.files[-1], self.line_no, self.partial, True)

    def close(self):
        if self.fh is not None:
            self.fh.close()


class LogWatch(object):
    """Wakes a follow the moment its log is written (inotify), so the verdict does not
    wait out a poll interval. Polling stays the rule: where inotify or ctypes is missing
    this watches nothing and the follow polls as before. A log written without pause
    wakes it at most every MIN_GAP_S."""

    IN_MODIFY, IN_MOVED_TO, IN_CREATE = 0x2, 0x80, 0x100
    MIN_GAP_S = 0.005

    def __init__(self, path):
        self.path, self.fd, self.libc, self.ino, self.last = path, None, None, None, 0.0
        self.woken = set()   # the watch descriptors whose events the drains read
        if not self.open_inotify():
            return
        # the directory, for a log created or rotated in under the name; the file, for its lines
        self.add(os.path.dirname(path) or ".", self.IN_CREATE | self.IN_MOVED_TO)
        self.watch_file()

    def open_inotify(self):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except Exception:   # no ctypes, no libc symbol (not Linux): poll
            return False
        if fd < 0:
            return False
        self.fd, self.libc = fd, libc
        return True

    def watching(self):
        """Whether a write to the log wakes the follow (else it polls)."""
        return self.fd is not None

    def add(self, path, mask):
        return self.libc.inotify_add_watch(self.fd, path.encode("utf-8", "surrogateescape"), mask) >= 0

    def watch_dir(self, path):
        """Wake also when a file is created or renamed into `path` (the probe's records): its
        watch descriptor, which `woken` then holds after a drain that saw it (-1: not watched)."""
        if self.fd is None:
            return -1
        return self.libc.inotify_add_watch(self.fd, path.encode("utf-8", "surrogateescape"),
                                           self.IN_CREATE | self.IN_MOVED_TO)

    def watch_file(self):
        if self.path is None:
            return
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            return
        if ino != self.ino and self.add(self.path, self.IN_MODIFY):
            self.ino = ino

    def fds(self):
        if self.fd is None:
            return []
        gap = self.last + self.MIN_GAP_S - time.monotonic()
        if gap > 0:
            time.sleep(gap)
        return [self.fd]

    def drain(self):
        self.last = time.monotonic()
        try:
            while True:
                data = os.read(self.fd, 65536)
                if not data:
                    break
                at = 0
                while at + 16 <= len(data):   # struct inotify_event: wd, mask, cookie, len, name[len]
                    wd, _, _, size = struct.unpack_from("iIII", data, at)
                    self.woken.add(wd)
                    at += 16 + size
        except OSError:   # EAGAIN: all read
            pass
        self.watch_file()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class StreamWake(LogWatch):
    """Wakes a follow the moment a streamed log (a container's: the daemon's log stream, or
    `<runtime> logs --follow`'s pipe) has output: its descriptor (`follower.wake_fd()`, None once
    the stream has ended) is in the follow's select, beside an inotify fd for the probe's records
    dirs (`watch_dir`) where the host has inotify. At a 50 ms poll the follow woke 20 times a
    second whatever the server wrote, and saw a line up to 50 ms late."""

    def __init__(self, follower):
        self.path, self.fd, self.libc, self.ino, self.last = None, None, None, None, 0.0
        self.woken = set()
        self.follower = follower
        self.open_inotify()

    def watching(self):
        return self.follower.wake_fd() is not None

    def fds(self):
        stream = self.follower.wake_fd()
        fds = LogWatch.fds(self) if self.fd is not None else []
        if stream is not None:
            if not fds:     # LogWatch.fds paces the wakes; the same gap without inotify
                gap = self.last + self.MIN_GAP_S - time.monotonic()
                if gap > 0:
                    time.sleep(gap)
            fds.append(stream)
        return fds

    def drain(self):
        """The records dirs' events read; the stream's bytes are left for the follower's read."""
        self.last = time.monotonic()
        if self.fd is not None:
            LogWatch.drain(self)


class JournalFollower(object):
    """The server's journal since the restart, from `journalctl --follow` (see journal_argv);
    read() is LogFollower's. journalctl failing (not installed, no permission to read the
    journal) is an error, not a silent wait for lines that never come."""

    def __init__(self, argv, label):
        self.argv = argv
        self.label = label
        self.line_no = 1
        self.partial = b""
        self.stderr = b""
        self.failed = None
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, close_fds=True)
        except OSError as e:
            raise AgentError("error", "cannot read the server's journal: %s: %s" % (argv[0], e))
        for stream in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(stream.fileno(), False)
        atexit.register(self.close)

    more = False

    def _available(self, stream):
        """What the pipe holds now, at most LogFollower.READ_BUDGET (a chatty unit keeps it full)."""
        chunks, size = [], 0
        while size < LogFollower.READ_BUDGET:
            try:
                chunk = os.read(stream.fileno(), 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if stream is self.proc.stdout:
            self.more = size >= LogFollower.READ_BUDGET
        return b"".join(chunks)

    def read(self):
        if self.failed:
            raise AgentError("error", self.failed)
        batches = []
        exited = self.proc.poll() is not None
        data = self.partial + self._available(self.proc.stdout)
        self.stderr = (self.stderr + self._available(self.proc.stderr))[-4000:]
        self.line_no, self.partial = add_lines(batches, self.label, self.line_no, data, exited)
        if exited:
            self.failed = ("`%s` exited %s: %s; fleetpatch reads the unit's journal as the SSH user (root, or a "
                           "member of the systemd-journal group)" % (" ".join(self.argv), self.proc.returncode,
                                                                   self.stderr.decode("utf-8", "replace").strip()
                                                                   or "no output"))
            if not batches:
                raise AgentError("error", self.failed)
        return batches

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def open_follower(req):
    """What follow reads: the log file from the recorded (inode, offset), or for a systemd unit
    that logs to the journal, journalctl with the window recorded at fleetpatch's restart."""
    restart = req.get("restart") or {}
    if uses_container_log(req):
        return open_container_log(req, load_ledger(req))
    if not uses_journal(restart, req.get("log")):
        return LogFollower(req["log"], req.get("inode"), req.get("offset", 0))
    window = (load_ledger(req).get("last_restart") or {}).get("journal") or {}
    since = window.get("since")
    if not window.get("invocation") and since is None:
        since = time.time()   # no restart of fleetpatch's to start from: from now on
    argv = journal_argv(restart["unit"], window.get("invocation"), since)
    return JournalFollower(argv, "journal of " + restart["unit"])


def log_reader_since(req, since_epoch, pos):
    """A reader of the server's output from now on: the log file from `pos`, or its journal."""
    restart = req.get("restart") or {}
    if uses_container_log(req):
        return open_container_log(req, {}, since_epoch)
    if uses_journal(restart, req.get("log")):
        return JournalFollower(journal_argv(restart["unit"], None, since_epoch), "journal of " + restart["unit"])
    return LogFollower(req["log"], pos.get("inode"), pos.get("offset", 0))


def close_reader(reader):
    """Close a log reader (a journalctl process, or a LogFollower's open file)."""
    if reader is None:
        return
    close = getattr(reader, "close", None)
    if close is not None:
        close()
    elif getattr(reader, "fh", None) is not None:
        reader.fh.close()
