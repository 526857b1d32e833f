"""Processes on the host: is a pid alive, wait for it to end, how it was launched,
run a service manager's tool. Linux /proc where it helps; stdlib only."""
import errno
import os
import select
import subprocess
import time

from .base import read_bytes, expand


def own_start():
    """This process's start time in clock ticks since boot (a reused pid does not share it)."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (IOError, OSError, ValueError, IndexError):
        return None


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


def started_interpreter(pid, root=""):
    """The interpreter the process was started with, as CPython itself finds its
    sys.executable and sys.prefix: argv[0] (a bare name looked up in the process's
    PATH, a relative one from its cwd) and the venv whose pyvenv.cfg sits next to it
    or one folder up. Never /proc/PID/exe: that is the binary behind a venv's
    python link, and engine.python set to it runs outside the venv. `root`: where
    the process's paths are on this host (a container's /proc/PID/root). {} when unknown."""
    try:
        argv0 = read_bytes("/proc/%d/cmdline" % pid).split(b"\0")[0].decode("utf-8", "surrogateescape")
    except (IOError, OSError):
        return {}
    if not argv0:
        return {}
    path = argv0
    if "/" not in argv0:
        path = _on_path(pid, argv0, root)
    elif not argv0.startswith("/"):
        try:
            path = os.path.normpath(os.path.join(os.readlink("/proc/%d/cwd" % pid), argv0))
        except OSError:
            pass
    out = {"argv0": argv0, "python": path}
    if path.startswith("/"):
        folder = os.path.dirname(path)
        for prefix in (folder, os.path.dirname(folder)):
            if os.path.isfile(root + os.path.join(prefix, "pyvenv.cfg")):
                out["venv"] = prefix
                break
    return out


def _on_path(pid, name, root):
    """`name` as the process's PATH finds it (the bare name when it cannot be read)."""
    try:
        env = read_bytes("/proc/%d/environ" % pid).split(b"\0")
    except (IOError, OSError):
        return name
    for item in env:
        if item.startswith(b"PATH="):
            for folder in item[5:].decode("utf-8", "surrogateescape").split(":"):
                candidate = os.path.join(folder or ".", name)
                if candidate.startswith("/") and os.access(root + candidate, os.X_OK):
                    return candidate
    return name


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
