"""The half of fleetpatch that runs on a host, under the engine's own interpreter.

Sent over SSH on stdin when a command starts (never installed), so a host
needs nothing but the Python that already runs its engine. Stdlib only,
Python 3.8+. One process per host per command: the laptop starts it once
(`agentboot` loads it, through a compile cache) and sends it every request of
the operation as JSON lines on the same channel, then `bye`. The laptop
decides; this side only reads, writes atomically, restarts and follows the
log. Keeping the steps of one phase in one request is what keeps a deploy at
three requests (probe+lock, apply+restart, follow+record+unlock).

The protocol (every request, reply and the ledger record) is `protocol.py`,
sent with this source. Each answer is JSON lines on stdout, each prefixed with
REPLY_PREFIX so that any noise a login shell prints can never be mistaken for
an answer, the last one a Result. A channel that ends mid-operation ends the
session after the step in progress (see `Session`). Every deadline here uses
the monotonic clock: a clock step on the host must not end a wait early or late.
"""
import atexit
import errno
import hashlib
import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time

if "fleetpatch_protocol" in sys.modules:   # on a host: the bootstrap loaded it from stdin
    protocol = sys.modules["fleetpatch_protocol"]
else:                                      # imported on the laptop (tests)
    from fleetpatch import protocol

REPLY_PREFIX = protocol.REPLY_PREFIX
LEDGER = protocol.LEDGER_FILE
LOCK = protocol.LOCK_FILE
pack = protocol.pack
unpack = protocol.unpack


EMIT_LOCK = threading.Lock()   # the ticker's lines and the request's must not interleave
TICK_S = protocol.TICK_S
TICKING_OPS = protocol.TICKING_OPS


def emit(obj):
    """One reply line. A laptop that is gone must not stop the step in progress:
    the write fails quietly and the session notes the channel is gone."""
    if SESSION.gone:
        return
    line = REPLY_PREFIX + json.dumps(obj, sort_keys=True) + "\n"
    with EMIT_LOCK:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (IOError, OSError, ValueError):
            SESSION.gone = True


class Ticker(object):
    """While a request that restarts a server runs (a stop may wait out its grace), a
    thread says so every TICK_S: the laptop tells a host at work from a stalled
    connection by these lines (remote.STALL_S), not only by the request's whole bound."""

    def __init__(self, req):
        self.req, self.op, self.done = req, req.get("op"), threading.Event()
        self.thread = threading.Thread(target=self.run, name="fleetpatch-ticker")
        self.thread.daemon = True
        self.busy = None

    def run(self):
        started = time.monotonic()
        while not self.done.wait(TICK_S):
            emit({"t": "tick", "op": self.op, "elapsed": round(time.monotonic() - started, 3)})

    def __enter__(self):
        if self.op in TICKING_OPS and self.op != "follow":   # follow ticks by itself
            self.thread.start()
            self.mark_busy()
        return self

    def mark_busy(self):
        """Say beside the lock which process changes the host for its run: should this
        channel stall, a fresh one of the same run must not release the lock (nor a next
        run take it over) while this process still writes or restarts."""
        token = self.req.get("lock_token")
        if not token or not self.req.get("state_dir"):
            return
        note = {"token": token, "pid": os.getpid(), "start": own_start(), "op": self.op}
        try:
            atomic_write(state_path(self.req, LOCK_BUSY), json.dumps(note).encode())
            self.busy = note
        except (IOError, OSError):
            pass   # no note: the lock itself still guards the host against other runs

    def __exit__(self, *exc):
        self.done.set()
        if self.thread.ident is not None:
            self.thread.join()
        if self.busy is not None and read_json(state_path(self.req, LOCK_BUSY)) == self.busy:
            try:
                os.unlink(state_path(self.req, LOCK_BUSY))
            except OSError:
                pass
        return False


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


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def expand(path):
    return os.path.expanduser(path) if path else path


# ---------------------------------------------------------------- state dir

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


def load_ledger(req):
    path = state_path(req, LEDGER)
    try:
        with open(path, "r") as f:
            return json.load(f)
    except (IOError, OSError) as e:
        if e.errno == errno.ENOENT:
            return protocol.empty_ledger()
        raise
    except ValueError:
        raise AgentError("error", "the ledger %s is not valid JSON; fix or move it away" % path)


def atomic_write(path, data, like=None, meta=None):
    """Write beside the target and rename over it. The file gets the mode and owner of
    `like` (a path), else `meta` ({mode, uid, gid}: a file created, or one put back after
    it was deleted), else those of the file it replaces, else mode 0644."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, ".%s.fleetpatch-%d.tmp" % (os.path.basename(path), os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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


def save_ledger(req, ledger):
    """The one place the ledger is written (atomically: a reader sees the old or the new one)."""
    ensure_dir(state_path(req))
    atomic_write(state_path(req, LEDGER), (json.dumps(ledger, indent=1, sort_keys=True) + "\n").encode())


# --------------------------------------------------------------------- lock

LOCK_LOST = LOCK + "-lost"   # beside the lock: its holder's channel ended after it changed the host
LOCK_BUSY = LOCK + "-busy"   # beside the lock: the agent process now changing the host for the lock's run


def own_start():
    """This process's start time in clock ticks since boot (a reused pid does not share it)."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (IOError, OSError, ValueError, IndexError):
        return None


def busy_elsewhere(req, token):
    """The note of another live agent process that is changing the host for the run
    `token` (its channel stalled or cut, it still works), or None."""
    busy = read_json(state_path(req, LOCK_BUSY))
    if not busy or busy.get("token") != token or busy.get("pid") == os.getpid() or not pid_alive(busy.get("pid")):
        return None
    try:
        with open("/proc/%d/stat" % busy["pid"]) as f:
            if busy.get("start") is not None and int(f.read().rsplit(")", 1)[1].split()[19]) != busy["start"]:
                return None
    except (IOError, OSError, ValueError, IndexError):
        pass
    return busy


def refuse_if_busy(req, token, doing):
    busy = busy_elsewhere(req, token)
    if busy:
        raise AgentError("locked", "the host agent (pid %s) of the run holding the lock %s is still running its %s "
                                   "on this host (its connection stalled or was cut); %s now would run two steps "
                                   "at once: it ends when its channel closes (or `kill %s` on the host), then rerun"
                         % (busy["pid"], state_path(req, LOCK), busy.get("op", "step"), doing, busy["pid"]))


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (IOError, OSError, ValueError):
        return None


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


RENEWAL = Renewal()
LOCK_FIELDS = ("holder", "command", "laptop", "boot_id", "pid", "pid_start", "renew_s")   # copied from the claim


def take_lock(req, lock):
    """True when this run holds the lock now (taken, or already its own); False when
    another run's lock is there (the laptop judges it from `read_lock` and says why)."""
    ensure_dir(state_path(req))
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
    RENEWAL.start(path, lock["token"], float(record["renew_s"]))
    return True


def check_lock(req):
    token = req.get("lock_token")
    if not token:
        return
    held = read_lock(req)
    if not held or held.get("token") != token:
        raise AgentError("locked", "this run no longer holds the lock %s (holder now: %s)"
                         % (state_path(req, LOCK), (held or {}).get("holder", "nobody")))


def release_lock(req):
    token = req.get("lock_token")
    if not token:
        return
    held = read_lock(req)
    if held and held.get("token") == token:
        refuse_if_busy(req, token, "releasing it")
    RENEWAL.stop(token)
    if held and held.get("token") == token:
        for name in (LOCK, LOCK_LOST, LOCK_BUSY):
            try:
                os.unlink(state_path(req, name))
            except OSError:
                pass


# ------------------------------------------------------------------- server

def read_pid(pidfile):
    try:
        with open(expand(pidfile)) as f:
            return int(f.read().strip().split()[0])
    except (IOError, OSError, ValueError, IndexError):
        return None


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (IOError, OSError, IndexError):
        return True


