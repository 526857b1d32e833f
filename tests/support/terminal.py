"""The program as an operator runs it: on a terminal of a given size, or piped.

`program_env` is the environment a test gives the program: the caller's, less the
settings that would make the terminal's size or the inventory someone else's.
`on_a_terminal` runs a command on a pseudo-terminal of `columns` x `lines` and
returns its exit code and everything it wrote there (CRLF as the terminal sends it).
"""
from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios

SIZE_SETTINGS = ("COLUMNS", "LINES", "FLEETPATCH_INVENTORY")


def program_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SIZE_SETTINGS}
    return {**env, **extra}


def on_a_terminal(argv: list, cwd, columns: int | None = None, lines: int = 50, env: dict | None = None,
                  timeout: float = 120) -> tuple[int, str]:
    master, slave = pty.openpty()
    if columns is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    proc = subprocess.Popen(argv, cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
                            env=env if env is not None else program_env(TERM="xterm"))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: every writer of the terminal has gone
            break
        if not data:
            break
        chunks.append(data)
    code = proc.wait(timeout=timeout)
    os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")
