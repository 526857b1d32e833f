"""Container hosts: the engine runs in a container (`engine.container`) on the host.

The agent still runs on the host, under the host's own python3, started by the one
SSH command of the run; the ledger, the lock and the backups stay on the host under
the container's own state dir. It reaches the engine's files through the container's
root as the host sees it, `/proc/<pid of the container's main process>/root`: every
read, backup, atomic write (a rename inside the container's own filesystem) and
rollback of files.py works there unchanged, and all-or-nothing, the journal and
byte-exact rollback hold as on a plain host. Every container path is first resolved
inside that root (inroot.py), as the container resolves it: from the host, an
absolute symlink in the image would lead into the host's own files.

Why not `docker exec` or `docker cp`: measured on the test daemon (Docker 20.10,
overlay2), `docker inspect` takes 57 ms, `docker exec true` 115 ms, `docker exec -i
python3 -S -c pass` 155 ms and `docker cp` of one file 260 ms, while a read and sha256
of eagle_worker.py under /proc/PID/root takes 0.04 ms. An exec per file operation
would cost seconds per deploy; relaying the whole agent through `exec -i` would put
its ledger and lock inside the container, which a re-creation wipes. So the runtime
is asked once per request (`inspect`: is it there, running, its id and pid), and at
a restart (`stop`, `start`); everything else is file access. It needs what
/proc/PID/root needs: the SSH user must be root (or the container's own user).

The package is found without running the container's Python: in its site
directories, a plain `sglang/` folder, an `__editable__` finder's MAPPING (pip
install -e, as in the official image), or a path line of a .pth file; the version
comes from the dist-info beside it.

The log of `restart.kind: container` is the container's output since fleetpatch's
restart (`<runtime> logs --since T --timestamps --follow`): T is taken between the
stop and the start, so nothing the old process printed counts, and a re-created
container has a log of its own.

For Docker every one of these calls (inspect, stop, start, the log) goes to the daemon's
unix socket directly (runtime_api), the same API calls the CLI would make, without a CLI
process per call; the CLI is used where the socket is not surely the CLI's daemon.
"""
import json
import os
import re
import signal
import subprocess
import time

from . import inroot
from .base import AgentError
from .package import dist_info_version
from .procs import (pid_alive, pidfile_mismatch, proc_argv, proc_stat, read_pid, refuse_to_signal, run_tool,
                    signal_if_same, wait_pid_gone)
from .runtime_api import LogStream, api_socket, call, message, quote

# ops that read or act on the container (the others touch only the state dir on the host, or HTTP)
CONTAINER_OPS = ("probe", "apply", "rollback", "restart", "stop", "follow", "smoke", "bake")

SITE_DIRS = ("/usr/local/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages",
             "/usr/local/lib/python3*/site-packages", "/usr/lib/python3*/site-packages",
             "/opt/conda/lib/python3*/site-packages")
FINDER_MAPPING = r"^MAPPING\s*(?::[^=\n]*)?=\s*(\{.*?\})\s*$"   # re.M | re.S
TIMESTAMP = r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) "   # the runtime's, before each line


def spec_of(req):
    c = req.get("container") or {}
    return c.get("name"), c.get("runtime") or "docker"


def refusal(name, runtime, cause, fix):
    return AgentError("error", "container %s (%s): %s; nothing was changed; %s" % (name, runtime, cause, fix))


