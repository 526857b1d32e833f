"""The one seam to a host: `Remote` speaks the agent protocol over a transport.

Everything fleetpatch does on a host is a request to the agent (`agent/`) run by the
host's engine interpreter. `Remote` starts the agent once per host per
command (one remote command: `<python> -S -c BOOTSTRAP`, its sources on stdin:
the host needs nothing installed), sends it every request of the operation as
JSON lines on that one channel, streams the replies, counts the requests
(`round_trips`) and the agent starts (`agent_starts`), and ends with `bye`. A
`Transport` only carries bytes to and from one agent process. `SSHTransport`
(here) is a Fabric Connection per host with host keys enforced;
`transport_local.LocalTransport` runs the same bootstrap as a local
subprocess, for tests. Nothing here decides.

paramiko and Fabric are imported when the first SSH connection is made, not
when this module is: a command reaches its first connect sooner.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import socket
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Protocol

from . import dialer, protocol
from .agent import ENTRY, HOST_PACKAGE, MODULES as AGENT_MODULES
from .errors import HostFailure, NoAnswer, Status
from .inventory import Host
from .knownhosts import KnownHosts, KnownHostsError, lookup_name

if TYPE_CHECKING:  # imported lazily: see the module's docstring
    import paramiko
    from fabric import Connection

_HERE = Path(__file__).resolve().parent

# Stage one, the whole of the SSH command line besides the quoted interpreter path
# (so no inventory value is ever in a shell line): read an 8-digit length and that
# many bytes of zlib'd `agentboot`, with exact reads of fd 0, and run it. Stage two
# reads the header and the sources the same way and starts the agent's request loop.
BOOTSTRAP = (  # double quotes only: shlex.quote then wraps it in one pair of single quotes
    'import os,zlib;'
    'r=lambda n,b=b"":b if len(b)>=n else r(n,b+(os.read(0,n-len(b)) or os._exit(3)));'
    'exec(compile(zlib.decompress(r(int(r(8)))),"fleetpatch-agent-boot","exec"),{"__name__":"__fleetpatch_boot__"})'
)

AGENT_MODULE = f"{HOST_PACKAGE}.{ENTRY}"   # on a host: the agent's module whose serve() is its request loop

# -S: no site step at the agent's start (stdlib only; it costs a third of a bare
# start-up, more where a .pth file imports); `agent.package.with_site` runs it when
# the agent needs what site-packages hold.
AGENT_FLAGS = ("-S",)


@functools.lru_cache(maxsize=None)
def _source(name: str) -> bytes:
    return (_HERE / name).read_bytes()


@functools.lru_cache(maxsize=None)
def _compressed(name: str) -> bytes:
    # level 6: 3 ms for the agent where 9 took 9 ms, on the path to the first request, for 0.5 % more bytes
    return zlib.compress(_source(name), 6)


def sent_modules() -> list[tuple[str, str, str]]:
    """What a host loads, in order: (file below fleetpatch/, its module name on the host,
    its filename in tracebacks). The modules the agent shares with the laptop (SHARED_MODULES),
    then the agent's own, each after the modules it imports (agent.MODULES)."""
    return list(SHARED_MODULES) + [
        (f"agent/{m}.py", f"{HOST_PACKAGE}.{m}", f"fleetpatch-agent/{m}.py") for m in AGENT_MODULES]


# fleetpatch's modules that the agent imports by their names on a host, sent before its own
SHARED_MODULES = (("protocol.py", protocol.AGENT_MODULE_NAME, "fleetpatch-protocol"),
                  ("probe/install.py", protocol.PROBE_MODULE_NAME, "fleetpatch-probe/install.py"),
                  ("redact.py", protocol.REDACT_MODULE_NAME, "fleetpatch-redact"))


def __getattr__(name: str):
    """The compressed sources as sent, computed on first use (tests read them)."""
    if name == "PROTOCOL_SOURCE":
        return _compressed("protocol.py")
    if name == "AGENT_SOURCE":   # the module whose serve() is the request loop
        return _compressed(f"agent/{ENTRY}.py")
    if name == "AGENT_SOURCES":  # every agent module, by its name on the host
        return {module: _compressed(path) for path, module, _ in sent_modules()[len(SHARED_MODULES):]}
    if name == "REDACT_SOURCE":
        return _compressed("redact.py")
    if name == "BOOT_SOURCE":
        return _compressed("agentboot.py")
    if name == "SOURCES_BLOB":   # what boot_stream sends after its header
        return _sources_blob()
    raise AttributeError(name)


