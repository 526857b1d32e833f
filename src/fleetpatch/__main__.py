"""`python -m fleetpatch` and the `fleetpatch` console script."""
import sys


def entry() -> None:
    """The program, with a Ctrl-C while it still loads (its first half second) ending as any
    other interrupt does: one line, exit 130, no traceback; nothing has been done yet. SIGTERM
    interrupts as a Ctrl-C does (errors.Terminated)."""
    import signal
    from .errors import raise_terminated
    signal.signal(signal.SIGTERM, raise_terminated)
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