def inspect(name, runtime):
    """The runtime's inspect document of the container, or an AgentError naming the cause:
    over the daemon's socket where the CLI would go there too (runtime_api), else the CLI."""
    sock = api_socket(runtime)
    if sock:
        return api_inspect(sock, name, runtime)
    rc, out = run_tool([runtime, "inspect", "--type", "container", "--", name], timeout=60)
    if rc == 0:
        try:
            docs = json.loads(out[out.index("["):])
            if docs:
                return docs[0]
        except ValueError:
            pass
    low = out.lower()
    if rc == 127:
        raise refusal(name, runtime, "the runtime cannot be run on this host (%s)" % out.strip(),
                      "install %s, or set engine.runtime" % runtime)
    if "no such container" in low or "no such object" in low or (rc == 0 and out.strip().startswith("[]")):
        raise refusal(name, runtime, "no such container on this host",
                      "check engine.container (`%s ps -a` lists them)" % runtime)
    if "permission denied" in low:
        raise refusal(name, runtime, "the SSH user (uid %d) may not use %s: permission denied on its socket"
                      % (os.getuid(), runtime), "connect as root (or a member of the %s group)" % runtime)
    if "cannot connect" in low or "is the docker daemon running" in low or "unable to connect" in low:
        raise refusal(name, runtime, "the runtime cannot be reached: %s" % out.strip().splitlines()[-1],
                      "start its daemon (systemctl start %s), then rerun" % runtime)
    raise refusal(name, runtime, "`%s inspect` failed (exit %s): %s" % (runtime, rc, out.strip()[-300:]),
                  "check the runtime on this host")


def unreachable(name, runtime, sock, e):
    """The refusal for an API call that could not reach the daemon's socket (an OSError)."""
    import errno
    if getattr(e, "errno", None) in (errno.EACCES, errno.EPERM):
        return refusal(name, runtime, "the SSH user (uid %d) may not use %s: permission denied on its socket %s"
                       % (os.getuid(), runtime, sock), "connect as root (or a member of the %s group)" % runtime)
    return refusal(name, runtime, "the runtime cannot be reached: cannot connect to %s (%s)"
                   % (sock, getattr(e, "strerror", None) or e or type(e).__name__),
                   "start its daemon (systemctl start %s), then rerun" % runtime)


def api_inspect(sock, name, runtime):
    """`GET /containers/NAME/json`: what `<runtime> inspect --type container` prints, in one call."""
    try:
        status, body = call(sock, "GET", "/containers/%s/json" % quote(name), 60)
    except (OSError, ValueError) as e:
        raise unreachable(name, runtime, sock, e)
    if status == 200:
        try:
            return json.loads(body.decode("utf-8", "replace"))
        except ValueError:
            pass
    if status == 404:
        raise refusal(name, runtime, "no such container on this host",
                      "check engine.container (`%s ps -a` lists them)" % runtime)
    raise refusal(name, runtime, "the daemon's inspect failed (HTTP %s): %s" % (status, message(body)[-300:]),
                  "check the runtime on this host")


def api_action(restart, action, query, timeout):
    """`POST /containers/ID/<action>`: None once done (or nothing to do, 304), else what the
    daemon said, for the restart-failed message; False when the API is not the way in (the CLI is)."""
    info = restart["_container"]
    sock = api_socket(info["runtime"])
    if not sock:
        return False
    try:
        status, body = call(sock, "POST", "/containers/%s/%s%s" % (quote(info["id"] or info["name"]), action, query),
                            timeout)
    except (OSError, ValueError) as e:
        return "cannot reach the daemon at %s: %s" % (sock, getattr(e, "strerror", None) or e or type(e).__name__)
    if status in (204, 304):
        return None
    return "HTTP %s: %s" % (status, message(body) or "no message")


def describe(doc, name, runtime):
    st = doc.get("State") or {}
    pid = st.get("Pid") or None
    return {"name": name, "runtime": runtime, "id": doc.get("Id"), "created": doc.get("Created"),
            "started_at": st.get("StartedAt"), "running": bool(st.get("Running")) and not st.get("Restarting"),
            "pid": pid, "image": (doc.get("Config") or {}).get("Image"), "tty": bool((doc.get("Config") or {}).get("Tty")),
            "root": "/proc/%d/root" % pid if pid else None}


def resolve(req):
    """The running container the request is for, checked before anything is done to it."""
    name, runtime = spec_of(req)
    doc = inspect(name, runtime)
    info = describe(doc, name, runtime)
    st = doc.get("State") or {}
    if not info["running"] or st.get("Paused"):
        state = st.get("Status") or ("paused" if st.get("Paused") else "not running")
        raise refusal(name, runtime, "the container is %s (exit code %s, since %s)"
                      % (state, st.get("ExitCode"), st.get("FinishedAt") or "?"),
                      "start it (`%s start %s`), then rerun" % (runtime, name))
    try:
        os.listdir(info["root"])
    except OSError as e:
        raise refusal(name, runtime, "its files cannot be reached from the host at %s (%s)"
                      % (info["root"], e.strerror or e), "connect as root: fleetpatch works on the container's "
                      "files through /proc/PID/root")
    return info


