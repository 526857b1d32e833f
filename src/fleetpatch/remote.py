"""The one seam to SSH: a Fabric Connection per host, host keys enforced.

Everything fleetpatch does on a host is a request to `hostagent` run by the
host's engine interpreter; this module opens the connection once, sends
requests, streams replies and counts the round trips. Nothing here decides.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import threading
import zlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import paramiko
from fabric import Connection

from . import hostagent
from .errors import HostFailure
from .inventory import Host

# Sent with every request, compressed: the host needs nothing installed.
AGENT_SOURCE = zlib.compress(Path(hostagent.__file__).read_bytes(), 9)

# The host's interpreter compiles the agent it is sent; `python -c` plus a
# length-prefixed source on stdin keeps every inventory value out of the
# shell line (only the quoted interpreter path is in it).
BOOTSTRAP = (
    "import sys,zlib;b=sys.stdin.buffer;"
    "exec(compile(zlib.decompress(b.read(int(b.readline()))),'fleetpatch-agent','exec'),"
    "{'__name__':'__fleetpatch_agent__'})"
)

SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "~/.ssh/known_hosts")


class _RecordNewHostKey(paramiko.MissingHostKeyPolicy):
    """--accept-new-host-keys: trust on first use and record the key. A
    *changed* key never reaches a policy: paramiko raises BadHostKeyException."""

    def __init__(self, save_to: Path):
        self.save_to = save_to
        self.lock = threading.Lock()

    def missing_host_key(self, client, hostname, key):
        with self.lock:
            self.save_to.parent.mkdir(parents=True, exist_ok=True)
            with open(self.save_to, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def _known_hosts_files(host: Host) -> list[Path]:
    files = [Path(os.path.expanduser(p)) for p in SYSTEM_KNOWN_HOSTS]
    if host.known_hosts:
        files.append(Path(os.path.expanduser(host.known_hosts)))
    return files


def _harden(conn: Connection, host: Host, accept_new: bool) -> None:
    """Fabric defaults every Connection (gateways too) to AutoAddPolicy."""
    hop = conn
    while isinstance(hop, Connection):
        client = hop.client
        for path in _known_hosts_files(host):
            if path.is_file():
                client.get_host_keys().load(str(path))
        if accept_new:
            target = Path(os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts"))
            client.set_missing_host_key_policy(_RecordNewHostKey(target))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        hop = hop.gateway


def _connect_kwargs(host: Host) -> dict:
    kw: dict = {}
    if host.identity_file:
        kw["key_filename"] = [os.path.expanduser(host.identity_file)]
    return kw


def connection_for(host: Host, hosts_by_name: dict[str, Host] | None = None,
                   accept_new_host_keys: bool = False) -> Connection:
    """A Fabric Connection; ~/.ssh/config (aliases, User, Port, IdentityFile,
    ProxyJump) and the ssh-agent are honoured, inventory values win."""
    gateway = None
    jump = host.jump
    if jump is not None:
        via = (hosts_by_name or {}).get(jump.host) if jump.host else None
        gateway = Connection(jump.address, user=jump.user or host.user, port=jump.port,
                             connect_timeout=host.connect_timeout,
                             connect_kwargs=_connect_kwargs(via or host))
    conn = Connection(
        host.address, user=host.user, port=host.port, gateway=gateway,
        connect_timeout=host.connect_timeout, connect_kwargs=_connect_kwargs(host),
    )
    _harden(conn, host, accept_new_host_keys)
    return conn


def classify_connect_error(host: Host, exc: BaseException) -> HostFailure:
    where = f"{host.name} ({host.target})"
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostFailure("host-key-rejected",
                           f"{where}: the host key CHANGED (got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}); "
                           "refusing to connect. If the host was really reinstalled, remove its old line from known_hosts.")
    if isinstance(exc, paramiko.AuthenticationException) or "No authentication methods" in str(exc):
        return HostFailure("auth-failed", f"{where}: authentication failed ({exc}); check user and identity_file "
                                          "in the inventory, or your ssh-agent")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return HostFailure("host-key-rejected",
                           f"{where}: unknown host key (not in any known_hosts file); verify the host's key and add it "
                           "to known_hosts, or rerun with --accept-new-host-keys to record it")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HostFailure("unreachable", f"{where}: connection timed out; check the address and that sshd runs")
    if isinstance(exc, (OSError, paramiko.ssh_exception.NoValidConnectionsError, EOFError)):
        return HostFailure("unreachable", f"{where}: cannot connect ({exc}); check the address and that sshd runs")
    if isinstance(exc, paramiko.SSHException):
        return HostFailure("unreachable", f"{where}: SSH failed ({exc})")
    return HostFailure("error", f"{where}: {type(exc).__name__}: {exc}")


@dataclass
class Remote:
    """One host, one SSH connection, for the whole command."""

    host: Host
    hosts_by_name: dict = field(default_factory=dict)
    accept_new_host_keys: bool = False
    round_trips: int = 0
    _conn: Connection | None = None

    def open(self) -> None:
        if self._conn is not None and self._conn.is_connected:
            return
        conn = connection_for(self.host, self.hosts_by_name, self.accept_new_host_keys)
        try:
            conn.open()
        except Exception as exc:  # paramiko raises a zoo; classify it once, here
            try:
                conn.close()
            except Exception:
                pass
            raise classify_connect_error(self.host, exc) from None
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the agent ----------------------------------------------------------

    def _command(self) -> str:
        return f"{shlex.quote(self.host.engine.python)} -c {shlex.quote(BOOTSTRAP)}"

    def _start(self, request: dict) -> paramiko.Channel:
        self.open()
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostFailure("unreachable", f"{self.host.name}: the SSH connection dropped")
        chan = transport.open_session()
        chan.exec_command(self._command())
        self.round_trips += 1
        payload = (str(len(AGENT_SOURCE)).encode() + b"\n" + AGENT_SOURCE
                   + json.dumps(request).encode() + b"\n")
        chan.sendall(payload)
        return chan

    def call(self, op: str, request: dict, timeout: float = 300) -> dict:
        """Run one agent operation and return its result, or raise HostFailure."""
        chan = self._start(dict(request, op=op))
        chan.shutdown_write()
        replies = list(self._replies(chan, timeout))
        return self._result(op, chan, replies)

    def stream(self, op: str, request: dict, on_event: Callable[[dict], str | None],
               timeout: float) -> dict:
        """Run a streaming operation. `on_event` gets every event and returns a
        line to send back (the laptop's decision) or None to keep listening."""
        chan = self._start(dict(request, op=op))
        replies = []
        sent = False
        for reply in self._replies(chan, timeout + 30):
            replies.append(reply)
            if reply.get("t") == "result":
                break
            if not sent:
                answer = on_event(reply)
                if answer is not None:
                    chan.sendall(answer.encode() + b"\n")
                    sent = True
        return self._result(op, chan, replies)

    def _replies(self, chan: paramiko.Channel, timeout: float) -> Iterator[dict]:
        deadline = time.monotonic() + timeout
        buf = b""
        self._stderr = b""
        chan.settimeout(0.5)
        while True:
            if chan.recv_stderr_ready():
                self._stderr += chan.recv_stderr(65536)
            try:
                chunk = chan.recv(65536)
            except socket.timeout:
                if time.monotonic() > deadline:
                    chan.close()
                    raise HostFailure("timeout", f"{self.host.name}: the host did not answer within {timeout:.0f}s")
                continue
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if text.startswith(hostagent.REPLY_PREFIX):
                    yield json.loads(text[len(hostagent.REPLY_PREFIX):])
        while chan.recv_stderr_ready():
            self._stderr += chan.recv_stderr(65536)

    def _result(self, op: str, chan: paramiko.Channel, replies: list[dict]) -> dict:
        status = chan.recv_exit_status()
        chan.close()
        final = next((r for r in reversed(replies) if r.get("t") == "result"), None)
        if final is None:
            err = self._stderr.decode("utf-8", "replace").strip()
            hint = ""
            if status == 127 or "No such file" in err or "not found" in err:
                hint = f"; is engine.python ({self.host.engine.python}) right for this host?"
            raise HostFailure("error", f"{self.host.name}: the host agent ({op}) exited {status} without an answer: "
                                       f"{err[-800:] or 'no output'}{hint}")
        if not final["ok"]:
            raise HostFailure(final.get("code", "error"), f"{self.host.name}: {final['message']}")
        result = final["result"]
        result["_events"] = [r for r in replies if r.get("t") != "result"]
        return result
