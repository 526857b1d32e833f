"""Connections opened ahead: a rollout dials the hosts it starts with as soon as the
inventory and the patch check out, while the rest of the program still loads, and
each of those hosts' steps takes its connection when it starts (steps/context.connect).

A connection is all that happens ahead: nothing is sent to a host before its step
runs. A dial's failure is the host's, raised in its step as if it had dialled there;
Ctrl-C drops a dial still being made (it is a first contact, dialer.Interrupt); a
connection no step took is closed at the end of the run.
"""
from __future__ import annotations

import threading
import time

from . import dialer
from .inventory import Host
from .knownhosts import KnownHosts
from .remote import Remote


class Dial:
    """One host's connection, being made in a thread of its own."""

    def __init__(self, remote: Remote, interrupt: dialer.Interrupt):
        self.remote = remote
        self.started = time.monotonic()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, args=(interrupt,), daemon=True,
                                        name=f"fleetpatch-dial-ahead-{remote.host.name}")
        self._thread.start()

    def _open(self, interrupt: dialer.Interrupt) -> None:
        try:
            with interrupt.first_contact():
                self.remote.open()
        except BaseException as e:   # the host's step raises it, in its own thread
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Until the connection is made; raises what opening it raised."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class Dials:
    """The run's connections opened ahead, by host name, each taken once."""

    def __init__(self, interrupt: dialer.Interrupt, known_hosts: KnownHosts | None = None):
        self.interrupt = interrupt
        self.known_hosts = known_hosts or KnownHosts()   # the run's (the Job takes it on)
        self._ahead: dict[str, Dial] = {}
        self._lock = threading.Lock()

    def start(self, hosts: list[Host], hosts_by_name: dict, accept_new_host_keys: bool) -> None:
        if hosts:
            # Loaded here, before the dials' threads start, not by the first of them: that thread
            # would share the GIL with the caller's imports of the steps (the caller goes on to
            # them) and connect only once both were done. Loaded first, every connect starts at
            # once and the steps load while the hosts answer.
            import fabric  # noqa: F401  (it loads paramiko)
        for host in hosts:
            remote = Remote(host, hosts_by_name=hosts_by_name, accept_new_host_keys=accept_new_host_keys,
                            interrupt=self.interrupt, known_hosts=self.known_hosts)
            with self._lock:
                self._ahead[host.name] = Dial(remote, self.interrupt)

    def take(self, name: str) -> Dial | None:
        with self._lock:
            return self._ahead.pop(name, None)

    def close(self) -> None:
        """Close the connections no step took (the run stopped before their hosts). One still
        being made is not waited for (a host behind a firewall holds it for its connect timeout):
        its thread ends with the program, which is ending."""
        with self._lock:
            left, self._ahead = list(self._ahead.values()), {}
        for dial in left:
            if not dial.done():
                continue
            try:
                dial.wait()
            except BaseException:
                continue
            dial.remote.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
