"""Restart the server: a command fleetpatch starts itself, a systemd unit, or a
supervisor program; note where its log ends so that only the new server's lines count."""
import os
import signal
import subprocess
import sys
import time

from .container import command_pid, container_pid, note, restart_command, restart_container, stop_command
from .base import AgentError, atomic_write, ensure_dir, expand, now_iso, open_log, protocol, read_bytes
from .package import find_spec
from .procs import (pid_alive, pidfile_mismatch, proc_stat, read_pid, refuse_to_signal, run_tool, signal_if_same,
                    wait_pid_gone)


def log_position(log):
    try:
        st = os.stat(expand(log))
        return {"inode": st.st_ino, "offset": st.st_size}
    except OSError:
        return {"inode": None, "offset": 0}


STARTED_BY = "FLEETPATCH_STATE_DIR"   # in the environment of every server fleetpatch starts


def started_value(restart):
    """STARTED_BY's value for this server: its state dir, and its name on a host with several
    servers (each finds only its own)."""
    value = os.path.abspath(expand(restart["state_dir"]))
    return value + "#" + restart["server"] if restart.get("server") else value


def started_mark(restart):
    """STARTED_BY=value as it stands in the environment of this server when fleetpatch started it."""
    return ("%s=%s" % (STARTED_BY, started_value(restart))).encode() if restart.get("state_dir") else None


def is_started_server(pid, mark, own_ns):
    """Is `pid` a live session leader with `mark` in its environment, in this mount namespace?"""
    stat = proc_stat(pid)
    if stat is None or stat.state in ("Z", "X") or stat.session != pid:
        return False
    try:
        # the same state dir path in another mount namespace is another host's (or container's)
        return mark in read_bytes("/proc/%d/environ" % pid).split(b"\0") and mount_ns(pid) == own_ns
    except (IOError, OSError):
        return False


def started_servers(restart):
    """Session leaders started by fleetpatch for this server, found by their environment:
    a pidfile lost with the run that wrote it (kill -9) must not leave an orphan server."""
    mark = started_mark(restart)
    if mark is None:
        return []
    own_ns = mount_ns(os.getpid())
    return [int(name) for name in os.listdir("/proc")
            if name.isdigit() and int(name) != os.getpid() and is_started_server(int(name), mark, own_ns)]


def mount_ns(pid):
    try:
        return os.stat("/proc/%d/ns/mnt" % pid).st_ino
    except OSError:
        return None


def pidfile_server(restart):
    """(pid, why): the pidfile's live process when it is the server, else (None, why it is not),
    (None, None) when it names no live process. The server is the process fleetpatch started
    (its mark in the environment: see started_servers); a pidfile of a server the operator
    started is believed while its process runs server.restart.start and began before the
    pidfile was written: after a crash its pid may belong to anything, and restarts run as root."""
    pid = read_pid(restart["pidfile"])
    if not pid_alive(pid):
        return None, None
    mark = started_mark(restart)
    if mark is not None and is_started_server(pid, mark, mount_ns(os.getpid())):
        return pid, None
    why = pidfile_mismatch(pid, restart.get("argv"), expand(restart["pidfile"]))
    return (pid, None) if why is None else (None, why)


def command_server_pid(restart):
    """The pidfile's server, else the one fleetpatch started whose pidfile was lost (else the
    pidfile's dead pid, or None)."""
    pid, why = pidfile_server(restart)
    if pid is not None:
        return pid
    found = started_servers(restart)
    return found[0] if found else (None if why else read_pid(restart["pidfile"]))


def stop_command_server(restart, meanwhile=None):
    """TERM the server, KILL it after stop_grace; a pidfile naming a process that is not the
    server is refused with why, nothing signalled. `meanwhile()` runs once the TERM is sent (or
    at once, where there is nothing to signal), while the server drains and exits."""
    meanwhile = meanwhile or (lambda: None)
    pid, why = pidfile_server(restart)
    if pid is None:
        found = started_servers(restart)
        if not found and why:
            refuse_to_signal(restart["pidfile"], read_pid(restart["pidfile"]), why)
        pid = found[0] if found else None
    stat = proc_stat(pid) if pid else None
    if stat is None:
        meanwhile()
        return {"stopped": None}
    signalled = signal_if_same(pid, stat.start, signal.SIGTERM)
    meanwhile()
    if not signalled:
        return {"stopped": pid}
    if wait_pid_gone(pid, float(restart.get("stop_grace", 10))):
        return {"stopped": pid, "signal": "TERM"}
    signal_if_same(pid, stat.start, signal.SIGKILL)   # not to a process that took its pid meanwhile
    wait_pid_gone(pid, 5)
    return {"stopped": pid, "signal": "KILL"}


