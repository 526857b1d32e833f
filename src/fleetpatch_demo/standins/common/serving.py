"""The serving phase of a stand-in server and the signals that end it.

* ``Stop``, ``raise_stop``, ``stop_on_signals``: SIGINT (and SIGTERM until the engine
  installs its own graceful handler) raise ``Stop``, which main catches to exit 0.
* ``serve_until_stopped``: the loop a server runs once ready; the engine says what a
  fatal exit, a finished drain and a scheduled death are.

Stdlib only; Python 3.8+.
"""
import signal
import time

TICK_SECONDS = 0.05


class Stop(BaseException):
    """Raised by a stop signal's handler: the server stops at once (exit 0)."""


def raise_stop(signum, frame):
    """A signal handler that stops the server at once."""
    raise Stop()


def stop_on_signals():
    """SIGTERM and SIGINT stop the server at once (raise Stop)."""
    signal.signal(signal.SIGTERM, raise_stop)
    signal.signal(signal.SIGINT, raise_stop)


def serve_until_stopped(fatal, terminating, drained, poll, exit_after, on_deadline):
    """The serving phase: returns the exit code. Every TICK_SECONDS:

    * ``fatal()`` (an exit code or None): a code ends it (the scheduler died);
    * once ``terminating()`` (a graceful SIGTERM arrived), ``drained()`` runs every `poll`
      seconds, the first `poll` seconds after; True ends it with 0 (it logs what it saw);
    * `exit_after` seconds after the start (None: never), ``on_deadline()`` gives the code."""
    deadline = None if exit_after is None else time.time() + exit_after
    next_check = None
    while True:
        time.sleep(TICK_SECONDS)
        code = fatal()
        if code is not None:
            return code
        if terminating():
            now = time.time()
            if next_check is None:
                next_check = now + poll
            if now >= next_check:
                if drained():
                    return 0
                next_check = now + poll
        if deadline is not None and time.time() >= deadline:
            return on_deadline()