def wait_pid_gone(pid, seconds):
    """True once pid is gone (a zombie counts), False after `seconds`. A pidfd (Linux 5.3,
    Python 3.9) wakes this the moment the process ends: the restart does not wait out a
    poll interval, and nothing spins meanwhile. Elsewhere /proc is polled every 20 ms."""
    deadline = time.monotonic() + seconds
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while pid_alive(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if fd is None or select.select([fd], [], [], min(left, 0.5))[0]:
                # readable: it has ended and /proc is a moment from saying so
                time.sleep(min(left, 0.02 if fd is None else 0.001))
        return True
    finally:
        if fd is not None:
            os.close(fd)


def proc_launch(pid, env_prefixes=()):
    """argv and the engine-relevant environment of the running server, from /proc."""
    out = {"argv": None, "env": None}
    try:
        raw = read_bytes("/proc/%d/cmdline" % pid)
        out["argv"] = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a != b""] or None
    except (IOError, OSError):
        pass
    try:
        raw = read_bytes("/proc/%d/environ" % pid)
        env = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            k = key.decode("utf-8", "replace")
            # only what routes the engine: the rest of a process environment may hold secrets
            if sep and k.startswith(tuple(env_prefixes) + ("FLEETPATCH_",)):
                env[k] = value.decode("utf-8", "replace")
        out["env"] = env
    except (IOError, OSError):
        pass
    return out


def http_get(url, timeout=2.0):
    """(status, body) or (None, error)."""
    return http_request("GET", url, None, timeout)


def http_request(method, url, data, timeout, limit=1 << 20):
    """(status, body) or (None, error), spoken over a socket here, so the host needs no
    curl. Not http.client: it imports email, ssl and urllib.parse, about 17 ms of CPU at
    every agent start (a probe checks health), which a fleet pays once per host. Not
    urllib.request either: it would send a loopback health check through the operator's
    http_proxy. An https URL (or anything but plain http://host:port/path) goes through
    urllib."""
    target = split_http_url(url)
    if target is None:
        return _urllib_request(method, url, data, timeout, limit)
    host, port, path = target
    deadline = time.monotonic() + timeout
    try:
        sock = http_connect(host, port, timeout)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(http_request_bytes(method, host, port, path, data))
            return read_http_response(HTTPReader(sock, deadline), limit)
        finally:
            sock.close()
    except (OSError, ValueError) as e:   # a timeout is an OSError
        return None, (str(e) or type(e).__name__).encode()


def split_http_url(url):
    """(host, port, path) of a plain http:// URL; None for anything else."""
    if not url[:7].lower() == "http://":
        return None
    rest = url[7:].split("#", 1)[0]
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0] or [len(rest)])
    netloc, path = rest[:cut], rest[cut:]
    if "@" in netloc or not netloc:
        return None
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            return None
        host, tail = netloc[1:end], netloc[end + 1:]
    else:
        host, sep, port = netloc.partition(":")
        tail = sep + port
    if not host or tail and (tail[0] != ":" or not tail[1:].isdigit() or not 0 < int(tail[1:]) < 65536):
        return None
    path = path if path.startswith("/") else "/" + path
    return host, int(tail[1:]) if tail else 80, path


