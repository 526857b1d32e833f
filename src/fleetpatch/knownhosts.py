"""The known_hosts files, read once per run and kept while they stay the same.

paramiko's `HostKeys.load` compares each line it reads with every line read
before it (N²/2 comparisons for a file of N hosts), each connection read every
file again, and each lookup of a hashed name hashed it again in Python for every
line: a rollout's laptop CPU grew with the cube of the fleet. `bench/laptop_scaling.py`
on this project's 2-core machine, the clients of N hosts against a known_hosts of
N hosts: 32 hosts 54-62 ms, 300 hosts 4.6 s (4.9 s hashed), 1000 hosts 86 s (130 s
hashed). Now each set of files is read once (HostKeyEntry.from_line, as load
parses it), a connection gets only the keys paramiko would look up for its name,
and a hashed name is checked with the C HMAC: 19-23 ms, 0.20 s (0.34 s), 0.77 s
(2.5 s).

One `KnownHosts` per run (the Job and its early dials share it; router.via's
connections keep their own), safe to use from the hosts' threads at once.
"""
from __future__ import annotations

import binascii
import hmac
import os
import stat
import threading
from pathlib import Path


class KnownHosts:
    """The keys of some known_hosts files, each set read once while none of its files changed."""

    def __init__(self) -> None:
        self._read: dict[tuple, tuple] = {}   # the files' paths -> (their stats when read, their lines)
        self._lock = threading.Lock()

    def seed(self, host_keys, files: list[Path], name: str) -> None:
        """Give `host_keys` (a client's paramiko.HostKeys) every key that `files`, loaded in this order,
        hold for `name` (`host`, or `[host]:port` off port 22, as paramiko looks it up): what
        loading the whole files into it would have given that lookup."""
        for keytype, key in keys_for(self._lines_of(files), name).items():
            host_keys.add(name, keytype, key)

    def _lines_of(self, files: list[Path]) -> list:
        paths = tuple(str(path) for path in files)
        stamp = tuple(_stamp(path) for path in files)
        with self._lock:
            held = self._read.get(paths)
            # read again once a file changed (a key accepted with --accept-new-host-keys, an edit)
            if held is None or held[0] != stamp:
                lines = [line for path, seen in zip(files, stamp) if seen is not None for line in read_lines(path)]
                held = self._read[paths] = (stamp, lines)
        return held[1]


def read_lines(path: Path) -> list:
    """A known_hosts file's lines as paramiko's HostKeys.load parses them (HostKeyEntry.from_line, the
    same lines skipped), each as (its plain names, its hashed names as (salt, HMAC) pairs, its key).
    Not load itself: it also drops each name already seen with the same key, comparing every line
    with every line before it, which changes no lookup."""
    from paramiko.hostkeys import HostKeyEntry, InvalidHostKey
    from paramiko.ssh_exception import SSHException
    lines = []
    with open(path) as f:
        for lineno, text in enumerate(f, 1):
            text = text.strip()
            if not text or text[0] == "#":
                continue
            try:
                entry = HostKeyEntry.from_line(text, lineno)
            except SSHException:
                continue
            except InvalidHostKey as e:   # paramiko's load raised it as it is, naming neither file nor line
                raise KnownHostsError(path, lineno, e.exc) from None
            if entry is None:
                continue
            plain = {h for h in entry.hostnames if not h.startswith(HASHED)}
            hashed = [pair for pair in map(_salted, entry.hostnames) if pair is not None]
            lines.append((plain, hashed, entry.key))
    return lines


class KnownHostsError(Exception):
    """A known_hosts line whose key cannot be read: no host's key in the file is trusted until it
    is mended (a host's own line could be the one that cannot be read)."""

    def __init__(self, path: Path, lineno: int, why: object):
        super().__init__(f"{path}, line {lineno}: the key on this known_hosts line cannot be read ({why}); "
                         f"correct or delete that line (`ssh-keygen -R NAME -f {path}` deletes a host's lines), "
                         "then run again")


def keys_for(lines: list, name: str) -> dict:
    """keytype -> key for `name`, the first line's key of each type, in the order of the lines: what
    paramiko's HostKeys.lookup(name) answers. A hashed name (OpenSSH's HashKnownHosts) matches where
    HMAC-SHA1(its salt, name) is its hash, as in paramiko, whose own check of each hashed line (HMAC
    and comparison in Python) took 15 ms a host with 1000 hashed lines."""
    raw = name.encode()
    found: dict = {}
    for plain, hashed, key in lines:
        if name in plain or any(hmac.compare_digest(hmac.digest(salt, raw, "sha1"), mac) for salt, mac in hashed):
            found.setdefault(key.get_name(), key)
    return found


HASHED = "|1|"


def _salted(hostname: str):
    """(salt, HMAC) of a hashed name `|1|salt|hmac` (base64 each), or None."""
    parts = hostname.split("|")
    if not hostname.startswith(HASHED) or len(parts) != 4:
        return None
    try:
        salt, mac = binascii.a2b_base64(parts[2]), binascii.a2b_base64(parts[3])
    except binascii.Error:
        return None
    return (salt, mac) if len(salt) == len(mac) == 20 else None


def lookup_name(host: str, port: int) -> str:
    """The name paramiko's SSHClient looks a server's key up under."""
    return host if port == 22 else f"[{host}]:{port}"


def _stamp(path: Path) -> tuple | None:
    """What tells a file's versions apart; None where it is not a file (absent: nothing to read)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None