# Every host's thread asks for the blob at its first connect; without the lock the first few
# each compressed it (10 ms apiece; 3 times over at 32 hosts), lru_cache does not wait (issue 34).
_ONCE = threading.Lock()


def _sources_blob() -> bytes:
    with _ONCE:
        return _sources_blob_made()


@functools.lru_cache(maxsize=None)
def _sources_blob_made() -> bytes:
    return zlib.compress(b"".join(_source(path) for path, _, _ in sent_modules()), 6)


def _modules_header() -> list[dict]:
    with _ONCE:
        return _modules_header_made()


@functools.lru_cache(maxsize=None)
def _modules_header_made() -> list[dict]:
    return [{"name": module, "filename": filename, "size": len(_source(path)),
             "sha256": hashlib.sha256(_source(path)).hexdigest()} for path, module, filename in sent_modules()]


def _block(data: bytes) -> bytes:
    return b"%08d" % len(data) + data


def cache_key_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):   # the XDG spec: a relative value is ignored
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "fleetpatch" / "agent-cache.key"


@functools.lru_cache(maxsize=None)
def cache_key() -> str | None:
    """The laptop's secret that seals the hosts' compile-cache entries (agentboot: an entry
    runs only when its HMAC under this key checks out, so one planted on a host never does).
    Made once, 0600; None where it can be neither read nor made: the hosts then compile."""
    path = cache_key_path()
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    key = os.urandom(32).hex()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        return key
    except FileExistsError:   # another fleetpatch made it first
        return path.read_text().strip() or None
    except OSError:
        return None


def boot_stream(state_dir: str | None) -> bytes:
    """Everything the agent reads before its first request: stage two, the header,
    the protocol then the agent's modules (each with the sha256 the host checks it
    against), their sources as one zlib stream. The compile cache lives in the
    host's state dir, sealed with the laptop's `cache_key`."""
    modules = _modules_header()
    blob = _sources_blob()
    header = {"modules": modules, "run": AGENT_MODULE, "compressed": len(blob),
              "cache_dir": os.path.join(state_dir, "agent-cache") if state_dir else None, "cache_key": cache_key()}
    return _block(_compressed("agentboot.py")) + _block(zlib.compress(json.dumps(header).encode(), 6)) + blob


def request_line(request: dict) -> bytes:
    return json.dumps(request).encode() + b"\n"


def agent_payload(request: dict) -> bytes:
    """A whole one-request session as bytes: the boot stream, the request, `bye`."""
    return boot_stream(request.get("state_dir")) + request_line(request) + request_line({"op": "bye"})

SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "~/.ssh/known_hosts")


def _record_new_host_key_policy(save_to: Path):
    """--accept-new-host-keys: trust on first use and record the key. A
    *changed* key never reaches a policy: paramiko raises BadHostKeyException."""
    import paramiko

    class RecordNewHostKey(paramiko.MissingHostKeyPolicy):
        def __init__(self):
            self.save_to = save_to
            self.lock = threading.Lock()

        def missing_host_key(self, client, hostname, key):
            with self.lock:
                self.save_to.parent.mkdir(parents=True, exist_ok=True)
                with open(self.save_to, "a") as f:
                    f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            client.get_host_keys().add(hostname, key.get_name(), key)

    return RecordNewHostKey()


def _known_hosts_files(host: Host) -> list[Path]:
    files = [Path(os.path.expanduser(p)) for p in SYSTEM_KNOWN_HOSTS]
    if host.known_hosts:
        files.append(Path(os.path.expanduser(host.known_hosts)))
    return files


