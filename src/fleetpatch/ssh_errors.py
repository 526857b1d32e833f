"""Why an SSH connection failed, in one line per host, and no library noise.

paramiko reports a port that speaks HTTP and a port that says nothing with the
same "Error reading SSH protocol banner", and logs a traceback to stderr for
each. Here the connection's socket is watched (`dial`), so `describe` can tell
the two apart from what the server really sent, and `silence_paramiko` keeps
paramiko's logger off the operator's terminal.

Pure of fleetpatch's hosts: `describe` takes the address, port and timeout
and returns a `HostFailure` with the status and the message.
"""
from __future__ import annotations

import base64
import errno
import hashlib
import logging
import socket
from dataclasses import dataclass

import paramiko

from .dialer import WatchedSocket, dial  # noqa: F401  (ssh_errors.dial is the API)
from .errors import HostFailure, Status
from .textsafe import safe_line

DEFAULT_BANNER_TIMEOUT = 10.0


def silence_paramiko() -> None:
    """paramiko logs "Exception (client): ..." and a traceback at ERROR level for
    every failed handshake; fleetpatch says the same thing in its one line."""
    log = logging.getLogger("paramiko")
    log.setLevel(logging.CRITICAL + 1)
    log.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as OpenSSH prints it (SHA256:base64, no padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _secs(t: float) -> str:
    return f"{t:g} s"


def _refused(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionRefusedError):
        return True
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return all(getattr(e, "errno", None) == errno.ECONNREFUSED for e in exc.errors.values())
    return False


@dataclass(frozen=True)
class Attempt:
    """One connection attempt as the messages name it. `where` names the host
    ("gpu-a01 (root@10.0.0.1:22)"); `tried` lists the authentication methods
    offered (e.g. ["publickey ~/.ssh/id_ed25519", "ssh-agent"])."""
    where: str
    address: str
    port: int
    banner_timeout: float
    connect_timeout: float | None = None
    user: str | None = None
    tried: list[str] | None = None


def describe(exc: BaseException, attempt: Attempt, sock: WatchedSocket | None = None) -> HostFailure:
    """The HostFailure for an exception raised while dialling or handshaking; `sock`
    is the socket from `dial` if it got that far."""
    where, address, port = attempt.where, attempt.address, attempt.port
    banner_timeout, connect_timeout = attempt.banner_timeout, attempt.connect_timeout
    user, tried = attempt.user, attempt.tried
    unreachable = Status.UNREACHABLE
    text = str(exc)
    if isinstance(exc, socket.gaierror):
        return HostFailure(unreachable, f"{where}: the name {address!r} does not resolve "
                                        f"({exc.strerror or exc}); check the address in the inventory")
    if _refused(exc):
        return HostFailure(unreachable, f"{where}: connection refused on port {port}: nothing listens there; "
                                        "check the port and that sshd runs")
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostFailure(Status.HOST_KEY_REJECTED,
                           f"{where}: the host key CHANGED: known_hosts has {exc.expected_key.get_name()} "
                           f"{fingerprint(exc.expected_key)}, the host offers {exc.key.get_name()} "
                           f"{fingerprint(exc.key)}; refusing to connect. If the host was really reinstalled, "
                           f"remove its old line: ssh-keygen -R {address if port == 22 else f'[{address}]:{port}'}")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in text:
        return HostFailure(Status.HOST_KEY_REJECTED,
                           f"{where}: unknown host key (not in any known_hosts file); check the host's key and add "
                           "it to known_hosts, or rerun with --accept-new-host-keys to record it")
    if isinstance(exc, paramiko.BadAuthenticationType):
        return HostFailure(Status.AUTH_FAILED, _auth_message(where, user, tried, exc.allowed_types))
    if isinstance(exc, paramiko.AuthenticationException) or "No authentication methods" in text:
        return HostFailure(Status.AUTH_FAILED, _auth_message(where, user, tried, None))
    if isinstance(exc, paramiko.SSHException) and text == "No existing session":
        # paramiko's wait for the handshake ended at the connect timeout (the same length as
        # the banner's, so either may end first) and it went on to log in on a dead transport
        if sock is None:   # through a jump host: Fabric's socket, which we cannot watch
            return HostFailure(unreachable, f"{where}: the SSH handshake did not finish within "
                                            f"{_secs(banner_timeout)}; check that sshd there runs and is healthy")
        if not sock.received:
            return _no_banner(exc, where=where, port=port, banner_timeout=banner_timeout, sock=sock)
        if sock.received.startswith(b"SSH-"):
            version = safe_line(sock.received.splitlines()[0].decode("latin-1"))
            return HostFailure(unreachable, f"{where}: port {port} sent the SSH banner {version!r}, then the key "
                                            f"exchange did not finish within {_secs(banner_timeout)}; check that "
                                            "sshd there is healthy (not overloaded or stopped)")
    banner = "protocol banner" in text or "Indecipherable protocol version" in text
    spoke_other = sock is not None and sock.received and not sock.received.startswith(b"SSH-")
    if banner or spoke_other or (isinstance(exc, EOFError) and sock is not None):
        return _no_banner(exc, where=where, port=port, banner_timeout=banner_timeout, sock=sock)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        after = f" within {_secs(connect_timeout)}" if connect_timeout else ""
        return HostFailure(unreachable, f"{where}: no answer from {address}:{port}{after} (connect timed out); "
                                        "check the address, the port and any firewall")
    if isinstance(exc, OSError):
        return HostFailure(unreachable, f"{where}: cannot connect to {address}:{port}: "
                                        f"{exc.strerror or exc}; check the address and that sshd runs")
    if isinstance(exc, (EOFError, paramiko.SSHException)):
        return HostFailure(unreachable, f"{where}: the SSH handshake failed: {safe_line(text) or type(exc).__name__}")
    return HostFailure(Status.ERROR, f"{where}: {type(exc).__name__}: {safe_line(text)}")


def _no_banner(exc: BaseException, *, where: str, port: int, banner_timeout: float,
               sock: WatchedSocket | None) -> HostFailure:
    """paramiko says "Error reading SSH protocol banner" for all of these; the
    socket knows whether the server spoke, and the exception's context whether
    it timed out or hung up."""
    check = "check the port and that sshd runs there"
    if sock is not None and sock.received:
        shown = safe_line(sock.received.decode("latin-1"))
        return HostFailure(Status.UNREACHABLE, f"{where}: not an SSH server: no SSH banner within "
                                               f"{_secs(banner_timeout)} on port {port} (it sent {shown!r}); {check}")
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, EOFError) or isinstance(exc, EOFError) or isinstance(cause, ConnectionResetError):
        return HostFailure(Status.UNREACHABLE, f"{where}: port {port} closed the connection without an SSH "
                                               f"banner; {check}")
    if sock is not None or isinstance(cause, (socket.timeout, TimeoutError)):
        return HostFailure(Status.UNREACHABLE, f"{where}: timed out after {_secs(banner_timeout)} waiting for the "
                                               f"SSH banner: port {port} accepts connections and stays silent; {check}")
    return HostFailure(Status.UNREACHABLE, f"{where}: no SSH banner within {_secs(banner_timeout)} on port {port}; "
                                           f"{check}")


def _auth_message(where: str, user: str | None, tried: list[str] | None, allowed) -> str:
    as_user = f" as {user}" if user else ""
    what = f"tried: {', '.join(tried)}" if tried else "no key or agent was offered"
    accepts = f"; the server accepts: {', '.join(allowed)}" if allowed else ""
    return (f"{where}: authentication failed{as_user} ({what}{accepts}); check user and identity_file in the "
            "inventory, or load the key into your ssh-agent")
