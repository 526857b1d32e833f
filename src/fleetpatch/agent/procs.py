"""Processes on the host: is a pid alive, wait for it to end, how it was launched,
run a service manager's tool. Linux /proc where it helps; stdlib only."""
import collections
import errno
import os
import select
import subprocess
import time

from .base import AgentError, read_bytes, expand, redact


# the kernel's PF_EXITING (include/linux/sched.h): the task is in do_exit
PF_EXITING = 0x4


class ProcStat(collections.namedtuple("ProcStat", "comm state ppid pgrp session start flags")):
    """/proc/<pid>/stat as far as fleetpatch reads it: the command name (comm), the state ("R",
    "S", "Z", ...), the parent, the process group, the session, the start time in clock ticks
    since boot (field 22), which a reused pid does not share, and the kernel's flags (field 9)."""
    __slots__ = ()

    @property
    def exiting(self):
        """On its way out (a crash, a kill): once its memory is let go its command line and
        environment read empty, though it is not a zombie yet, and no signal can stop its exit."""
        return bool(self.flags & PF_EXITING)


def parse_proc_stat(data):
    """A ProcStat of the bytes of a /proc/<pid>/stat; None when they are not one. The command
    name is any 15 bytes, ")", " (" and blanks included: it ends at the LAST ")"."""
    head, sep, rest = data.partition(b"(")
    comm, sep2, rest = rest.rpartition(b")")
    fields = rest.split()
    if not sep or not sep2 or len(fields) < 20:
        return None
    try:
        return ProcStat(comm.decode("utf-8", "replace"), fields[0].decode("ascii", "replace"),
                        int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), int(fields[6]))
    except ValueError:
        return None


def proc_stat(pid):
    """The ProcStat of `pid` ("self": this process) from /proc; None when it is gone (or no /proc)."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            return parse_proc_stat(f.read())
    except (IOError, OSError):
        return None


def own_start():
    """This process's start time in clock ticks since boot (a reused pid does not share it)."""
    stat = proc_stat("self")
    return stat.start if stat else None


def own_age():
    """Seconds since this process started (clock-tick resolution), for the timings a reply carries."""
    start = own_start()
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return round(uptime - float(start) / os.sysconf("SC_CLK_TCK"), 3) if start is not None else None
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
    stat = proc_stat(pid)
    return stat is None or stat.state not in ("Z", "X")


class PidWatch(object):
    """Whether one process is alive, asked again and again (a follow asks at each of its wakes):
    a pidfd (Linux 5.3, Python 3.9), readable once the process has ended (a zombie counts), answers
    with one select instead of a kill and a read of /proc, and a reused pid cannot fool it. Where
    there is none (or the process was gone when asked first) pid_alive answers, as before."""

    def __init__(self, pid):
        self.pid = pid
        self.fd = None
        self.ended = False
        try:
            self.fd = os.pidfd_open(pid) if pid else None
        except (AttributeError, OSError):
            pass

    def alive(self):
        if self.ended:
            return False
        if self.fd is None:
            return pid_alive(self.pid)
        if select.select([self.fd], [], [], 0)[0]:
            self.ended = True   # an ended process does not come back: no more asking
            return False
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


def proc_argv(pid):
    """The command line of `pid`, from /proc; None when it cannot be read (or is empty: a kernel thread)."""
    try:
        raw = read_bytes("/proc/%d/cmdline" % pid)
    except (IOError, OSError):
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a != b""] or None


def proc_launch(pid, env_prefixes=()):
    """argv and the engine-relevant environment of the running server, from /proc, as the laptop
    gets them: the value of a secret flag or variable (`--api-key`, VLLM_API_KEY) never leaves the host."""
    argv = proc_argv(pid)
    out = {"argv": redact.argv(argv) if argv else argv, "env": None}
    try:
        raw = read_bytes("/proc/%d/environ" % pid)
    except (IOError, OSError):
        return out
    pairs = []
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            pairs.append((key.decode("utf-8", "replace"), value.decode("utf-8", "replace")))
    out["env"] = engine_env(pairs, env_prefixes)
    return out


def engine_env(pairs, env_prefixes):
    """The variables that route the engine (and fleetpatch's own), secrets redacted: the rest of
    a process environment may hold secrets and never leaves the host."""
    return redact.data(dict((k, v) for k, v in pairs if k.startswith(tuple(env_prefixes) + ("FLEETPATCH_",))))


def session_env(env_prefixes):
    """What a `command` restart's server inherits from this agent's SSH session (a host's
    /etc/environment, sshd's SetEnv; hosts.yaml's env goes over it: restart.start_command_server),
    as the laptop needs it to predict that launch."""
    return engine_env(os.environ.items(), env_prefixes)


