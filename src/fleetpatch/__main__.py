"""`python -m fleetpatch` and the `fleetpatch` console script."""
import sys


def entry() -> None:
    """The program, with a Ctrl-C while it still loads (its first half second) ending as any
    other interrupt does: one line, exit 130, no traceback; nothing has been done yet. SIGTERM
    and SIGHUP interrupt as a Ctrl-C does (errors.Terminated)."""
    import signal
    from .errors import raise_terminated
    signal.signal(signal.SIGTERM, raise_terminated)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:   # under nohup it stays ignored
        signal.signal(signal.SIGHUP, on_hangup([fd for fd in (1, 2) if _isatty(fd)]))
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("fleetpatch: interrupted while starting; nothing was done", file=sys.stderr)
        sys.exit(130)
    try:
        main()
    except SystemExit as done:
        leave(done)
        raise


def on_hangup(terminal_fds: list):
    """The SIGHUP handler: the terminal the run printed to is gone, so what is still printed to
    it (the stop's lines, the summary) goes to /dev/null instead of failing; then the run stops
    as at SIGTERM: the hosts in flight finish or undo their step, the report is written, exit 130."""
    def hung_up(signum, frame):
        from .errors import Terminated
        from .outputgone import to_devnull
        to_devnull(*terminal_fds)
        raise Terminated("SIGHUP")
    return hung_up


def _isatty(fd: int) -> bool:
    import os
    try:
        return os.isatty(fd)
    except OSError:
        return False


def leave(done: SystemExit) -> None:
    """Exit at once once the command is over: its output flushed (main's last act), its report
    written, its connections closed, no thread of it left. The interpreter's own teardown of
    the ~600 modules a rollout loads took 40 ms on the bench machine, after the verdict (2 ms
    this way); it runs as usual while any other thread still lives, or for a message exit."""
    import os
    import threading
    code = 0 if done.code is None else done.code
    if not isinstance(code, int) or threading.active_count() > 1:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
