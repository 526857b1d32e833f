"""A transport that runs the agent as a local subprocess: the host is this machine.

The same bootstrap, the same sources on stdin, the same one agent process
serving every request of a command and the same JSON lines as over SSH; only
the pipe differs. The host's `engine.python` is a local interpreter
and its paths are local paths, so a directory tree (a venv holding the real
SGLang files) is a host. That makes `steps` testable in seconds, without sshd.
The environment is this process's minus PYTHONPATH/PYTHONHOME, so the agent
finds only what the host's interpreter has, as on a real host.
"""
from __future__ import annotations

import os
import select
import subprocess
from typing import Optional

from .errors import HostFailure


class _LocalChannel:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._stderr = b""
        self._eof = False
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the agent is gone; what it said (or did not) tells why

    def shutdown_write(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def recv(self, wait: float) -> Optional[bytes]:
        if self._eof:
            return b""
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        readable, _, _ = select.select([out, err], [], [], wait)
        if err in readable:
            self._read_stderr()
        if out not in readable:
            return None
        chunk = os.read(out, 65536)
        if not chunk:
            self._eof = True
            self._read_stderr()
        return chunk

    def _read_stderr(self) -> None:
        while True:
            try:
                chunk = os.read(self.proc.stderr.fileno(), 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._stderr += chunk

    def stderr(self) -> bytes:
        self._read_stderr()
        return self._stderr

    def exit_status(self) -> int:
        return self.proc.wait()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LocalTransport:
    """Runs the agent as `argv` here, one process for all of a Remote's requests
    (as over SSH: one start per host per command); `name` is for messages."""

    def __init__(self, name: str = "localhost", env: dict | None = None):
        self.name = name
        base = dict(os.environ if env is None else env)
        for key in ("PYTHONPATH", "PYTHONHOME"):
            base.pop(key, None)
        self.env = base

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def start(self, argv: list[str]) -> _LocalChannel:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self.env, close_fds=True, start_new_session=True)
        except OSError as e:
            raise HostFailure("error", f"{self.name}: cannot run {argv[0]}: {e}; is engine.python right for "
                                       "this host?") from None
        return _LocalChannel(proc)