# how far apart the kernel's clock of a process start and the pidfile's mtime may be for the same
# moment: /proc/stat's btime is in whole seconds and follows steps of the wall clock
PID_CLOCK_SLACK_S = 2.0


def boot_epoch():
    """When this machine booted, in seconds since the epoch (/proc/stat's btime); None without it."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except (IOError, OSError, ValueError, IndexError):
        pass
    return None


def started_epoch(stat):
    """When the process of `stat` (a ProcStat) began, in seconds since the epoch; None if unknown."""
    boot = boot_epoch()
    if boot is None:
        return None
    return boot + stat.start / float(os.sysconf("SC_CLK_TCK"))


def began_after(stat, written):
    """Did the process of `stat` (a ProcStat) begin after `written` (seconds since the epoch: when
    its pidfile was written)? Then it is not the process that wrote it, whose pid it took. False
    where either time is unknown."""
    began = started_epoch(stat)
    return written is not None and began is not None and began > written + PID_CLOCK_SLACK_S


def what_runs(argv):
    """What a command line runs, leaving out the flags an operator changes between restarts: for
    an interpreter, the module (`-m X`) or the script it is given; else nothing more."""
    rest = list(argv[1:])
    for i, word in enumerate(rest):
        if word == "-m" and i + 1 < len(rest):
            return "-m " + rest[i + 1]
        if word.startswith("-m") and len(word) > 2:
            return "-m " + word[2:]
        if not word.startswith("-"):
            return os.path.basename(word) if word.endswith(".py") else None
    return None


def same_program(pid, running, argv):
    """Does `running` (the command line of `pid`) run the server that `argv` starts? For an
    interpreter, the same module (`-m X`) or script, whichever interpreter runs it (the operator
    may have moved the venv); else the same program, by name or (another spelling of it, as
    "python3" for "/opt/venv/bin/python3") by the file it runs. Its flags may differ: an operator
    who changes `start` (a new flag) restarts the server that the old one started."""
    if not running or not argv:
        return False
    wanted = what_runs(argv)
    if wanted is not None:
        return what_runs(running) == wanted
    if os.path.basename(running[0]) == os.path.basename(argv[0]):
        return True
    import shutil
    found = shutil.which(argv[0])
    try:
        return found is not None and os.path.realpath(found) == os.path.realpath("/proc/%d/exe" % pid)
    except OSError:
        return False


def pidfile_mismatch(pid, argv, pidfile):
    """Why the live process `pid`, named by `pidfile`, is not the server that `argv` starts; None
    when it may be. It is not when it began after the pidfile was written (the server ended and
    its pid went to another process), or when it runs another program."""
    stat = proc_stat(pid)
    if stat is None:
        return "its /proc/%d cannot be read" % pid
    try:
        written = os.stat(pidfile).st_mtime
    except OSError:
        written = None
    return stat_mismatch(stat, written, proc_argv(pid), argv, pid)


def stat_mismatch(stat, written, running, argv, pid):
    """pidfile_mismatch of what /proc said: the process's ProcStat, when its pidfile was
    `written`, its command line `running`, against server.restart.start's `argv`."""
    if began_after(stat, written):
        when = lambda t: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
        return ("it started at %s, after the pidfile was written (%s): the server that wrote it ended and its pid "
                "went to another process" % (when(started_epoch(stat)), when(written)))
    if stat.exiting:
        # the server dying (it crashed a moment ago): its command line is already gone, it began
        # before the pidfile was written, and a signal cannot hurt what is exiting; the stop waits it out
        return None
    if not same_program(pid, running, argv):
        return "its command line `%s` runs another program than server.restart.start `%s`" % (
            " ".join(redact.argv(running or ["(none)"]))[:300], " ".join(redact.argv(argv or []))[:300])
    return None


def refuse_to_signal(pidfile, pid, why):
    """The one-line refusal to stop a pidfile's process that is not the server: nothing was signalled."""
    raise AgentError("restart-failed", "%s names pid %d, which is not the server: %s. fleetpatch signalled "
                                       "nothing; if the server is not running, remove %s, else stop it yourself "
                                       "(or make server.restart.start run its program), then rerun"
                     % (pidfile, pid, why, pidfile))


def signal_if_same(pid, start, sig):
    """Send `sig` to `pid` unless its start time is no longer `start` (it ended, its pid reused);
    True when sent."""
    stat = proc_stat(pid)
    if stat is None or stat.start != start:
        return False
    try:
        os.kill(pid, sig)
    except OSError:
        return False
    return True


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
