"""One fleetpatch rollout, in-process, with timers around its SSH seam.

    python bench/fp_instrumented.py OUT.json -- rollout --patch … --report …

Runs the installed `fleetpatch` program exactly as the CLI does, but first wraps
(this process only; fleetpatch's code is not changed):

* ``fleetpatch.remote.Remote.open``  -> connect time per host (TCP + SSH
  handshake + host key check + publickey auth, paramiko);
* ``Remote.call`` / ``Remote.stream`` -> time of each agent round trip, by op;
* ``paramiko.Channel.sendall`` / ``recv`` / ``recv_stderr`` -> bytes sent and
  received per round trip (payload bytes on the channel, before SSH framing).

Writes {"import_s", "total_s", "exit", "hosts": {name: {"connect_s", "calls":
[{"op", "s", "sent", "recv"}]}}} to OUT.json.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
import time

T0 = time.monotonic()

import paramiko  # noqa: E402

from fleetpatch import remote as fp_remote  # noqa: E402
from fleetpatch.cli import program  # noqa: E402

IMPORT_S = time.monotonic() - T0

_lock = threading.Lock()
_hosts: dict = {}
_tls = threading.local()


def _rec(name: str) -> dict:
    with _lock:
        return _hosts.setdefault(name, {"connect_s": 0.0, "calls": []})


def _wrap_open(orig):
    def open_(self):
        fresh = self._conn is None or not self._conn.is_connected
        t = time.monotonic()
        try:
            return orig(self)
        finally:
            if fresh:
                _rec(self.host.name)["connect_s"] += time.monotonic() - t
    return open_


def _wrap_op(orig):
    def op(self, name, *a, **kw):
        call = {"op": name, "s": 0.0, "sent": 0, "recv": 0}
        prev = getattr(_tls, "call", None)
        _tls.call = call
        t = time.monotonic()
        try:
            return orig(self, name, *a, **kw)
        finally:
            call["s"] = round(time.monotonic() - t, 4)
            _tls.call = prev
            _rec(self.host.name)["calls"].append(call)
    return op


def _count(orig, key, from_result):
    def wrapped(self, arg, *a, **kw):
        out = orig(self, arg, *a, **kw)
        call = getattr(_tls, "call", None)
        if call is not None:
            call[key] += len(out) if from_result else len(arg)
        return out
    return wrapped


fp_remote.SSHTransport.open = _wrap_open(fp_remote.SSHTransport.open)
fp_remote.Remote.call = _wrap_op(fp_remote.Remote.call)
fp_remote.Remote.stream = _wrap_op(fp_remote.Remote.stream)
paramiko.Channel.sendall = _count(paramiko.Channel.sendall, "sent", False)
paramiko.Channel.recv = _count(paramiko.Channel.recv, "recv", True)
paramiko.Channel.recv_stderr = _count(paramiko.Channel.recv_stderr, "recv", True)


def main() -> int:
    out_path, sep, *args = sys.argv[1:]
    assert sep == "--"
    t = time.monotonic()
    code = 0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            program.run(["fleetpatch", *args], exit=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    doc = {"import_s": round(IMPORT_S, 4), "total_s": round(time.monotonic() - t, 4), "exit": code,
           "hosts": _hosts, "output_tail": buf.getvalue()[-3000:]}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
