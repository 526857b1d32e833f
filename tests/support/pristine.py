"""Resetting only the hosts of a test fleet that are no longer as their last reset left them.

A reset (Fleet.reset) stops a host's server, rebuilds its tree and starts the server again.
The fixtures that hand a test a fleet reset every host before each test, yet most tests drive
one or two hosts of five: `Pristine.restore(fleet)` resets the hosts whose state differs from
what was recorded right after their last reset, and leaves the others, which are then exactly
as a reset would leave them, running.

What is recorded of a host, and compared (anything that differs, or cannot be read, means reset):
  - every file, folder and link under the host's folder (its tree, venv, state/, logs/, run/,
    home/ and its sshd's folder with commands.log): type, mode, owner, size, inode, mtime,
    ctime and, for files, sha256 of the bytes. Any SSH command appends to commands.log; any
    request the server answers appends to its log; a write, chmod, chattr or rename of
    anything changes a ctime, and bytes changed within one clock tick change the digest;
  - every process in the host's mount namespace (pid and start time): a server stopped,
    restarted or killed, an agent left running, a process stopped (SIGSTOP) all differ;
  - the namespace's mount table, and the host's spec and ports.
A container host is always reset: what its container holds is not under its folder. The ranks
of a node group are reset together: a rank's server starts only beside the others'.
"""
from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import asdict

from fleetpatch_demo.fleet import Fleet

STOPPED = ("T", "t", "Z", "X")   # /proc/<pid>/stat states of a process that does not run on its own


def host_state(fleet: Fleet, name: str) -> tuple | None:
    """Everything recorded of one host (see the module docstring); None if it is a container host
    or some part could not be read (such a host is reset)."""
    h = fleet.hosts[name]
    if h.containerized or not h.sshd_pid:
        return None
    try:
        with open(f"/proc/{h.sshd_pid}/mountinfo") as f:
            mounts = f.read()
        procs = []
        for pid in sorted(fleet.processes(name)):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in STOPPED:
                return None
            procs.append((pid, fields[19]))   # field 22 of stat: the start time
        return (repr(asdict(h.spec)), h.ssh_port, tuple(h.http_ports), h.ns_ino, mounts, tuple(procs),
                tuple(_entries(str(h.dir))))
    except (OSError, IndexError):
        return None


def settle(fleet: Fleet, names, quiet: float = 0.05, within: float = 5.0) -> None:
    """Wait until the servers' logs of `names` have not grown, and the processes in their namespaces
    not changed, for `quiet` seconds (at most `within`). A reset ends when /health answers 200, and
    a server can still be at its start then (the stand-in answers 200 once it is ready and writes
    its ready line a moment later): recorded before it settles, a host would count as changed at
    the next look."""
    logs = [fleet.hosts[n].log_of(s) for n in names for s in fleet.hosts[n].server_names]

    def now():
        sizes = []
        for log in logs:
            try:
                sizes.append(os.stat(log).st_size)
            except OSError:
                sizes.append(None)
        return sizes, [sorted(fleet.processes(n)) for n in names]

    deadline = time.monotonic() + within
    last = now()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        seen = now()
        if seen == last:
            return
        last = seen


def _entries(top: str):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in [""] + sorted(dirnames + filenames):
            path = os.path.join(dirpath, name) if name else dirpath
            if not name and dirpath != top:
                continue   # a folder is recorded once, as its parent's entry
            st = os.lstat(path)
            digest = _sha256(path) if stat.S_ISREG(st.st_mode) else None
            yield (os.path.relpath(path, top), st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_ino,
                   st.st_mtime_ns, st.st_ctime_ns, digest)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Pristine:
    """What each host of each fleet was right after its last reset (see the module docstring)."""

    def __init__(self):
        self._after_reset: dict[tuple[int, str, str], tuple] = {}
        self.resets = 0    # hosts reset, and
        self.kept = 0      # hosts found as their reset left them, over the session

    def changed(self, fleet: Fleet, names=None) -> list[str]:
        """The hosts of `fleet` (or those named) that differ from what their last reset left, or
        were never reset here."""
        out = []
        for name in (fleet.hosts if names is None else names):
            recorded = self._after_reset.get(self._key(fleet, name))
            if recorded is None or host_state(fleet, name) != recorded:
                out.append(name)
        return out

    def restore(self, fleet: Fleet, names=None) -> list[str]:
        """Reset (Fleet.reset_all: tree, state, logs, server) and clear the commands of each host
        (of those named) that changed; the others stay as they are. The hosts reset."""
        names = list(fleet.hosts if names is None else names)
        changed = set(self.changed(fleet, names))
        for members in fleet.node_groups.values():
            if changed & set(members):   # a rank starts only beside the others: a group is reset whole
                changed |= set(members)
        changed = [n for n in fleet.hosts if n in changed]
        for name in changed:
            self._after_reset.pop(self._key(fleet, name), None)
        if changed:
            fleet.reset_all(names=changed)
            for name in changed:
                fleet.clear_commands(name)
            settle(fleet, changed)
            for name in changed:
                state = host_state(fleet, name)
                for _ in range(50):   # a process of the old server still exiting (a zombie) reads as None
                    if state is not None or fleet.hosts[name].containerized:
                        break
                    time.sleep(0.02)
                    state = host_state(fleet, name)
                if state is not None:
                    self._after_reset[self._key(fleet, name)] = state
        self.resets += len(changed)
        self.kept += sum(1 for n in names if n not in changed)
        return changed

    @staticmethod
    def _key(fleet: Fleet, name: str) -> tuple[int, str, str]:
        # the fleet's root too: a fleet of a later module may get the id of one that is gone
        return (id(fleet), str(fleet.root), name)