def _harden(conn: Connection, host: Host, accept_new: bool, known_hosts: KnownHosts) -> None:
    """Fabric defaults every Connection (gateways too) to AutoAddPolicy."""
    import paramiko
    from fabric import Connection
    hop = conn
    while isinstance(hop, Connection):
        client = hop.client
        known_hosts.seed(client.get_host_keys(), _known_hosts_files(host), lookup_name(hop.host, hop.port))
        if accept_new:
            target = Path(os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts"))
            client.set_missing_host_key_policy(_record_new_host_key_policy(target))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        hop = hop.gateway


def _connect_kwargs(host: Host) -> dict:
    kw: dict = {}
    if host.identity_file:
        kw["key_filename"] = [os.path.expanduser(host.identity_file)]
    return kw


def connection_for(host: Host, hosts_by_name: dict[str, Host] | None = None,
                   accept_new_host_keys: bool = False, known_hosts: KnownHosts | None = None) -> Connection:
    """A Fabric Connection; ~/.ssh/config (aliases, User, Port, IdentityFile,
    ProxyJump) and the ssh-agent are honoured, inventory values win."""
    from fabric import Connection
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
    # Fabric stores int(connect_timeout): 0.5 would become 0, which it then treats as
    # "no timeout". Keep the inventory's value as written, on every hop.
    hop = conn
    while isinstance(hop, Connection):
        hop.connect_timeout = host.connect_timeout
        hop = hop.gateway
    _harden(conn, host, accept_new_host_keys, known_hosts or KnownHosts())
    return conn


# ------------------------------------------------------------ transports

class AgentChannel(Protocol):
    """Bytes to and from one running agent process."""

    def send(self, data: bytes) -> None: ...

    def shutdown_write(self) -> None: ...

    def recv(self, wait: float) -> Optional[bytes]:
        """Up to 64 KiB of stdout; None if nothing came within `wait` s; b"" at end."""

    def stderr(self) -> bytes: ...

    def exit_status(self) -> int: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """How the agent is started on one host: `start` runs one remote command whose
    channel carries every request of the command (one `start` per host, unless a
    channel breaks)."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def start(self, argv: list[str]) -> AgentChannel: ...


class _SSHChannel:
    def __init__(self, chan: "paramiko.Channel", host_name: str):
        self.chan = chan
        self.host_name = host_name
        self._stderr = b""

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def shutdown_write(self) -> None:
        self.chan.shutdown_write()

    def recv(self, wait: float) -> Optional[bytes]:
        self._drain_stderr()
        self.chan.settimeout(wait)
        try:
            chunk = self.chan.recv(65536)
        except socket.timeout:
            return None
        if not chunk:
            self._drain_stderr()
            if (self.chan.event.is_set() and not getattr(self.chan, "event_ready", True)
                    and self.chan.get_transport().is_active()):   # closed, not cut: a refusal
                raise HostFailure("error", f"{self.host_name}: the host's sshd refused to run the agent's command "
                                           "(its exec request was denied); check the host's sshd_config "
                                           "(ForceCommand, Match blocks) for this user")
        return chunk

    def _drain_stderr(self) -> None:
        while self.chan.recv_stderr_ready():
            self._stderr += self.chan.recv_stderr(65536)

    def stderr(self) -> bytes:
        self._drain_stderr()
        return self._stderr

    def exit_status(self) -> int:
        return self.chan.recv_exit_status()

    def close(self) -> None:
        self.chan.close()


# The agent says every protocol.TICK_S that a TICKING_OPS request still runs:
# this long without a byte, the link has stalled.
TICKING_OPS = protocol.TICKING_OPS
STALL_S = 10.0


class SSHTransport:
    """One host, one SSH connection (Fabric), for the whole command."""

    def __init__(self, host: Host, hosts_by_name: dict | None = None, accept_new_host_keys: bool = False,
                 interrupt: "dialer.Interrupt | None" = None, known_hosts: KnownHosts | None = None):
        self.host = host
        self.hosts_by_name = hosts_by_name or {}
        self.accept_new_host_keys = accept_new_host_keys
        self.interrupt = interrupt or dialer.Interrupt()   # the run's Ctrl-C (a fresh one: never fired)
        self.known_hosts = known_hosts or KnownHosts()     # the run's, read once (a fresh one: read here)
        self._conn: Connection | None = None

    def open(self) -> None:
        if self._conn is not None and self._conn.is_connected:
            return
        h = self.host
        if self.interrupt.first_contact_aborted():
            raise HostFailure(Status.SKIPPED, self._not_contacted())
        from . import ssh_errors
        ssh_errors.silence_paramiko()
        try:
            conn = connection_for(h, self.hosts_by_name, self.accept_new_host_keys, self.known_hosts)
        except KnownHostsError as e:
            raise HostFailure(Status.HOST_KEY_REJECTED, f"{h.name} ({h.target}): not contacted: {e}") from None
        banner = h.connect_timeout or ssh_errors.DEFAULT_BANNER_TIMEOUT
        conn.connect_kwargs.update(banner_timeout=banner, auth_timeout=banner)
        sock = None
        try:
            if conn.gateway is None:
                # our own socket (to the address ~/.ssh/config resolved), watched, so a failed
                # handshake can tell "not SSH" from "silent"; through a gateway Fabric dials
                sock = ssh_errors.dial(conn.host, conn.port, h.connect_timeout, self.interrupt)
                conn.connect_kwargs["sock"] = sock
            with self.interrupt.handshaking(sock):
                conn.open()
        except Exception as exc:  # paramiko raises a zoo; describe it once, here
            for closing in (conn.close, getattr(sock, "close", None)):
                try:
                    if closing is not None:
                        closing()
                except Exception:
                    pass
            if self.interrupt.first_contact_aborted():
                raise HostFailure(Status.SKIPPED, self._not_contacted()) from None
            attempt = ssh_errors.Attempt(
                where=f"{h.name} ({h.target})", address=conn.host, port=conn.port, banner_timeout=banner,
                connect_timeout=h.connect_timeout, user=h.user,
                tried=[f"publickey {h.identity_file}" if h.identity_file else "publickey (default keys)",
                       "ssh-agent"])
            raise ssh_errors.describe(exc, attempt, sock) from None
        self._conn = conn

    def _not_contacted(self) -> str:
        return (f"{self.host.name} ({self.host.target}): not contacted: interrupted ({self.interrupt.cause}) "
                "while its SSH connection was being made; untouched")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def start(self, argv: list[str]) -> _SSHChannel:
        self.open()
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostFailure("unreachable", f"{self.host.name}: the SSH connection dropped", NoAnswer.NO_SESSION)
        bound = self.host.connect_timeout or 30
        try:
            # paramiko's own default is an hour: a stalled connection must fail in sight
            chan = transport.open_session(timeout=bound)
        except Exception as exc:
            raise HostFailure("unreachable", f"{self.host.name}: could not open an SSH channel within {bound:g}s "
                                             f"({type(exc).__name__}: {exc}); check the host and rerun",
                              NoAnswer.NO_SESSION) from None
        import paramiko
        # paramiko waits for sshd's answer to the exec request without a bound: a link that
        # stalls there is cut, and the first read then says the session closed
        watchdog = threading.Timer(bound, transport.close)
        watchdog.daemon = True
        watchdog.start()
        try:
            chan.exec_command(" ".join(shlex.quote(a) for a in argv))
        except (paramiko.SSHException, EOFError, OSError):
            # refused, or the link went (paramiko raises the transport's own EOFError when the
            # session is killed while it waits): the channel is closed and its first read says which
            pass
        finally:
            watchdog.cancel()
        return _SSHChannel(chan, self.host.name)


# ----------------------------------------------------------------- Remote

class Remote:
    """One host's agent, over SSH unless another transport is given: started on
    the first request, then every request goes to the same process."""

    BYE = request_line({"op": "bye"})

    def __init__(self, host: Host, hosts_by_name: dict | None = None, accept_new_host_keys: bool = False,
                 transport: Transport | None = None, interrupt: "dialer.Interrupt | None" = None,
                 known_hosts: KnownHosts | None = None):
        self.host = host
        self.transport = transport or SSHTransport(host, hosts_by_name, accept_new_host_keys, interrupt, known_hosts)
        self.round_trips = 0     # requests (a chained `then` rides on its request)
        self.agent_starts = 0    # remote commands
        self.bytes_sent = 0
        self._chan: AgentChannel | None = None
        self._buf = b""
        self._pending = b""
        self._ahead: tuple[str, bytes] | None = None   # (op, line): sent before the answer to the one before

    def open(self) -> None:
        self.transport.open()

    def close(self) -> None:
        """`bye` ends the agent's loop; the agent's exit is not waited for (its own
        rule covers a channel that ends without it). Then the connection closes."""
        try:
            self._end_session(bye=True)
        finally:
            self.transport.close()

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()

    def _session(self) -> AgentChannel:
        if self._chan is None:
            try:
                # on a container host the host's own python3: the agent works on the container from outside
                chan = self.transport.start([self.host.engine.agent_python, *AGENT_FLAGS, "-c", BOOTSTRAP])
            except HostFailure as f:   # mid-run (a redial after a cut): the request never reached the host
                if self.agent_starts and f.cause is None:
                    f.cause = NoAnswer.NO_SESSION
                raise
            self.agent_starts += 1
            self._chan, self._buf = chan, b""
            self._pending = boot_stream(self.host.engine.state_dir)  # goes out with the first request
        return self._chan

    def _send(self, data: bytes, op: str = "request") -> None:
        try:
            self._chan.send(data)
        except (OSError, EOFError) as e:   # paramiko: "Socket is closed" once the link or sshd died
            self._end_session(bye=False)
            raise HostFailure("error", f"{self.host.name}: the host agent ({op}) got no request: the SSH session "
                                       "closed while it was sent (the connection was cut or the host's sshd "
                                       f"session killed: {type(e).__name__}: {e}); a plain rerun reads the "
                                       "host's ledger and finishes or undoes what was done",
                              NoAnswer.SEND_FAILED) from None
        self.bytes_sent += len(data)

    def _end_session(self, bye: bool) -> None:
        chan, ahead, self._chan, self._ahead = self._chan, self._ahead, None, None
        if chan is None:
            return
        try:
            if bye:
                # a follow sent ahead and never taken up gets its empty decision first:
                # `bye` must reach the request loop, not that follow as its decision
                data = (b"[]\n" if ahead is not None else b"") + self.BYE
                chan.send(data)
                self.bytes_sent += len(data)
            chan.shutdown_write()
        except Exception:
            pass  # a channel that is already gone has ended the agent's loop too
        finally:
            chan.close()

    def _send_request(self, request: dict, ahead: dict | None = None) -> AgentChannel:
        self._settle_ahead()
        chan = self._session()
        self.round_trips += 1
        data, self._pending = self._pending + request_line(request), b""
        line = request_line(ahead) if ahead is not None else b""
        self._send(data + line, request.get("op", "request"))
        if ahead is not None:
            self.round_trips += 1
            self._ahead = (ahead["op"], line)
        return chan

    def _settle_ahead(self) -> None:
        """A request sent ahead that the laptop did not take up (the one before it
        failed, or the laptop decided otherwise): an empty decision ends it at once
        (a follow that runs ends; the agent ignores it otherwise) and its answer is
        read, so the channel stays in step."""
        if self._ahead is None:
            return
        (op, _), self._ahead = self._ahead, None
        try:
            self._send(b"[]\n", op)
            for reply in self._replies(self._chan, op, 60):
                if reply.get("t") == "result":
                    return
        except HostFailure:
            pass
        self._end_session(bye=False)   # out of step or gone: the next request starts a fresh agent

    def call(self, op: str, request: dict, timeout: float = 300, ahead: dict | None = None) -> dict:
        """Run one agent operation and return its result, or raise HostFailure.
        `ahead` (a request with its op) goes out in the same write, a round trip
        sooner: the `stream` or `call` that asks for it next takes its answer."""
        chan = self._send_request(dict(request, op=op), ahead)
        replies = [r for r in self._replies(chan, op, timeout) if r.get("t") != "tick"]
        return self._result(op, chan, replies)

    def _take_ahead(self, request: dict) -> AgentChannel | None:
        """The channel, when exactly this request was sent ahead."""
        if self._ahead is not None and self._chan is not None and self._ahead[1] == request_line(request):
            self._ahead = None
            return self._chan
        return None

    def stream(self, op: str, request: dict, on_event: Callable[[dict], list | None],
               timeout: float) -> dict:
        """Run a streaming operation. `on_event` gets every event and returns the
        follow-up requests to send back (the laptop's decision) or None to keep
        listening; their results are in the reply's "then"."""
        full = dict(request, op=op)
        chan = self._take_ahead(full) or self._send_request(full)
        replies = []   # only the Result is kept: a chatty log must not pile up here
        sent = False
        watch = [True]
        events = self._replies(chan, op, timeout + 30, watch)
        for reply in events:
            if reply.get("t") == "result":
                replies.append(reply)
                break
            if not sent:
                try:
                    answer = on_event(reply)
                except BaseException:
                    self._abandon(events, sent)
                    raise
                if answer is not None:
                    self._send(json.dumps(answer).encode() + b"\n", op)
                    sent = True
                    watch[0] = False   # the decision's requests run without ticks: only the bound holds
        return self._result(op, chan, replies)

    def _abandon(self, events: Iterator[dict], sent: bool) -> None:
        """The laptop failed while the agent streams: end that request with an empty
        decision (no follow-ups) and read it to its Result, so the channel stays in
        step for what comes next (the release of the lock)."""
        try:
            if not sent:
                self._send(b"[]\n")
            for reply in events:
                if reply.get("t") == "result":
                    return
            self._end_session(bye=False)
        except Exception:
            self._end_session(bye=False)

    def _replies(self, chan: AgentChannel, op: str, timeout: float, watch: list | None = None) -> Iterator[dict]:
        """This request's replies, up to and including its Result. A channel that
        times out or ends is dropped: the next request starts a fresh agent (whose
        lock token is the same run's), never one whose replies are out of step.
        A request that ticks (TICKING_OPS) and goes STALL_S without a byte has a
        stalled connection: it ends then, not at its whole bound (minutes for an apply)."""
        deadline = time.monotonic() + timeout
        heard = time.monotonic()
        watch = [op in TICKING_OPS] if watch is None else watch
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                reply = parse_reply(line)
                if reply is not None:
                    yield reply
                    if reply.get("t") == "result":
                        return
            chunk = chan.recv(0.5)
            if chunk is None:
                now = time.monotonic()
                if now > deadline:
                    self._end_session(bye=False)
                    raise HostFailure("timeout", f"{self.host.name}: the host did not answer ({op}) within "
                                                 f"{timeout:.0f}s", NoAnswer.TIMEOUT)
                if watch[0] and op in TICKING_OPS and now - heard > STALL_S:
                    self._end_session(bye=False)
                    try:   # a new channel on the stalled connection would stall too: dial afresh
                        self.transport.close()
                    except Exception:
                        pass
                    raise HostFailure("timeout", f"{self.host.name}: the connection stalled: not a byte from the "
                                                 f"host agent ({op}) for {STALL_S:.0f}s, though it says every "
                                                 "second that it still runs; the host may still be at work",
                                      NoAnswer.STALLED)
                continue
            if not chunk:
                return  # the agent ended without a Result: _result says why
            heard = time.monotonic()
            self._buf += chunk

    def _result(self, op: str, chan: AgentChannel, replies: list[dict]) -> dict:
        final = next((r for r in reversed(replies) if r.get("t") == "result"), None)
        if final is None:
            status = chan.exit_status()
            err = chan.stderr().decode("utf-8", "replace").strip()
            self._end_session(bye=False)
            hint = ""
            if status == -1:   # SSH: the channel closed with no exit status: sshd or the link died, not the agent
                raise HostFailure("error", f"{self.host.name}: the host agent ({op}) ended without an answer: the "
                                           "SSH session closed without an exit status (the connection was cut or "
                                           "the host's sshd session killed)" + (f"; it said: {err[-800:]}" if err
                                                                                else "")
                                  + "; a plain rerun reads the host's ledger and finishes or undoes what was done",
                                  NoAnswer.CHANNEL_CLOSED)
            if status == 127 or "No such file" in err or "not found" in err:
                hint = (f"; is engine.python ({self.host.engine.python}) right for this host?" if not self.host.engine.container
                        else f"; a container host runs the agent with the host's own {self.host.engine.agent_python}")
            raise HostFailure("error", f"{self.host.name}: the host agent ({op}) exited {status} without an answer: "
                                       f"{err[-800:] or 'no output'}{hint}", NoAnswer.AGENT_EXITED)
        if not final["ok"]:
            raise HostFailure(final.get("code", "error"), f"{self.host.name}: {final['message']}")
        return final["result"]


def parse_reply(line: bytes) -> dict | None:
    """The agent's reply on one stdout line, or None for noise. The prefix may
    follow noise on the same line: a `.pth` file or a login script that prints
    without a newline glues its text to the agent's first reply."""
    text = line.decode("utf-8", "replace")
    at = text.find(protocol.REPLY_PREFIX)
    if at < 0:
        return None
    try:
        return json.loads(text[at + len(protocol.REPLY_PREFIX):])
    except ValueError:
        return None
