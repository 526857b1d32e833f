"""The known_hosts files, read once per run and kept while they stay the same.

paramiko's `HostKeys.load` compares each line it reads with every line read
before it, so one file of N hosts costs N²/2 comparisons, and each connection
read every file again: a whole rollout cost N³. Measured in one process on this
project's 2-core machine: a file of 32 hosts took 2 ms to load, 300 hosts 23 ms,
1000 hosts 91 ms (206 ms with hashed names). A 1000-host rollout spent 1.5-3.5
minutes of the laptop's CPU reading the same file. Now each set of files is
loaded once, and each connection gets only the keys that paramiko will look up
for its name.

One `KnownHosts` per run (the Job and its early dials share it; router.via's
connections keep their own), safe to use from the hosts' threads at once.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path


class KnownHosts:
    """The keys of some known_hosts files, each set loaded once while none of its files changed."""

    def __init__(self) -> None:
        self._loaded: dict[tuple, object] = {}   # the files' paths and stats -> paramiko.HostKeys
        self._lock = threading.Lock()

    def seed(self, host_keys, files: list[Path], name: str) -> None:
        """Give `host_keys` (a client's paramiko.HostKeys) every key that `files`, loaded in this order,
        hold for `name` (`host`, or `[host]:port` off port 22, as paramiko looks it up): what
        loading the whole files into it would have given that lookup."""
        found = self._keys_of(files).lookup(name)
        if found is None:
            return
        for keytype in found.keys():
            host_keys.add(name, keytype, found[keytype])

    def _keys_of(self, files: list[Path]):
        stamp = tuple(_stamp(path) for path in files)
        with self._lock:
            keys = self._loaded.get(stamp)
            if keys is None:
                from paramiko.hostkeys import HostKeys
                keys = HostKeys()
                for path, seen in zip(files, stamp):
                    if seen[1] is not None:
                        keys.load(str(path))
                # a file that changed (a key accepted with --accept-new-host-keys) is read again
                self._loaded = {s: k for s, k in self._loaded.items() if [p for p, _ in s] != [p for p, _ in stamp]}
                self._loaded[stamp] = keys
        return keys


def lookup_name(host: str, port: int) -> str:
    """The name paramiko's SSHClient looks a server's key up under."""
    return host if port == 22 else f"[{host}]:{port}"


def _stamp(path: Path) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return (str(path), None)
    if not stat.S_ISREG(st.st_mode):
        return (str(path), None)
    return (str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