def start_command_server(restart, log):
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("SSH_"))
    env.update(restart.get("env") or {})
    if restart.get("state_dir"):
        env[STARTED_BY] = started_value(restart)
    logpath = expand(log)
    ensure_dir(os.path.dirname(logpath) or ".", 0o755)
    out = os.fdopen(open_log(logpath, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")
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
    if kind == "command" and restart.get("_container"):
        return command_pid(restart)
    if kind == "command":
        return command_server_pid(restart)
    if kind == "systemd":
        rc, out = run_tool(systemd_show_argv(restart), timeout=60)
        return parse_main_pid(out) if rc == 0 else None
    if kind == "supervisor":
        _, out = run_tool(supervisor_argv(restart, "pid", supervisorctl_command()), timeout=60)
        return parse_supervisor_pid(out)
    if kind == "container":
        return container_pid(restart)
    return None


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


def stop_supervised(restart, ctl):
    """`supervisorctl stop PROGRAM`; a program that is not running is stopped already."""
    argv = supervisor_argv(restart, "stop", ctl)
    rc, out = run_tool(argv)
    if parse_supervisor_result(out, restart["program"]) not in ("stopped", "not running"):
        raise AgentError("restart-failed", "`%s` failed (exit %s): %s" % (" ".join(argv), rc, out.strip()
                                                                          or "no output"))


def restart_supervisor(restart, log):
    """supervisorctl stop, note where the program's log (its stdout_logfile) ends, start.
    A program that exits while starting is not an error here: the log since the offset
    shows why, and follow reports it as a server that exited."""
    program = restart["program"]
    ctl = supervisorctl_command()
    stop_supervised(restart, ctl)
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


def restart_settings(req):
    """The request's restart settings with what finds this server's processes: its state dir and name."""
    return dict(req["restart"], state_dir=req.get("state_dir"), server=req.get("server_name"))


def restart_server(req, ledger, reason, meanwhile=None):
    """Stop, note where the log ends, start. The offset is taken after the old
    server is gone, so nothing it wrote can count for the new one.

    `meanwhile()`: what must be done before the new server starts (the probe's install). Where
    the agent signals the server itself (a command server), it is done after the TERM, while the
    old server drains and exits: a drain is a wait with nothing to do (SGLang's watchdog looks
    every 5 s), and the work would otherwise lengthen the restart. Elsewhere it is done first."""
    restart = restart_settings(req)
    log = req["log"]
    kind = restart.get("kind", "command")
    result = {"kind": kind}
    if kind != "command" and meanwhile is not None:
        meanwhile()
    if kind == "command" and restart.get("_container"):   # a server started in a long-running container
        extra, pos, pid = restart_command(restart, log, meanwhile)
        result.update(extra)
    elif kind == "command":
        stopping = time.monotonic()
        result.update(stop_command_server(restart, meanwhile))
        result["stop_s"] = round(time.monotonic() - stopping, 4)   # the rest of a restart is the start
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
    elif kind == "container":
        extra, pos, pid = restart_container(restart)
        result.update(extra)
    else:
        raise AgentError("error", "unknown restart kind %r" % kind)
    ledger["last_restart"] = protocol.LastRestart(at=now_iso(), epoch=time.time(), log=log, inode=pos["inode"],
                                                  offset=pos["offset"], pid=pid, reason=reason)
    if result.get("journal"):
        ledger["last_restart"]["journal"] = result["journal"]
    if result.get("container"):
        ledger["last_restart"]["container"] = result["container"]
        ledger["container"] = note(result["container"])
    ledger["restart_pending"] = False
    result.update({"pid": pid, "inode": pos["inode"], "offset": pos["offset"]})
    return result


def stop_server(req, ledger):
    """Stop the server and leave it stopped, its restart pending: a multi-node server's ranks
    are all stopped before any is started again (the restart that follows starts it). A run
    that ends between the two leaves the pending restart for the next one to do."""
    restart = restart_settings(req)
    kind = restart.get("kind", "command")
    if kind == "command" and restart.get("_container"):
        result = stop_command(restart)
    elif kind == "command":
        result = stop_command_server(restart)
    elif kind == "systemd":
        argv = ["systemctl", "stop", "--", restart["unit"]]
        rc, out = run_tool(argv)
        if rc != 0:
            raise AgentError("restart-failed", "`%s` failed (exit %s): %s" % (" ".join(argv), rc, out.strip()))
        result = {"unit": restart["unit"]}
    elif kind == "supervisor":
        stop_supervised(restart, supervisorctl_command())
        result = {"program": restart["program"]}
    else:
        raise AgentError("error", "a server of restart kind %r is not stopped apart from its start" % kind)
    ledger["restart_pending"] = True
    result["kind"] = kind
    return result