def http_connect(host, port, timeout):
    import _socket   # socket.py's enums cost milliseconds at every agent start
    last = None
    for family, kind, proto, _, addr in _socket.getaddrinfo(_no_idna(host), port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect((_no_idna(addr[0]),) + tuple(addr[1:]))
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last or OSError("no address for %s" % host)


def _no_idna(name):
    """A str host goes through the idna codec (which imports stringprep and unicodedata);
    for an ASCII name or address that encoding is the name itself."""
    return name.encode("ascii") if name.isascii() else name


def http_request_bytes(method, host, port, path, data):
    authority = ("[%s]" % host if ":" in host else host) + ("" if port == 80 else ":%d" % port)
    head = ("%s %s HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: identity\r\nConnection: close\r\n"
            % (method, path, authority))
    if data is not None:
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(data)
    return (head + "\r\n").encode("latin-1") + (data or b"")


class HTTPReader(object):
    """Buffered reads from a socket, each bounded by the request's deadline."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline, self.buf, self.eof = sock, deadline, b"", False

    def fill(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OSError("timed out")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        self.buf += chunk
        self.eof = not chunk
        return bool(chunk)

    def line(self, most=65536):
        while b"\r\n" not in self.buf:
            if len(self.buf) > most or not self.fill():
                raise ValueError("the server sent an incomplete HTTP response")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def take(self, n):
        while len(self.buf) < n and self.fill():
            pass
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def read_http_response(reader, limit):
    """(status, body up to limit bytes): the status line, the headers, then a body by
    Content-Length, chunked, or to the end of the connection."""
    while True:
        status_line = reader.line().decode("latin-1")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError("the server did not answer in HTTP: %r" % status_line[:80])
        headers = {}
        while True:
            line = reader.line().decode("latin-1")
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(parts[1])
        if not 100 <= status < 200:   # an interim 1xx answer is followed by the real one
            break
    if status in (204, 304):
        return status, b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, read_chunked(reader, limit)
    if headers.get("content-length", "").isdigit():
        return status, reader.take(min(limit, int(headers["content-length"])))
    while not reader.eof and len(reader.buf) < limit and reader.fill():
        pass
    return status, reader.buf[:limit]


def read_chunked(reader, limit):
    body = b""
    while len(body) < limit:
        size = reader.line().split(b";", 1)[0].strip()
        try:
            n = int(size, 16)
        except ValueError:
            raise ValueError("the server sent a bad chunk size: %r" % size[:20])
        if n == 0:
            break
        body += reader.take(n)
        reader.line()
    return body[:limit]


def _urllib_request(method, url, data, timeout, limit):
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers),
                                    timeout=timeout) as resp:
            return resp.status, resp.read(limit)
    except urllib.error.HTTPError as e:
        return e.code, e.read(4096)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e)).encode()


def log_position(log):
    try:
        st = os.stat(expand(log))
        return {"inode": st.st_ino, "offset": st.st_size}
    except OSError:
        return {"inode": None, "offset": 0}


STARTED_BY = "FLEETPATCH_STATE_DIR"   # in the environment of every server fleetpatch starts


def started_servers(state_dir):
    """Session leaders started by fleetpatch for this state dir, found by their environment:
    a pidfile lost with the run that wrote it (kill -9) must not leave an orphan server."""
    if not state_dir:
        return []
    mark = ("%s=%s" % (STARTED_BY, os.path.abspath(expand(state_dir)))).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X") or int(fields[3]) != pid:   # state, session id
                continue
            if mark in read_bytes("/proc/%d/environ" % pid).split(b"\0"):
                found.append(pid)
        except (IOError, OSError, IndexError, ValueError):
            continue
    return found


def command_server_pid(restart):
    """The pidfile's server, else the one fleetpatch started whose pidfile was lost."""
    pid = read_pid(restart["pidfile"])
    if pid_alive(pid):
        return pid
    found = started_servers(restart.get("state_dir"))
    return found[0] if found else pid


def stop_command_server(restart):
    pid = command_server_pid(restart)
    if not pid_alive(pid):
        return {"stopped": None}
    grace = float(restart.get("stop_grace", 10))
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return {"stopped": pid}
    if wait_pid_gone(pid, grace):
        return {"stopped": pid, "signal": "TERM"}
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    wait_pid_gone(pid, 5)
    return {"stopped": pid, "signal": "KILL"}


def start_command_server(restart, log):
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("SSH_"))
    env.update(restart.get("env") or {})
    if restart.get("state_dir"):
        env[STARTED_BY] = os.path.abspath(expand(restart["state_dir"]))
    logpath = expand(log)
    ensure_dir(os.path.dirname(logpath) or ".", 0o755)
    out = open(logpath, "ab")
    try:
        proc = subprocess.Popen(
            restart["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=expand(restart.get("workdir")) or None, env=env,
            start_new_session=True, close_fds=True,
        )
    except OSError as e:
        raise AgentError("restart-failed", "could not start %r: %s" % (restart["argv"][0], e))
    finally:
        out.close()
    pidfile = expand(restart["pidfile"])
    ensure_dir(os.path.dirname(pidfile) or ".", 0o755)
    atomic_write(pidfile, ("%d\n" % proc.pid).encode())
    return proc.pid


def server_pid(restart):
    """pid of the running server as its manager reports it; None if it is not running."""
    kind = restart.get("kind", "command")
    if kind == "command":
        return command_server_pid(restart)
    if kind == "systemd":
        rc, out = run_tool(systemd_show_argv(restart), timeout=60)
        return parse_main_pid(out) if rc == 0 else None
    if kind == "supervisor":
        _, out = run_tool(supervisor_argv(restart, "pid", supervisorctl_command()), timeout=60)
        return parse_supervisor_pid(out)
    return None


def run_tool(argv, timeout=300.0):
    """(exit status, stdout+stderr) of a service manager's tool; 127 when it cannot be run."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "%s did not finish within %ds" % (" ".join(argv), timeout)
    except OSError as e:
        return 127, "cannot run %s: %s" % (argv[0], e)
    return proc.returncode, proc.stdout


# ----------------------------------------------- systemd and supervisor
# The argv builders and output parsers are pure: no host (and no systemd) is
# needed to test them. Every value goes in as its own argv word, never via a shell.

JOURNAL = "journal"   # server.log of a systemd unit whose output goes to journald


def uses_journal(restart, log):
    """True for a systemd unit that logs to the journal (server.log is "journal", or unset)."""
    return (restart or {}).get("kind") == "systemd" and (not log or log == JOURNAL)


def systemd_restart_argv(restart):
    # `restart`, not stop + start: units that depend on this one are restarted with it
    return ["systemctl", "restart", "--", restart["unit"]]


def systemd_show_argv(restart):
    # KEY=VALUE lines (no --value, which needs systemd >= 230); InvocationID (systemd >= 232)
    # names this run of the unit in the journal
    return ["systemctl", "show", "--property=MainPID", "--property=InvocationID", "--", restart["unit"]]


def parse_systemctl_show(output):
    props = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            props[key.strip()] = value.strip()
    return props


def parse_main_pid(output):
    """MainPID from `systemctl show` ("MainPID=123", or a bare "123" from --value); None for 0
    (the unit has no running main process) or output that is not a pid."""
    value = parse_systemctl_show(output).get("MainPID")
    if value is None:
        words = output.split()
        value = words[0] if len(words) == 1 else None
    try:
        pid = int(value)
    except (TypeError, ValueError):
        return None
    return pid if pid > 0 else None


def parse_invocation_id(output):
    """InvocationID from `systemctl show`: 32 hex digits, else None (older systemd, unit inactive)."""
    value = parse_systemctl_show(output).get("InvocationID", "").replace("-", "").lower()
    if len(value) == 32 and all(c in "0123456789abcdef" for c in value):
        return value
    return None


def journal_argv(unit, invocation=None, since=None, follow=True):
    """journalctl for the server's output since fleetpatch's restart: exactly the restarted
    run of the unit (its invocation id) where systemd has one, else the unit's entries since
    the epoch second the restart began (that also holds what the old run wrote while stopping)."""
    argv = ["journalctl", "--no-pager", "--quiet", "--all", "--output=cat"]
    if invocation:
        argv.append("_SYSTEMD_INVOCATION_ID=" + invocation)
    else:
        argv.append("--unit=" + unit)
        if since is not None:
            argv.append("--since=@%d" % int(since))
    if follow:
        argv += ["--follow", "--no-tail"]   # --no-tail: -f alone starts at the last 10 entries
    return argv


SUPERVISOR_SPAWN_FAILED = ("spawn error", "abnormal termination")


def supervisor_argv(restart, action, ctl=("supervisorctl",)):
    """`supervisorctl -c CONFIG ACTION PROGRAM`; ctl is how supervisorctl is run on this host."""
    program = restart["program"]
    if not program or program.split() != [program] or program == "all":
        # supervisorctl splits its arguments on blanks, and "all" would act on every program
        raise AgentError("error", "server.restart.program %r is not one supervisor program name" % program)
    argv = list(ctl)
    if restart.get("config"):
        argv += ["-c", expand(restart["config"])]
    return argv + [action, program]


def parse_supervisor_pid(output):
    """pid from `supervisorctl pid PROGRAM`: None for 0 (not running), "No such process", or an
    error from a supervisord that does not answer."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    if not lines:
        return None
    try:
        pid = int(lines[-1])
    except ValueError:
        return None
    return pid if pid > 0 else None


def parse_supervisor_result(output, program):
    """What `supervisorctl start|stop PROGRAM` said about PROGRAM: "started", "stopped",
    "not running", "spawn error", ... (the text of "PROGRAM: ERROR (...)"), or None when it said
    nothing about it (supervisord not answering, a usage error)."""
    prefix = program + ":"
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith(prefix):
            continue
        rest = line[len(prefix):].strip()
        if rest.startswith("ERROR (") and rest.endswith(")"):
            return rest[len("ERROR ("):-1]
        if rest:
            return rest
    return None


def supervisorctl_command():
    """supervisorctl from PATH; else the supervisor package of this interpreter, if it has one."""
    import shutil

    found = shutil.which("supervisorctl")
    if found:
        return [found]
    try:
        has_supervisor = find_spec("supervisor.supervisorctl") is not None
    except ImportError:
        has_supervisor = False
    if has_supervisor:
        return [sys.executable, "-m", "supervisor.supervisorctl"]
    return ["supervisorctl"]   # fails as "cannot run supervisorctl", which says what is missing


def restart_systemd(restart, log):
    """`systemctl restart UNIT`. For a log file the offset is taken before the restart (the stop
    and the start are one systemd job); for the journal, the new run's invocation id is the window."""
    unit = restart["unit"]
    journal = uses_journal(restart, log)
    began = time.time()
    pos = {"inode": None, "offset": 0} if journal else log_position(log)
    argv = systemd_restart_argv(restart)
    rc, out = run_tool(argv)
    if rc != 0:
        raise AgentError("restart-failed", "`%s` failed (exit %s): %s; `systemctl status %s` and "
                                           "`journalctl -u %s` say why" % (" ".join(argv), rc, out.strip(), unit, unit))
    rc, show = run_tool(systemd_show_argv(restart), timeout=60)
    pid = parse_main_pid(show) if rc == 0 else None
    extra = {"unit": unit}
    if journal:
        extra["journal"] = {"unit": unit, "invocation": parse_invocation_id(show) if rc == 0 else None,
                            "since": began}
    return extra, pos, pid


def restart_supervisor(restart, log):
    """supervisorctl stop, note where the program's log (its stdout_logfile) ends, start.
    A program that exits while starting is not an error here: the log since the offset
    shows why, and follow reports it as a server that exited."""
    program = restart["program"]
    ctl = supervisorctl_command()
    argv = supervisor_argv(restart, "stop", ctl)
    rc, out = run_tool(argv)
    state = parse_supervisor_result(out, program)
    if state not in ("stopped", "not running"):
        raise AgentError("restart-failed", "`%s` failed (exit %s): %s" % (" ".join(argv), rc, out.strip()
                                                                          or "no output"))
    pos = log_position(log)
    argv = supervisor_argv(restart, "start", ctl)
    rc, out = run_tool(argv)
    state = parse_supervisor_result(out, program)
    extra = {"program": program, "stopped": True}
    if state in SUPERVISOR_SPAWN_FAILED:
        extra["start_error"] = out.strip()
    elif state not in ("started", "already started"):
        raise AgentError("restart-failed", "`%s` failed (exit %s): %s" % (" ".join(argv), rc, out.strip()
                                                                          or "no output"))
    _, out = run_tool(supervisor_argv(restart, "pid", ctl), timeout=60)
    return extra, pos, parse_supervisor_pid(out)


def restart_server(req, ledger, reason):
    """Stop, note where the log ends, start. The offset is taken after the old
    server is gone, so nothing it wrote can count for the new one."""
    restart = dict(req["restart"], state_dir=req.get("state_dir"))
    log = req["log"]
    kind = restart.get("kind", "command")
    result = {"kind": kind}
    if kind == "command":
        result.update(stop_command_server(restart))
        pos = log_position(log)
        pid = start_command_server(restart, log)
        if pos["inode"] is None:   # no log yet: the server's is the one just created, from its start
            pos = {"inode": log_position(log)["inode"], "offset": 0}
    elif kind == "systemd":
        extra, pos, pid = restart_systemd(restart, log)
        result.update(extra)
    elif kind == "supervisor":
        extra, pos, pid = restart_supervisor(restart, log)
        result.update(extra)
    else:
        raise AgentError("error", "unknown restart kind %r" % kind)
    ledger["last_restart"] = protocol.LastRestart(at=now_iso(), epoch=time.time(), log=log, inode=pos["inode"],
                                                  offset=pos["offset"], pid=pid, reason=reason)
    if result.get("journal"):
        ledger["last_restart"]["journal"] = result["journal"]
    ledger["restart_pending"] = False
    result.update({"pid": pid, "inode": pos["inode"], "offset": pos["offset"]})
    return result


# -------------------------------------------------------------------- files

def site_pending():
    """Started with -S and the site step not run since."""
    return bool(sys.flags.no_site) and "site" not in sys.modules


def with_site():
    """The interpreter's whole `site` step (site-packages, every .pth file), once.

    The agent starts with -S: the site step is a third of a bare start-up (more
    where a .pth file imports something), and the agent itself needs only the
    stdlib. What must see the modules the host's Python sees asks for it here."""
    if site_pending():
        import importlib
        import site

        site.main()
        importlib.invalidate_caches()


def find_spec(name):
    """importlib's spec of `name` as the engine's interpreter, site step and all, finds it.

    Without the site step sys.path is the stdlib and PYTHONPATH, which come before
    site-packages anyway: a module found there is the one a full start finds too,
    so the site step runs only when the module is not there."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except ImportError:   # a dotted name's parent package is not found either
        if not site_pending():
            raise
        spec = None
    if spec is None and site_pending():
        with_site()
        spec = importlib.util.find_spec(name)
    return spec


def package_dir(package):
    """The directory that holds the engine package, found without importing it."""
    spec = find_spec(package)
    if spec is None or not spec.origin:
        raise AgentError("error", "%s cannot import %s: is engine.python the interpreter that runs the engine?"
                         % (sys.executable, package))
    pkg = os.path.dirname(os.path.abspath(spec.origin))
    return os.path.dirname(pkg)


def dist_info_version(root, package):
    """The version in the one `<package>-*.dist-info/METADATA` beside the package, or
    None (none, several, unreadable). The distribution installed with the package
    that imports is the one that counts, and reading it costs no importlib.metadata
    (tens of ms of imports at every agent start)."""
    prefix = package.replace("-", "_").lower() + "-"
    try:
        found = [n for n in os.listdir(root) if n.lower().startswith(prefix) and n.endswith(".dist-info")]
    except OSError:
        return None
    if len(found) != 1:
        return None
    try:
        with open(os.path.join(root, found[0], "METADATA"), "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line:
                    break  # the end of the headers
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip() or None
    except (IOError, OSError):
        return None
    return None


def package_version(package, root=None):
    found = dist_info_version(root, package) if root else None
    if found:
        return found
    with_site()
    try:
        import importlib.metadata as md
    except ImportError:  # Python 3.7
        return None
    try:
        return md.version(package)
    except Exception:
        return None


def safe_join(root, rel):
    full = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not full.startswith(os.path.normpath(root) + os.sep):
        raise AgentError("error", "refusing path outside the package directory: %r" % rel)
    return full


def writable_join(root, rel):
    """safe_join for a file fleetpatch will rename over: no symlink on the way, nor the file."""
    full = safe_join(root, rel)
    refuse_links(os.path.normpath(root), full, "in the package " + root)
    return full


def describe_file(root, rel, content):
    path = safe_join(root, rel)
    try:
        data = read_bytes(path)
    except (IOError, OSError) as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):   # ENOTDIR: a file where its folder would be
            return None
        raise
    st = os.stat(path)
    out = {"sha256": sha256_bytes(data), "size": len(data), "mode": st.st_mode & 0o7777}
    if content:
        out["content"] = pack(data)
    return out


def remove_bytecode(path):
    """Delete the cached bytecode of a changed module, so the old code can't run."""
    directory, name = os.path.split(path)
    stem = os.path.splitext(name)[0]
    cache = os.path.join(directory, "__pycache__")
    removed = []
    try:
        entries = os.listdir(cache)
    except OSError:
        entries = []
    for entry in entries:
        if entry.startswith(stem + ".") and entry.endswith((".pyc", ".pyo")):
            try:
                os.unlink(os.path.join(cache, entry))
                removed.append(entry)
            except OSError:
                pass
    legacy = os.path.splitext(path)[0] + ".pyc"
    if os.path.exists(legacy):
        os.unlink(legacy)
        removed.append(os.path.basename(legacy))
    return removed


def digest(data):
    """sha256 of bytes; None for None (a file that does not exist)."""
    return None if data is None else sha256_bytes(data)


def read_or_none(path):
    """The bytes of `path`, or None when it does not exist."""
    try:
        return read_bytes(path)
    except (IOError, OSError) as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def sibling_meta(directory, name):
    """Mode and owner for a file fleetpatch creates in `directory`: those of a regular file
    beside it (one with the same extension first, so a new module looks like the package's
    other modules), else the folder's owner with mode 0644. Special bits are never copied."""
    ext = os.path.splitext(name)[1]
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    found = None
    for other in names:
        if other == name or other.startswith("."):
            continue
        try:
            st = os.lstat(os.path.join(directory, other))
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if os.path.splitext(other)[1] == ext:
            found = st
            break
        found = found or st
    if found is not None:
        return {"mode": found.st_mode & 0o777, "uid": found.st_uid, "gid": found.st_gid}
    st = os.stat(directory)
    return {"mode": 0o644, "uid": st.st_uid, "gid": st.st_gid}


def put_file(path, data, meta, own_meta=False):
    """Make `path` hold `data`, or not exist (None): renamed over the file, created beside
    its siblings with `meta`, or unlinked. An existing file keeps its own mode and owner
    unless `own_meta` (a deleted file put back over one made since)."""
    if data is None:
        try:
            os.unlink(path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
    elif os.path.lexists(path) and not own_meta:
        atomic_write(path, data, like=path)
    else:
        atomic_write(path, data, meta=meta)


def write_all_or_nothing(root, changes):
    """Bring each file to its new content (`data`; None: removed); on any failure put back
    what was done (`original`; None: the file did not exist, so it is removed again).
    `meta` is the mode and owner for whichever side is a file that is absent now."""
    done = []
    try:
        for ch in changes:
            path = writable_join(root, ch["path"])
            put_file(path, ch["data"], ch.get("meta"), ch.get("own_meta", False))
            done.append(ch)
            remove_bytecode(path)
    except BaseException as e:
        for ch in reversed(done):
            path = safe_join(root, ch["path"])
            put_file(path, ch["original"], ch.get("meta"))
            remove_bytecode(path)
        if isinstance(e, AgentError):
            raise
        raise AgentError("error", "%s %s failed (%s); every file was put back as it was"
                         % (VERB.get(changes[len(done)]["op"], "writing"), changes[len(done)]["path"], e))


# what a change does to its file, for messages
VERB = {"create": "creating", "delete": "deleting", "modify": "writing", "restore": "restoring",
        "remove": "removing"}

WRITING = "writing.json"   # in the state dir while engine files are being renamed: see recover()
TMP_MARK = ".fleetpatch-"


def write_with_ledger(req, root, changes, previous, after, backups):
    """write_all_or_nothing under a journal, and when it put every file back, the ledger
    as it was (`previous`): a patch that is not in the files is never recorded, nor a
    restart for it.

    All-or-nothing must hold against the agent's own death too (kill -9, a lost host):
    the journal says which backup each file must end as, and which ledger then holds.
    The next run that takes the lock finishes it (recover): an apply is undone, a
    rollback completed; both end with every file restored from its backup."""
    # per file: the backup it ends as (target; None: the file ends absent, as before a
    # create), the other content it may hold (what an apply writes, or what a rollback
    # replaces; None: absent, as after a delete), and the mode and owner a file put back
    # from its backup gets when it is absent
    journal = {"root": root, "ledger": after, "files": [
        {"path": ch["path"], "target": digest(ch["backup"]), "source": ch["source"], "meta": ch.get("meta"),
         "other": digest(ch["original"] if ch["data"] == ch["backup"] else ch["data"])} for ch in changes]}
    if backups:   # an apply: dying half-way, it is undone, and the ledger is the one before it
        journal["ledger"] = previous
    atomic_write(state_path(req, WRITING), json.dumps(journal, sort_keys=True).encode())
    try:
        write_all_or_nothing(root, changes)
    except AgentError:
        try:
            save_ledger(req, previous)
        except OSError as e:  # disk full: the journal stays, and the next run finishes this
            raise AgentError("error", "writing the engine files failed and every file was put back, but the ledger "
                             "%s could not be restored (%s); free space, then rerun"
                             % (state_path(req, LEDGER), e))
        os.unlink(state_path(req, WRITING))
        raise
    save_ledger(req, after)
    os.unlink(state_path(req, WRITING))


def tmp_owner(name):
    """The pid in a `.NAME.fleetpatch-PID.tmp` name, else None."""
    if not (name.startswith(".") and name.endswith(".tmp") and TMP_MARK in name):
        return None
    try:
        return int(name[:-len(".tmp")].rsplit(TMP_MARK, 1)[1])
    except ValueError:
        return None


def remove_stale_tmp(directory, prefix=""):
    """Delete the temp files of fleetpatch runs that died (their pid is gone) in `directory`."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        pid = tmp_owner(name)
        if pid is None or not name.startswith("." + prefix) or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
        except OSError:
            pass
    return removed


def recover(req):
    """Finish what a dead run left (called with the lock held): a journaled write is
    brought to its backups, and every temp file of a dead run is removed."""
    out = {}
    path = state_path(req, WRITING)
    journal = None
    try:
        with open(path) as f:
            journal = json.load(f)
    except (IOError, OSError, ValueError):
        pass
    if journal:
        root = journal["root"]
        restored, left = [], []
        for f in journal["files"]:
            full = writable_join(root, f["path"])
            remove_stale_tmp(os.path.dirname(full))
            try:
                current = digest(read_or_none(full))   # None: absent (a created file not yet, a deleted one)
            except (IOError, OSError) as e:
                current = "unreadable (%s)" % e
            if current == f["target"]:
                continue
            if current != f["other"]:
                left.append(f["path"])
                continue
            if f["target"] is None:   # the run was creating it (or a rollback removing it)
                put_file(full, None, None)
            else:
                backup = read_or_none(state_path(req, f["source"]))
                if digest(backup) != f["target"]:
                    left.append(f["path"])
                    continue
                put_file(full, backup, f.get("meta"))
            remove_bytecode(full)
            restored.append(f["path"])
        if left:
            raise AgentError("drift", "a fleetpatch run died while writing, and %s now match neither the original nor "
                             "what it wrote; the journal %s and the backups in %s say what was meant; restore "
                             "them by hand, then remove the journal" % (", ".join(left), path, state_path(req)))
        save_ledger(req, journal["ledger"])
        os.unlink(path)
        out["finished_write"] = restored
    stale = []
    for directory, _, _ in os.walk(state_path(req)):
        stale += remove_stale_tmp(directory)
    pidfile = (req.get("restart") or {}).get("pidfile")
    if pidfile:
        pidfile = expand(pidfile)
        stale += remove_stale_tmp(os.path.dirname(pidfile) or ".", os.path.basename(pidfile))
    if stale:
        out["removed_tmp"] = stale
    return out


# ---------------------------------------------------------------- operations

def op_probe(req):
    out = {"python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3]}
    if req.get("lock"):
        out["locked"] = take_lock(req, req["lock"])
        if not out["locked"]:
            out["lock"] = read_lock(req)   # another run's: the laptop says whose, and whether it lives
            return out
        # a run that died mid-write (or left temp files) is finished before anything is read
        recovered = recover(req)
        if recovered:
            out["recovered"] = recovered
    package = req["package"]
    root = package_dir(package)
    out["package_dir"] = root
    out["version"] = package_version(package, root)
    files = list(req.get("files") or [])
    ledger = load_ledger(req)
    if req.get("ledger_files"):  # status: every file fleetpatch wrote, to spot drift in this same trip
        for entry in ledger.get("patches", {}).values():
            files.extend(p for p in entry.get("files", {}) if p not in files)
    out["files"] = dict((rel, describe_file(root, rel, req.get("content", False))) for rel in files)
    # an absent file that a diff creates needs its folder: say which folders are missing
    out["absent_folders"] = sorted(set(os.path.dirname(rel) for rel in files if out["files"][rel] is None
                                       and not os.path.isdir(os.path.dirname(safe_join(root, rel)))))
    out["ledger"] = ledger
    out["lock"] = read_lock(req)
    restart = req.get("restart")
    if restart:
        pid = server_pid(dict(restart, state_dir=req.get("state_dir")))
        alive = pid_alive(pid)
        out["server"] = {"pid": pid, "alive": alive}
        if alive:
            out["server"].update(proc_launch(pid, req.get("launch_env_prefixes") or ()))
        if req.get("health_url") and alive:
            status, _ = http_get(req["health_url"], timeout=3.0)
            out["server"]["healthy"] = status == 200
    if req.get("log"):
        out["log"] = log_position(req["log"])
        out["window_intact"] = window_intact(req["log"], ledger.get("last_restart"))
    return out


def window_intact(log, last):
    """Does the log still hold what the server wrote since fleetpatch's last restart? Not
    when the file was truncated below the window's start, or rotated or deleted away."""
    if not last or last.get("inode") is None or last.get("log") not in (None, log):
        return None
    if last.get("window_cut"):
        return False
    st = LogFollower._stat(expand(log))
    if st is not None and st.st_ino == last["inode"]:
        return st.st_size >= max(last.get("offset", 0), last.get("verified_size", 0))
    return find_inode(expand(log), last["inode"]) is not None


def planned_change(root, label, f):
    """One file of an apply request, checked against the host as it is now: what to
    write (`data`; None: delete), what to put back on failure (`original`; None: create)."""
    op = f.get("op") or protocol.OP_MODIFY
    rel = f["path"]
    path = writable_join(root, rel)
    if op == protocol.OP_CREATE:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise AgentError("conflict", "the patch creates %s, but its folder %s does not exist on this host; "
                             "nothing was written; the patch was made for another layout of the package" % (rel, folder))
        if os.path.lexists(path):
            raise AgentError("conflict", "the patch creates %s, but it exists now (it did not when fleetpatch read the "
                             "host: something created it meanwhile); nothing was written; inspect it, then rerun"
                             % rel)
        original, meta = None, sibling_meta(folder, os.path.basename(path))
    else:
        original = read_or_none(path)
        if original is None:
            raise AgentError("drift", "%s was removed on the host while fleetpatch was working; nothing was written; "
                             "rerun" % rel)
        if sha256_bytes(original) != f["before"]:
            raise AgentError("drift", "%s changed on the host while fleetpatch was working (sha256 %s, expected %s); "
                             "nothing was written; rerun" % (rel, sha256_bytes(original)[:12], f["before"][:12]))
        meta = file_meta(path)
    data = None
    if op != protocol.OP_DELETE:
        data = unpack(f["content"])
        if sha256_bytes(data) != f["after"]:
            raise AgentError("error", "the new content of %s was damaged in transit; nothing was written" % rel)
    return {"path": rel, "op": op, "data": data, "original": original, "backup": original, "meta": meta,
            "source": os.path.join("backups", label, rel) if original is not None else None}


def op_apply(req):
    """Back up, write every file, record the ledger, and restart — one round trip."""
    check_lock(req)
    root = req["package_dir"]
    ledger = load_ledger(req)
    label = req["label"]
    state_path(req, "backups", label)   # refuses a symlink in the state dir before anything is read
    # Every file is checked before anything is written: a refusal leaves the host as it was.
    changes = [planned_change(root, label, f) for f in req["files"]]
    # Backups first, and durable, so the originals survive whatever follows (a deleted
    # file's too: its mode and owner go into the ledger).
    for ch in changes:
        if ch["original"] is None:
            continue   # created: there is nothing to keep, and rollback removes it
        dest = state_path(req, ch["source"])
        if os.path.exists(dest) and sha256_bytes(read_bytes(dest)) == sha256_bytes(ch["original"]):
            continue
        try:
            ensure_dir(os.path.dirname(dest))
            atomic_write(dest, ch["original"], like=None)
        except OSError as e:
            raise AgentError("error", "cannot back up %s to %s (%s); no engine file was changed; free space "
                             "or fix the permissions of the state dir, then rerun" % (ch["path"], dest, e))
    previous = json.loads(json.dumps(ledger))
    ledger["restart_pending"] = True
    seq = 1 + max([e.get("seq", 0) for e in ledger.get("patches", {}).values()] or [0])
    files = {}
    for ch in changes:
        rec = protocol.LedgerFile(op=ch["op"], before=digest(ch["original"]), after=digest(ch["data"]),
                                  backup=ch["source"])
        if ch["op"] == protocol.OP_DELETE:
            rec.update(ch["meta"])   # mode, uid, gid: rollback puts the file back as it was
        files[ch["path"]] = rec
    entry = protocol.LedgerEntry(rev=req["rev"], label=label, diff_sha256=req["diff_sha256"], applied_at=now_iso(),
                                 seq=seq, files=files, verification=None)
    ledger.setdefault("patches", {})[req["name"]] = entry
    # The ledger says "restart pending" before any engine file changes: a run that
    # dies between the write and the restart is finished by the next run.
    save_ledger(req, ledger)
    write_with_ledger(req, root, changes, previous, ledger, backups=True)
    out = {"written": [c["path"] for c in changes if c["op"] == protocol.OP_MODIFY],
           "created": [c["path"] for c in changes if c["op"] == protocol.OP_CREATE],
           "deleted": [c["path"] for c in changes if c["op"] == protocol.OP_DELETE]}
    if req.get("restart"):
        out["restart"] = restart_server(req, ledger, "deploy " + label)
        save_ledger(req, ledger)
    return out


def op_restart(req):
    check_lock(req)
    ledger = load_ledger(req)
    out = {"restart": restart_server(req, ledger, req.get("reason", "restart"))}
    save_ledger(req, ledger)
    return out


def rollback_change(req, root, entry, rel, rec):
    """What restoring one file of a ledger entry takes (None: it holds its original already).
    A modified file gets its backup back; a created one is removed (its bytecode with it); a
    deleted one is put back from its backup with its mode and owner, only where it is absent.
    Each only from what fleetpatch wrote: anything else is drift, unless --force."""
    op = rec.get("op") or protocol.OP_MODIFY
    path = writable_join(root, rel)
    current = read_or_none(path)
    backup = None
    if rec.get("backup"):
        backup = read_or_none(state_path(req, rec["backup"]))
        if digest(backup) != rec["before"]:
            raise AgentError("error", "the backup of %s (%s) is %s, not the original's recorded sha256 %s; nothing "
                             "was restored" % (rel, state_path(req, rec["backup"]),
                                               "missing" if backup is None else "damaged", rec["before"][:12]))
    cur_sha = digest(current)
    if cur_sha == rec["before"]:
        return None
    if cur_sha != rec["after"] and not req.get("force"):
        if op == protocol.OP_CREATE:
            why = ("%s, which %s created, changed since fleetpatch wrote it (sha256 %s, wrote %s); nothing was "
                   "restored; inspect it, then rerun with --force to remove it anyway"
                   % (rel, entry["label"], cur_sha[:12], rec["after"][:12]))
        elif op == protocol.OP_DELETE:
            why = ("%s, which %s deleted, exists again with other content (sha256 %s); nothing was restored; "
                   "inspect it, then rerun with --force to put the original back over it"
                   % (rel, entry["label"], cur_sha[:12]))
        elif current is None:
            why = ("%s was removed since fleetpatch wrote it; nothing was restored; rerun with --force to put the "
                   "original back" % rel)
        else:
            why = ("%s changed since fleetpatch wrote it (sha256 %s, wrote %s); nothing was restored; inspect it, "
                   "then rerun with --force to restore the original anyway" % (rel, cur_sha[:12], rec["after"][:12]))
        raise AgentError("drift", why)
    if op == protocol.OP_DELETE:
        # the deleted file's own mode and owner, from the ledger, even over a file made since
        meta = dict((k, rec[k]) for k in ("mode", "uid", "gid") if k in rec)
        meta = meta if len(meta) == 3 else sibling_meta(os.path.dirname(path), os.path.basename(path))
    elif current is not None:
        meta = file_meta(path)
    else:
        meta = sibling_meta(os.path.dirname(path), os.path.basename(path))
    return {"path": rel, "op": "remove" if backup is None else "restore", "data": backup, "original": current,
            "backup": backup, "source": rec.get("backup"), "meta": meta, "own_meta": op == protocol.OP_DELETE}


def op_rollback(req):
    """Restore the originals of one patch (sha256-checked) and restart."""
    check_lock(req)
    root = req["package_dir"]
    ledger = load_ledger(req)
    entry = ledger.get("patches", {}).get(req["name"])
    if not entry:
        raise AgentError("error", "%s is not recorded as applied on this host; nothing to roll back" % req["name"])
    # Patches stack: in a shared file a newer patch's lines sit on this one's, and the
    # backup holds neither. Restoring it, even with --force, would take the newer patch's
    # lines out while its record stays (and a later rollback of it would put this one's
    # lines back unrecorded). So the newest goes first, always.
    shared, newer = set(), []
    for other, e in sorted(ledger.get("patches", {}).items()):
        overlap = set(e.get("files", {})) & set(entry["files"])
        if other != req["name"] and e.get("seq", 0) > entry.get("seq", 0) and overlap:
            newer.append(other)
            shared |= overlap
    if newer:
        raise AgentError("error", "%s was applied after %s and changes the same files (%s); nothing was restored; "
                         "roll back %s first, or roll back everything (rollback without --patch goes newest first)"
                         % (", ".join(newer), entry["label"], ", ".join(sorted(shared)), " and ".join(newer)))
    changes = [c for c in (rollback_change(req, root, entry, rel, rec) for rel, rec in sorted(entry["files"].items()))
               if c is not None]
    previous = json.loads(json.dumps(ledger))
    del ledger["patches"][req["name"]]
    ledger.setdefault("rolled_back", {})[req["name"]] = protocol.RolledBack(label=entry["label"], at=now_iso())
    if changes:  # a patch whose files are all original already needs no restart to undo it
        ledger["restart_pending"] = True
        # the originals are back: recorded before a restart that may fail
        write_with_ledger(req, root, changes, previous, ledger, backups=False)
    else:
        save_ledger(req, ledger)
    out = {"restored": [c["path"] for c in changes if c["op"] == "restore"],
           "removed": [c["path"] for c in changes if c["op"] == "remove"],
           "files": dict((rel, describe_file(root, rel, False)) for rel in entry["files"])}
    if req.get("restart") and (changes or previous.get("restart_pending")):
        out["restart"] = restart_server(req, ledger, "rollback " + entry["label"])
        save_ledger(req, ledger)
    return out


def op_unlock(req):
    """Release this run's lock (a no-op when this run does not hold it)."""
    release_lock(req)
    return {"unlocked": True}


def op_record(req):
    """Write a verification verdict into the ledger."""
    update = req.get("ledger_update") or {}
    ledger = load_ledger(req)
    for name, verification in (update.get("verification") or {}).items():
        if name in ledger.get("patches", {}):
            ledger["patches"][name]["verification"] = verification
    if "last_verification" in update:
        ledger["last_verification"] = update["last_verification"]
    last = ledger.get("last_restart")
    if last and req.get("log") and last.get("inode") is not None:
        # how far the verified window reached: a log cut below it no longer holds the evidence
        st = LogFollower._stat(expand(req["log"]))
        if st is not None and st.st_ino == last["inode"]:
            last["verified_size"] = st.st_size
        if FOLLOWING and getattr(FOLLOWING[-1].follower, "truncated", False):
            last["window_cut"] = True
    save_ledger(req, ledger)
    return {"recorded": True}


# ------------------------------------------------------------------- follow

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
    chatty server cannot make the agent hold its whole log."""

    READ_CHUNK = 1 << 20
    READ_BUDGET = 4 << 20

    def __init__(self, path, inode, offset):
        self.path = expand(path)
        self.fh = None
        self.ino = None
        self.line_no = 1       # line number (in the current file) of the next full line
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
        self.fh = open(path, "rb")
        self.ino = os.fstat(self.fh.fileno()).st_ino
        self.line_no = 1 + self._count_lines(offset)
        self.fh.seek(offset)
        self.partial = b""
        self.files.append(path)

    def _count_lines(self, offset):
        n, left = 0, offset
        self.fh.seek(0)
        while left > 0:
            chunk = self.fh.read(min(left, self.READ_CHUNK))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
        return n

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
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except Exception:   # no ctypes, no libc symbol (not Linux): poll
            return
        if fd < 0:
            return
        self.fd, self.libc = fd, libc
        # the directory, for a log created or rotated in under the name; the file, for its lines
        self.add(os.path.dirname(path) or ".", self.IN_CREATE | self.IN_MOVED_TO)
        self.watch_file()

    def add(self, path, mask):
        return self.libc.inotify_add_watch(self.fd, path.encode("utf-8", "surrogateescape"), mask) >= 0

    def watch_file(self):
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
            while os.read(self.fd, 65536):
                pass
        except OSError:   # EAGAIN: all read
            pass
        self.watch_file()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
    if not uses_journal(restart, req.get("log")):
        return LogFollower(req["log"], req.get("inode"), req.get("offset", 0))
    window = (load_ledger(req).get("last_restart") or {}).get("journal") or {}
    since = window.get("since")
    if not window.get("invocation") and since is None:
        since = time.time()   # no restart of fleetpatch's to start from: from now on
    argv = journal_argv(restart["unit"], window.get("invocation"), since)
    return JournalFollower(argv, "journal of " + restart["unit"])


class Follow(object):
    """One `follow`: stream the log since the restart with liveness and health,
    until the laptop sends its follow-up requests (it has its verdict) or the
    timeout passes. Deadlines use the monotonic clock."""

    POLL_S = 0.05
    # With the log watched (inotify) its writes wake the follow at once; the timer then only
    # catches what writes nothing (a health answer, a death without a word), so it can be
    # slower: at 50 ms it was most of a follow's iterations, and of its CPU, on a busy host.
    WATCHED_POLL_S = 0.25
    DECISION_WAIT_S = 10.0

    def __init__(self, req):
        self.req = req
        self.follower = open_follower(req)
        self.watch = LogWatch(self.follower.path) if isinstance(self.follower, LogFollower) else None
        restart = req.get("restart") or {}
        self.managed = restart.get("kind") in ("systemd", "supervisor")
        self.pid = req.get("pid") or (server_pid(restart) if self.managed else None)
        self.health_url = req.get("health_url")
        self.info_url = req.get("server_info_url")
        self.ready_text = req.get("ready_line")
        self.env_prefixes = req.get("launch_env_prefixes") or ()
        self.started = time.monotonic()
        self.deadline = self.started + float(req.get("timeout", 60)) + 5
        self.ready = False
        self.info_sent = False
        self.launch_sent = False
        self.last_state = None
        self.last_emit = self.started
        self.next_health = 0.0
        # The session's request stream (the laptop's decision arrives on it), or stdin when run alone.
        self.requests = SESSION.requests or RequestReader(sys.stdin.fileno())

    def run(self):
        while True:
            self.send_launch()
            self.send_lines()
            now = time.monotonic()
            # a manager that reports no main process means the server is not running
            alive = pid_alive(self.pid) if self.pid else (False if self.managed else None)
            if alive is False:
                # What a dying server wrote last (its traceback) must reach the verdict before its death does.
                self.send_lines()
            self.send_state(now, alive, self.check_health(now, alive))
            if now > self.deadline:
                return self.at_deadline()
            followups = self.read_followups()
            if followups is not None:
                return followups

    def at_deadline(self):
        """Say the time is up, then wait a bounded moment for the laptop's decision on it
        (its record and its release of the lock), which it sends when it sees this."""
        emit({"t": "deadline"})
        until = time.monotonic() + self.DECISION_WAIT_S
        while time.monotonic() < until:
            followups = self.read_followups()
            if followups is not None:
                return dict(followups, ended="deadline") if "then" in followups else followups
        return {"ended": "deadline"}

    def send_launch(self):
        if self.pid and not self.launch_sent and pid_alive(self.pid):
            # How the server that is running now was launched: it, not the inventory, decides the path.
            emit(dict(proc_launch(self.pid, self.env_prefixes), t="launch", pid=self.pid))
            self.launch_sent = True

    def send_lines(self):
        for path, first, lines in self.follower.read():
            emit({"t": "lines", "file": path, "first_line_no": first, "lines": lines})
            self.last_emit = time.monotonic()
            if self.ready_text and not self.ready and any(self.ready_text in l for l in lines):
                self.ready = True
                self.next_health = 0.0

    def check_health(self, now, alive):
        if not self.health_url or now < self.next_health or alive is False:
            return None
        status, _ = http_get(self.health_url, timeout=2.0)
        healthy = status == 200
        self.next_health = now + (0.25 if self.ready else 1.0)
        if healthy and self.info_url and not self.info_sent:
            status, body = http_get(self.info_url, timeout=3.0)
            if status == 200:
                try:
                    emit({"t": "server_info", "data": json.loads(body.decode("utf-8", "replace"))})
                except ValueError:
                    pass
                self.info_sent = True
        return healthy

    def send_state(self, now, alive, healthy):
        elapsed = round(now - self.started, 3)
        if healthy is not None or alive is False:
            if (alive, healthy) != self.last_state:
                emit({"t": "state", "alive": alive, "healthy": healthy, "elapsed": elapsed})
                self.last_state = (alive, healthy)
                self.last_emit = now
        elif now - self.last_emit >= 0.5:
            emit({"t": "tick", "elapsed": elapsed})

    def read_followups(self):
        """None while the laptop is still listening; else follow's result."""
        line = None if SESSION.gone else self.requests.poll(self.poll_wait(), self.watch)
        if SESSION.gone or self.requests.eof:
            return {"ended": "stdin closed"}
        if line is None:
            return None
        requests = json.loads(line.decode("utf-8") or "[]")
        return {"ended": "finished", "then": [run_request(r) for r in requests]}

    def poll_wait(self):
        """How long the next wait for the laptop's decision may last."""
        if getattr(self.follower, "more", False):
            return 0   # no wait while the log has more to read: a burst is passed on as fast as it is read
        if self.watch is None or self.watch.fd is None:
            return self.POLL_S
        wait = self.WATCHED_POLL_S
        if self.health_url:   # a health check falls due: that is not a log write
            # at least POLL_S: a check that is overdue and not made (the server is dead) must
            # not turn the wait into a spin until the laptop decides
            wait = min(wait, max(self.POLL_S, self.next_health - time.monotonic()))
        return wait

    def close(self):
        close = getattr(self.follower, "close", None)
        if close is not None:
            close()
        if self.watch is not None:
            self.watch.close()


FOLLOWING = []   # the follow whose decision (record) is running: it knows whether the log was cut


def op_follow(req):
    follow = Follow(req)
    FOLLOWING.append(follow)
    try:
        return follow.run()
    finally:
        FOLLOWING.remove(follow)
        follow.close()


# ------------------------------------------------- serving: drain, smoke, bake
# The laptop takes the worker out of its routers; these run ON the host, so the
# worker's own figures are read where the worker is (the routers' load figures
# count tokens, not requests).

def read_worker_load(url):
    """(running, waiting, path) or (None, None, why) when the worker does not answer."""
    base = url.rstrip("/")
    why = None
    for path in ("/v1/loads", "/get_load"):
        status, body = http_get(base + path, timeout=3.0)
        if status == 200:
            try:
                running, waiting = protocol.parse_worker_loads(json.loads(body.decode("utf-8", "replace")))
                return running, waiting, path
            except ValueError as e:
                raise AgentError("router-error", "GET %s%s answered, but not as SGLang does (%s)" % (base, path, e))
        why = "GET %s%s: %s" % (base, path, "HTTP %s" % status if status else body.decode("utf-8", "replace"))
        if status != 404:
            break
    return None, None, why


def op_drain(req):
    """Wait (at most `wait` s) until the worker at `url` has no running and no waiting
    request. The laptop calls it again until its --drain-timeout: short calls keep a
    Ctrl-C on the laptop answered within one of them."""
    url = req["url"]
    deadline = time.monotonic() + max(0.0, float(req.get("wait", 2.0)))
    pid = server_pid(req.get("restart") or {}) if req.get("restart") else None
    first = None
    while True:
        running, waiting, source = read_worker_load(url)
        if first is None:
            first = (running or 0) + (waiting or 0)   # what this call found in flight
        if running is None:
            if pid is not None and not pid_alive(pid):
                # a server that is not running has nothing in flight
                return {"drained": True, "running": 0, "waiting": 0, "source": "server not running", "first": 0}
            raise AgentError("router-error", "cannot read the load of the worker %s from the host (%s); is "
                             "server.url right, and does it answer on this host?" % (url, source))
        if running == 0 and waiting == 0:
            return {"drained": True, "running": 0, "waiting": 0, "source": source, "first": first}
        if time.monotonic() >= deadline:
            return {"drained": False, "running": running, "waiting": waiting, "source": source, "first": first}
        time.sleep(float(req.get("poll", 0.1)))


def http_post_json(url, body, timeout):
    """(status, body bytes) or (None, error text)."""
    return http_request("POST", url, json.dumps(body).encode("utf-8"), timeout)


def log_reader_since(req, since_epoch, pos):
    """A reader of the server's output from now on: the log file from `pos`, or its journal."""
    restart = req.get("restart") or {}
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


def op_smoke(req):
    """POST url/generate with the smoke prompt from the host; then, if `expect` lines are
    given, read the server's output written since the request until each has appeared
    (at most `expect_wait` s). The laptop judges the answer."""
    since = time.time()
    pos = log_position(req["log"]) if req.get("log") and req.get("log") != "journal" else {}
    status, body = http_post_json(req["url"].rstrip("/") + "/generate",
                                  {"text": req.get("prompt", "Hello"),
                                   "sampling_params": {"max_new_tokens": int(req.get("max_new_tokens", 4)),
                                                       "temperature": 0}},
                                  float(req.get("timeout", 60)))
    out = {"status": status, "body": pack(body[:65536] if isinstance(body, bytes) else b"")}
    expect = list(req.get("expect") or [])
    if not expect or status != 200:
        return out
    reader = log_reader_since(req, since - 1, pos)
    found, seen = {}, 0
    deadline = time.monotonic() + float(req.get("expect_wait", 5.0))
    try:
        while True:
            for _path, first, lines in reader.read():
                for i, line in enumerate(lines):
                    seen += 1
                    for text in expect:
                        if text not in found and text in line:
                            found[text] = {"line_no": first + i, "line": line[:500]}
            if len(found) == len(expect) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    finally:
        close_reader(reader)
    out.update({"found": found, "missing": [t for t in expect if t not in found], "lines_read": seen})
    return out


def op_bake(req):
    """Watch the server `seconds` s: its process alive, its health endpoint 200, and no
    new line holding a `forbid` text. Ends at the first problem."""
    restart = req.get("restart") or {}
    forbid = list(req.get("forbid") or [])
    pos = log_position(req["log"]) if req.get("log") and req.get("log") != "journal" else {}
    reader = log_reader_since(req, time.time(), pos) if req.get("log") or uses_journal(restart, None) else None
    deadline = time.monotonic() + float(req.get("seconds", 10))
    checks, lines_read = 0, 0
    try:
        while True:
            pid = server_pid(restart)
            if not pid_alive(pid):
                return {"ok": False, "problem": "the server process is not running (pid %s)" % pid,
                        "checks": checks}
            if req.get("health_url"):
                status, _ = http_get(req["health_url"], timeout=2.0)
                if status != 200:
                    return {"ok": False, "problem": "GET %s answered %s" % (req["health_url"], status or "nothing"),
                            "checks": checks}
            for _path, first, lines in (reader.read() if reader is not None else []):
                for i, line in enumerate(lines):
                    lines_read += 1
                    for text in forbid:
                        if text in line:
                            return {"ok": False, "problem": "line %d of the log holds %r: %s"
                                    % (first + i, text, line[:300]), "checks": checks}
            checks += 1
            if time.monotonic() >= deadline:
                return {"ok": True, "checks": checks, "lines_read": lines_read}
            time.sleep(0.25)
    finally:
        close_reader(reader)


OPS = {"probe": op_probe, "apply": op_apply, "restart": op_restart, "rollback": op_rollback,
       "record": op_record, "unlock": op_unlock, "follow": op_follow,
       "drain": op_drain, "smoke": op_smoke, "bake": op_bake}


def dispatch(req):
    """Run one request; an unknown op is the laptop's bug, said plainly."""
    op = OPS.get(req.get("op"))
    if op is None:
        raise AgentError("error", "unknown agent operation %r" % req.get("op"))
    try:
        result = op(req)
    except AgentError as e:
        SESSION.failed(req, e.code)
        raise
    except BaseException:
        SESSION.failed(req, "error")
        raise
    SESSION.done(req, result)
    return result


def run_request(req):
    """One request and then its chained requests (`then`), in order, in this process:
    the laptop chains what must follow a success, e.g. the release of its lock."""
    result = dispatch(req)
    if req.get("then"):
        result["then"] = [run_request(r) for r in req["then"]]
    return result


def after_restart(req, window):
    """A follow sent together with the request that restarts (`after_restart`) takes
    its log window from that restart, the request answered just before it."""
    if not (req.get("op") == "follow" and req.get("after_restart")):
        return req
    if window is None:
        raise AgentError("skipped", "not followed: the request before it started no server")
    return dict(req, **protocol.log_window(window))


def answer(req):
    """Run one request and emit its Result line, whatever happens."""
    window, SESSION.restart_window = SESSION.restart_window, None
    try:
        req = after_restart(req, window)
        with Ticker(req):
            result = run_request(req)
        if req.get("op") in MUTATING and isinstance(result.get("restart"), dict):
            SESSION.restart_window = result["restart"]
        if req.get("op") == "probe" and AGENT_BOOT:
            result["agent"] = dict(AGENT_BOOT)
        emit({"t": "result", "ok": True, "result": result})
    except AgentError as e:
        emit({"t": "result", "ok": False, "code": e.code, "message": e.message})
    except Exception as e:  # a bug or an OS error: report it, don't hang the laptop
        import traceback   # here, not at the top: it costs milliseconds at every agent start

        emit({"t": "result", "ok": False, "code": "error",
              "message": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()})


main = answer


# ------------------------------------------------------------------ session
#
# One agent process serves every request of one command on this host: the laptop
# sends them as JSON lines on the same channel and ends with `bye` (or closes it).
# Each request runs to its end whatever happens to the channel meanwhile (a step
# is never cut half-way: a write is atomic, a restart finishes), so a channel that
# closes mid-operation is seen only between requests. Then the lock this session
# took is left so that the next run knows what happened (`Session.end`).

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
        self.requests = None     # RequestReader while serving
        self.gone = False        # stdout broken or SIGHUP: nobody reads our replies any more
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

    def end(self, how):
        """The channel ended (`how`) with this session's lock still held. Nothing changed
        in the engine's files or server: release it, the host is as the run found it.
        Something changed: keep it, with a note of what happened beside it (`lock-lost`,
        never a rewrite of the lock file, which a new session of the same run may be
        releasing at this moment), so that the next run refuses with that story until
        an operator looks (status) and breaks it."""
        req, self.lock_req = self.lock_req, None
        if req is None:
            return
        held = read_lock(req)
        if not held or held.get("token") != req.get("lock_token"):
            return
        if not self.changed:
            release_lock(req)
            return
        RENEWAL.stop()   # kept for an operator to look at: nobody renews it, so it reads as left by a dead run
        note = {"token": held["token"], "at": now_iso(), "how": how, "after": list(self.changed), "pid": os.getpid()}
        try:
            atomic_write(state_path(req, LOCK_LOST), json.dumps(note).encode())
        except (IOError, OSError):
            pass  # the lock stays held without the note, which is still the safe side


SESSION = Session()
AGENT_BOOT = globals().get("AGENT_BOOT")   # set by agentboot: how each module was loaded (cached / compiled)


def serve(fd=0):
    """Answer request lines until `bye` or the end of the channel."""
    # A hangup must not kill a step half-way; the reply writes then fail quietly.
    # (A handler, not SIG_IGN: an ignored signal would be inherited by the server we start.)
    signal.signal(signal.SIGHUP, lambda *a: setattr(SESSION, "gone", True))
    SESSION.requests = reader = RequestReader(fd)
    how = "the laptop closed the channel"
    while True:
        line = reader.poll(None)
        if line is None:
            break
        if not line.strip():
            continue
        try:
            req = json.loads(line.decode("utf-8"))
        except ValueError as e:
            emit({"t": "result", "ok": False, "code": "error", "message": "not a JSON request line: %s" % e})
            continue
        if isinstance(req, list):
            # A follow's decision that arrived after that follow had ended (at its deadline
            # the agent waits only so long): its request was answered, so this gets no reply;
            # the laptop sees no `then` in that answer and releases its lock by request.
            continue
        if not isinstance(req, dict):
            emit({"t": "result", "ok": False, "code": "error", "message": "not a JSON request object: %r" % (req,)})
            continue
        if req.get("op") == "bye":
            how = "the laptop said bye"
            break
        answer(req)
    SESSION.end(how)


if __name__ in ("__main__", "__fleetpatch_agent__"):
    serve()