def attach(req):
    """The request with its container resolved: `_container` (describe()), the restart
    settings carrying it too, and a package_dir (as the container sees it) made a path
    from the host."""
    if not req.get("container") or req.get("op") not in CONTAINER_OPS:
        return req
    info = resolve(req)
    req = dict(req, _container=info)
    if req.get("restart"):
        req["restart"] = dict(req["restart"], _container=info, _log=req.get("log"))
    # every container path is resolved in the container's root (inroot): an absolute
    # symlink in the image must not lead the agent, as root, into the host's own files
    if req.get("package_dir"):
        req["package_dir"] = inroot.host_path(info["root"], req["package_dir"])
    if req.get("log") and req["log"].startswith("/"):   # kind command: a log file inside the container
        req["log"] = inroot.host_path(info["root"], req["log"], follow_last=False)
    return req


# ------------------------------------------------------------------ the package

def site_dirs(root, python):
    """The container's site directories that exist, as paths inside the container."""
    patterns = list(SITE_DIRS)
    if python and python.startswith("/"):   # a venv in the image: its own site-packages first
        prefix = os.path.dirname(os.path.dirname(python))
        patterns.insert(0, prefix + "/lib/python3*/site-packages")
    found = []
    for pattern in patterns:
        for inside in sorted(inroot.glob(root, pattern), reverse=True):
            if os.path.isdir(root + inside) and inside not in found:
                found.append(inside)
    return found


def editable_targets(root, site, package):
    """Where the container site dir `site`'s editable installs put `package` (container
    paths): the __editable__ finders' MAPPING, then the path lines of .pth files."""
    try:
        names = sorted(os.listdir(inroot.host_path(root, site)))
    except (OSError, AgentError):
        return []
    out = []
    for n in names:
        if not (n.startswith("__editable__") and n.endswith("_finder.py")) and not n.endswith(".pth"):
            continue
        try:
            text = inroot.read(root, site + "/" + n).decode("utf-8", "replace")
        except (OSError, AgentError):
            continue
        if n.endswith(".pth"):
            out.extend(l.strip() for l in text.splitlines() if l.strip().startswith("/"))
            continue
        import ast   # here, not at the top: only a container's editable install needs it (1 ms at every start)

        try:
            m = re.search(FINDER_MAPPING, text, re.M | re.S)
            mapping = ast.literal_eval(m.group(1)) if m else {}
        except (ValueError, SyntaxError):
            continue
        if isinstance(mapping, dict) and isinstance(mapping.get(package), str):
            out.append(os.path.dirname(mapping[package].rstrip("/")))
    return out


def package_site(req, package):
    """(site dir, directory holding the package), both container paths, or None: the first
    site directory of the container's python that has the package, itself or by an editable
    install. That interpreter reads that site dir's .pth files at start (the probe goes there)."""
    root = req["_container"]["root"]
    for site in site_dirs(root, (req.get("container") or {}).get("python")):
        for parent in [site] + editable_targets(root, site, package):
            if inroot.is_file(root, "%s/%s/__init__.py" % (parent, package)):
                return site, inroot.resolve(root, parent)
    return None


def locate_package(req, package):
    """(host path, container path, version) of the directory holding the engine package."""
    info = req["_container"]
    root = info["root"]
    python = (req.get("container") or {}).get("python")
    found = package_site(req, package)
    if found:
        site, parent = found
        return (inroot.host_path(root, parent), parent,
                dist_info_version(root + site, package, read=lambda path: inroot.read(root, path[len(root):])))
    raise AgentError("error", "container %s (%s): %s is not installed where its python (%s) finds it (%s)%s; is "
                     "engine.container the engine's container?" % (info["name"], info["runtime"], package,
                                                                   python, ", ".join(site_dirs(root, python))
                                                                   or "no site directory", dangling(root, python,
                                                                                                    package)))


