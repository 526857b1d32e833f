"""router.via: a router's HTTP API reached through the SSH connection to an inventory host.

The router may listen where only the hosts can reach it (a private address, a
port the laptop's network does not route). One Fabric connection to the via
host, opened on the first router call and kept for the run, carries every
router call: each HTTP request is one ``direct-tcpip`` channel on it, what
Fabric's ``Connection.forward_local`` opens for each socket it accepts, here
with no local listening port and no ssh process. The via host's sshd makes
the TCP connection to the router, so ``router.urls`` is the address as the
via host reaches it.

The run owns its connections: one `Tunnels` per run (the run's `drain.Drainer`
carries it), which dials each via host under the run's host-key policy
(--accept-new-host-keys) and its Ctrl-C (`dialer.Interrupt`: a connect made
inside `Interrupt.first_contact` is dropped at once), and closes them all when
the run ends (`close`, or the end of its ``with`` block).
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
from typing import Dict, Optional, Tuple

from . import dialer
from .router import TunnelError

__all__ = ["Tunnel", "Tunnels", "TunnelError"]

# A failed connect is reported again, not retried, for this long: N hosts checked at once
# against an unreachable via host wait for one connect timeout, not N; a long rollout
# still reconnects after a passing outage.
RETRY_AFTER_S = 10.0


class Tunnel:
    """The SSH connection to one via host, shared (thread-safe) by every router call."""

    def __init__(self, host, peers: Dict[str, object], accept_new_host_keys: bool = False,
                 interrupt: Optional[dialer.Interrupt] = None):
        self.host = host                   # the via host's inventory record
        self.peers = peers                 # it and its gateway host, by name (for the gateway's key)
        self.accept_new_host_keys = accept_new_host_keys
        self.interrupt = interrupt or dialer.Interrupt()   # the run's Ctrl-C (a fresh one: never fired)
        self.channels_opened = 0
        self._ssh = None                   # remote.SSHTransport once connected
        self._failed: Optional[Tuple[str, float]] = None   # (why, when) of the last failed connect
        self._lock = threading.Lock()

    def _transport(self):
        """The live paramiko Transport of the via host's connection (connecting on first use)."""
        from .errors import HostFailure
        from .remote import SSHTransport   # remote -> inventory -> router: imported when first used
        if self._failed and time.monotonic() - self._failed[1] < RETRY_AFTER_S:
            raise TunnelError(self._failed[0])
        if self._ssh is not None:
            # SSHTransport keeps its Fabric Connection in _conn; the paramiko Transport under it opens channels
            t = self._ssh._conn.client.get_transport() if self._ssh._conn is not None else None
            if t is not None and t.is_active():
                return t
            self._ssh.close()              # dropped: dial again, once per call
            self._ssh = None
        ssh = SSHTransport(self.host, self.peers, self.accept_new_host_keys, self.interrupt)
        try:
            ssh.open()
        except HostFailure as f:
            if self.interrupt.first_contact_aborted():   # not a failure of the via host: the next call dials again
                raise TunnelError(f"interrupted ({self.interrupt.cause}) while the SSH connection to the via host "
                                  f"{self.host.name} (router.via) was being made") from None
            why = f"cannot open the SSH connection to the via host {self.host.name} (router.via): {f.message}"
            self._failed = (why, time.monotonic())
            raise TunnelError(why) from None
        self._ssh, self._failed = ssh, None
        return ssh._conn.client.get_transport()

    def channel(self, address: str, port: int, timeout: float):
        """A direct-tcpip channel from the via host to address:port, with `timeout` on its reads."""
        import paramiko
        with self._lock:
            transport = self._transport()
        try:
            chan = transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as e:
            if e.code == 1:    # OPEN_ADMINISTRATIVELY_PROHIBITED
                raise TunnelError(f"the sshd of the via host {self.host.name} refuses TCP forwarding "
                                  f"({e.text}); allow it there (AllowTcpForwarding yes) or drop router.via"
                                  ) from None
            raise TunnelError(f"the via host {self.host.name} cannot connect to {address}:{port} ({e.text}); "
                              "is the router running, and is router.urls its address as seen from "
                              f"{self.host.name}?") from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise TunnelError(f"the SSH connection to the via host {self.host.name} failed while opening a "
                              f"channel to {address}:{port} ({type(e).__name__}: {e}); rerun") from None
        chan.settimeout(timeout)
        self.channels_opened += 1
        return chan

    def request(self, address: str, port: int, method: str, target: str, data: Optional[bytes],
                headers: Dict[str, str], timeout: float) -> Tuple[int, bytes]:
        """(HTTP status, body) of one request to address:port through the via host."""
        conn = _ChannelHTTPConnection(self, address, port, timeout)
        try:
            conn.request(method, target, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        except TunnelError:
            raise
        except socket.timeout:
            raise TunnelError(f"no answer within {timeout:g} s through the via host {self.host.name}") from None
        except (http.client.HTTPException, OSError, EOFError) as e:
            raise TunnelError(f"{type(e).__name__} through the via host {self.host.name}: {e}") from None
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            if self._ssh is not None:
                try:
                    self._ssh.close()
                finally:
                    self._ssh = None


class Tunnels:
    """The router.via connections of one run: a `Tunnel` per via host (whichever router or
    host asks), all dialled with the run's host-key policy and Ctrl-C, all closed by `close`."""

    def __init__(self, accept_new_host_keys: bool = False, interrupt: Optional[dialer.Interrupt] = None):
        self.accept_new_host_keys = accept_new_host_keys
        self.interrupt = interrupt or dialer.Interrupt()
        self._tunnels: Dict[str, Tunnel] = {}
        self._lock = threading.Lock()

    def tunnel_for(self, via_host, peers: Dict[str, object]) -> Tunnel:
        """The run's tunnel to `via_host`, made on first use."""
        with self._lock:
            t = self._tunnels.get(via_host.name)
            if t is None:
                t = self._tunnels[via_host.name] = Tunnel(via_host, peers, self.accept_new_host_keys, self.interrupt)
            return t

    def close(self) -> None:
        """Close every via connection of the run (idempotent)."""
        with self._lock:
            tunnels = list(self._tunnels.values())
            self._tunnels.clear()
        for t in tunnels:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - the run is over: nothing left to tell
                pass

    def __enter__(self) -> "Tunnels":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ChannelHTTPConnection(http.client.HTTPConnection):
    """http.client over a direct-tcpip channel instead of a TCP socket."""

    def __init__(self, tunnel: "Tunnel", host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._tunnel_ = tunnel

    def connect(self) -> None:
        self.sock = self._tunnel_.channel(self.host, self.port, self.timeout)


