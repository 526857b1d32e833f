"""Output of a stand-in server: its stdout/stderr (which the launcher appends to one log
file), the log's rotation, and the FLEETPATCH_STANDIN_* variables that steer it.

Public: ``flush_streams``, ``line_buffer_streams``, ``rotate_log``, ``env_true``,
``env_float``. Stdlib only; Python 3.8+.
"""
import os
import sys


def flush_streams():
    """Flush stdout and stderr, whatever state they are in."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def line_buffer_streams():
    """stdout and stderr line-buffered: the launcher appends both to one file."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass


def rotate_log(path):
    """logrotate-style: move the file away (to ``path.1``) and continue in a fresh one,
    opened for append and put on fds 1 and 2."""
    flush_streams()
    try:
        os.replace(path, path + ".1")
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def env_true(name):
    """The variable reads as yes (1, true, yes, y, on)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "y", "on")


def env_float(name, default):
    """The variable as a float; `default` when unset, empty or not a number."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        return default