def dangling(root, python, package):
    """What the message adds when an editable install names a folder that, resolved inside the
    container, is not there (an absolute symlink of the image leading to a path of the host's)."""
    for site in site_dirs(root, python):
        for target in editable_targets(root, site, package):
            try:
                inside = inroot.resolve(root, target)
            except (AgentError, OSError):
                continue
            if inside != target:
                return ("; the editable install in %s names %s, which the container resolves to %s, where it is "
                        "not: fleetpatch reads and writes only what the container reaches" % (site, target, inside))
    return ""


# ------------------------------------------------------------------ ledger: the container's id

def note(info):
    return {"name": info["name"], "id": info["id"], "created": info["created"], "started_at": info["started_at"]}


def patch_lost(ledger, info):
    """The container was re-created since fleetpatch wrote into it: another id, the image's files."""
    rec = ledger.get("container") or {}
    if not rec.get("id") or rec["id"] == info["id"] or not ledger.get("patches"):
        return None
    return {"old_id": rec["id"], "new_id": info["id"], "created": info["created"], "name": info["name"],
            "patches": sorted(e.get("label", n) for n, e in ledger["patches"].items())}


def rebase(ledger, info):
    """Before fleetpatch writes into a re-created container: what the ledger recorded for
    the old one is gone with it (kept under `lost`), and the new container is recorded."""
    lost = patch_lost(ledger, info)
    if lost:
        lost["at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        ledger["lost"] = lost
        ledger["patches"] = {}
        ledger["last_restart"] = None
        ledger["restart_pending"] = False
    ledger["container"] = note(info)
    return lost


# ------------------------------------------------------------------ restart

def restart_container(restart):
    """`stop -t stop_grace`, note the time, `start`: the window of the log begins between
    the old process's end and the new one's start. (The container's StartedAt is set
    after its process runs, so lines printed at once could precede it.) Over the daemon's
    socket where the CLI would go there (runtime_api), else the CLI. One `restart` call
    instead of stop and start was measured no faster (the same work in the daemon: 0.72-0.82 s
    against 0.77-0.79 s on a quiet machine) and leaves no moment between the two for the window."""
    info = restart["_container"]
    name, runtime = info["name"], info["runtime"]
    grace = int(-(-float(restart.get("stop_grace", 10)) // 1))
    stopping = time.monotonic()
    failed = api_action(restart, "stop", "?t=%d" % grace, grace + 120)
    if failed is False:
        rc, out = run_tool([runtime, "stop", "-t", str(grace), "--", name], timeout=grace + 120)
        failed = None if rc == 0 else "exit %s: %s" % (rc, out.strip() or "no output")
    if failed:
        raise AgentError("restart-failed", "`%s stop -t %d %s` failed (%s)" % (runtime, grace, name, failed))
    stop_s = round(time.monotonic() - stopping, 4)   # the rest of the restart is the start and its inspect
    since = time.time()
    failed = api_action(restart, "start", "", 120)
    if failed is False:
        rc, out = run_tool([runtime, "start", "--", name], timeout=120)
        failed = None if rc == 0 else "exit %s: %s" % (rc, out.strip() or "no output")
    if failed:
        raise AgentError("restart-failed", "`%s start %s` failed (%s); `%s logs %s` says why"
                         % (runtime, name, failed, runtime, name))
    now = describe(inspect(name, runtime), name, runtime)
    if now["running"]:
        past_runtime_init(now["pid"])
    window = dict(note(now), since=since, runtime=runtime)
    return {"container": window, "stop_s": stop_s}, {"inode": None, "offset": 0}, now["pid"] if now["running"] else None


OCI_RUNTIMES = ("runc", "crun", "youki", "runsc")   # what a container's main process runs before its exec
RUNTIME_INIT_WAIT_S = 5.0


def past_runtime_init(pid, within=RUNTIME_INIT_WAIT_S):
    """Wait until the container's main process has left the OCI runtime for the container's
    command. `start` returns once the runtime has told its init to exec, and the process (the pid
    inspect names) can still be `runc init` a moment later, more so on a busy host: what the
    follow reads of it (how it was launched, its API key) must be the server's. True once it is
    (or it is gone); False if it still runs the runtime after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        argv = proc_argv(pid)
        if argv is None:   # unreadable, or empty: it ended, or is between exec and its new memory
            if not pid_alive(pid):
                return True
        elif os.path.basename(argv[0]) not in OCI_RUNTIMES:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def container_pid(restart):
    info = restart.get("_container") or {}
    return info.get("pid")


# ------------------------------------------------------------------ restart.kind command: `exec -d` in the container

# $1 the pidfile, $2 the log (both inside the container), then the server's argv
EXEC_SCRIPT = 'echo $$ > "$1" && log="$2" && shift 2 && exec "$@" >> "$log" 2>&1'


def host_pid(info, inner):
    """The host's pid of the process that is `inner` in the container's pid namespace."""
    try:
        ns = os.readlink("/proc/%d/ns/pid" % info["pid"])
    except (OSError, TypeError):
        return None
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                nspid = [l.split()[1:] for l in f if l.startswith("NSpid:")]
            if nspid and nspid[0][-1] == str(inner) and os.readlink("/proc/%s/ns/pid" % name) == ns:
                return int(name)
        except (IOError, OSError, IndexError):
            continue
    return None


def command_pid(restart):
    """The server started in the container, by its pidfile there (a pid of the container's)."""
    info = restart["_container"]
    inner = read_pid(inroot.host_path(info["root"], restart["pidfile"])) if restart.get("pidfile") else None
    return host_pid(info, inner) if inner else None


def stop_command(restart, meanwhile=None):
    """Stop the server started in the container: TERM, KILL after stop_grace. `meanwhile()` runs
    once the TERM is sent (at once where nothing runs), while the server drains and exits."""
    meanwhile = meanwhile or (lambda: None)
    pid = command_pid(restart)
    extra = {"stopped": None}
    if not pid_alive(pid):
        meanwhile()
    else:
        why = pidfile_mismatch(pid, restart.get("argv"), restart["_container"]["root"] + restart["pidfile"])
        if why:
            refuse_to_signal(restart["pidfile"] + " (in the container)", pid, why)
        start = getattr(proc_stat(pid), "start", None)   # None: it ended just now, nothing to signal
        signal_if_same(pid, start, signal.SIGTERM)
        meanwhile()
        extra = {"stopped": pid, "signal": "TERM"}
        if not wait_pid_gone(pid, float(restart.get("stop_grace", 10))):
            signal_if_same(pid, start, signal.SIGKILL)
            wait_pid_gone(pid, 5)
            extra["signal"] = "KILL"
    return extra


def restart_command(restart, log, meanwhile=None):
    """Stop the server started in the container (TERM, KILL after stop_grace; `meanwhile()` while
    it drains), note where its log (a file in the container, read from the host) ends, start it
    again with `exec -d`."""
    info = restart["_container"]
    extra = stop_command(restart, meanwhile)
    pos = log_position(log)
    pidfile = inroot.host_path(info["root"], restart["pidfile"], follow_last=False)
    if os.path.lexists(pidfile):
        os.unlink(pidfile)
    argv = [info["runtime"], "exec", "-d"]
    for k, v in sorted((restart.get("env") or {}).items()):
        argv += ["-e", "%s=%s" % (k, v)]
    if restart.get("workdir"):
        argv += ["-w", restart["workdir"]]
    argv += ["--", info["id"], "sh", "-c", EXEC_SCRIPT, "sh", restart["pidfile"], restart["_log"]] + restart["argv"]
    rc, out = run_tool(argv, timeout=120)
    if rc != 0:
        raise AgentError("restart-failed", "`%s exec -d %s ...` failed (exit %s): %s"
                         % (info["runtime"], info["name"], rc, out.strip() or "no output"))
    deadline = time.monotonic() + 10
    while read_pid(inroot.host_path(info["root"], restart["pidfile"])) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if pos["inode"] is None:
        pos = {"inode": log_position(log)["inode"], "offset": 0}
    return extra, pos, command_pid(restart)


def log_position(log):
    try:
        st = os.lstat(log)
        return {"inode": st.st_ino, "offset": st.st_size}
    except OSError:
        return {"inode": None, "offset": 0}


# ------------------------------------------------------------------ the log

def logs_argv(runtime, name, since, follow=True):
    argv = [runtime, "logs", "--timestamps", "--since", "%.9f" % since]
    if follow:
        argv.append("--follow")
    return argv + ["--", name]


class ContainerLogFollower(object):
    """The container's output since `since`: the daemon's log stream (runtime_api.LogStream)
    where the API is the way in, else `<runtime> logs --follow --timestamps` (stdout and
    stderr, as the runtime keeps them); each line without the runtime's timestamp. A line
    without one is the runtime's own message (an error)."""

    more = False
    ended = False   # the CLI's pipe at its end: no more output to wait for
    BUDGET = 4 << 20

    def __init__(self, runtime, name, since, tty=False):
        self.argv = logs_argv(runtime, name, since)
        self.label = "container %s" % name
        self.path = self.label
        self.line_no = 1
        self.partial = b""
        self.said = []
        self.proc = self.stream = None
        sock = api_socket(runtime)
        if sock:
            try:
                self.stream = LogStream(sock, name, since, tty)
            except (OSError, ValueError) as e:
                raise AgentError("error", "cannot read the container's output from the daemon at %s: %s"
                                 % (sock, getattr(e, "strerror", None) or e or type(e).__name__))
            if self.stream.error is not None:
                raise AgentError("error", "the daemon refused the container's output (HTTP %s): %s"
                                 % (self.stream.status, self.stream.error))
            return
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, close_fds=True)
        except OSError as e:
            raise AgentError("error", "cannot read the container's output: %s: %s" % (runtime, e))
        os.set_blocking(self.proc.stdout.fileno(), False)

    def wake_fd(self):
        """The descriptor that is readable when output arrives (the follow selects on it); None
        once the stream has ended (a closed stream or pipe is always readable)."""
        if self.stream is not None:
            return None if self.stream.closed else self.stream.fileno()
        return None if self.ended or self.proc.stdout.closed else self.proc.stdout.fileno()

    def _available(self):
        chunks, size = [], 0
        while size < self.BUDGET:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                self.ended = True
                break
            chunks.append(chunk)
            size += len(chunk)
        self.more = size >= self.BUDGET
        return b"".join(chunks)

    def read(self):
        if self.stream is not None:
            data, self.more, exited = self.stream.read(self.BUDGET)
            data = self.partial + data
        else:
            exited = self.proc.poll() is not None
            data = self.partial + self._available()
        raw = data.split(b"\n")
        self.partial = b"" if exited else raw.pop()
        lines = []
        for item in raw:
            text = item.decode("utf-8", "replace").rstrip("\r")
            m = re.match(TIMESTAMP, text)
            if m:
                lines.append(text[m.end():])
            elif text.strip():
                self.said.append(text.strip())
        batches = [(self.label, self.line_no, lines)] if lines else []
        self.line_no += len(lines)
        if exited and self.proc is not None and self.proc.returncode not in (0, None) and not batches:
            raise AgentError("error", "`%s` exited %s: %s" % (" ".join(self.argv), self.proc.returncode,
                                                            "; ".join(self.said[-3:]) or "no output"))
        return batches

    def close(self):
        if self.stream is not None:
            self.stream.close()
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def uses_container_log(req):
    return bool(req.get("container")) and req.get("log") == "container"


def open_container_log(req, ledger, since=None):
    """The follower of the container's output: from `since`, else from fleetpatch's last
    restart of this same container (a window of another container is none: from now)."""
    info = req.get("_container") or {}
    name, runtime = spec_of(req)
    if since is None:
        window = (ledger.get("last_restart") or {}).get("container") or {}
        since = window.get("since") if window.get("id") == info.get("id") else None
        if since is None:
            since = time.time()
    return ContainerLogFollower(runtime, info.get("id") or name, since, bool(info.get("tty")))
