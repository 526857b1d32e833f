#!/usr/bin/env python3
"""A TCP proxy on loopback that delays every chunk of data by a fixed time each way.

    python bench/delayproxy.py --delay-ms 25 --max-seconds 3600 --target 2201 --target 2202 …

For every ``--target PORT`` (a TCP port on 127.0.0.1) it listens on a free port of
127.0.0.1 and forwards each accepted connection to the target.  Every chunk read
from either side is written to the other side ``--delay-ms`` later (default 25 ms
each way, so 50 ms round trip), in order, without waiting for the previous chunk's
delay to pass first: like a long link, not a slow one, so throughput is not capped
and only latency is added.  A chunk is what one recv() returns, which on loopback
with TCP_NODELAY is close to one segment as the sender wrote it.

A new connection also costs what TCP's handshake costs on a real link: the proxy
accepts at once (the kernel does), but connects to the target only one round trip
(2 x delay) later and reads nothing from the client before that, so the first bytes
either way flow one round trip late (--no-handshake-rtt turns this off).

It prints one JSON line {"ports": {"TARGET": LISTEN, …}, "delay_ms": …} on stdout
once every listener is up, then runs until the first of: --max-seconds elapsed, its
stdin reaches EOF (the parent that started it closed the pipe or died), SIGTERM /
SIGINT.  It only ever binds to and connects to 127.0.0.1: anything else is refused.

Stdlib only (asyncio); Python 3.8+.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time

LOOPBACK = "127.0.0.1"
CHUNK = 256 * 1024


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class ChunkLogs:
    """The files that get one line per chunk, each None unless asked for: `trace` (--trace) per
    chunk read: loop time, connection, direction, bytes; `lateness` (--lateness) per chunk
    written: wall time, connection, direction, ms past its due time."""

    def __init__(self, trace=None, lateness=None):
        self.trace, self.lateness = trace, lateness


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                label: str, logs: ChunkLogs) -> None:
    """Copy reader -> writer, each chunk released `delay` seconds after it was read.
    Reading never waits for writing: the queue holds what is in flight."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    async def read_side():
        try:
            while True:
                data = await reader.read(CHUNK)
                if logs.trace is not None:
                    logs.trace.write(f"{loop.time():.4f} {label} {len(data)}\n")
                q.put_nowait((loop.time() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            q.put_nowait((loop.time() + delay, b""))

    async def write_side():
        while True:
            due, data = await q.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if logs.lateness is not None:   # the proxy's own lag: a starved event loop adds to the link's delay
                logs.lateness.write(f"{time.time():.4f} {label} {(loop.time() - due) * 1000:.2f}\n")
            if not data:
                # half-close: the peer sees EOF after the same delay as the data before it
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    rd = asyncio.ensure_future(read_side())
    try:
        await write_side()
    finally:
        rd.cancel()


class Proxy:
    def __init__(self, targets, delay: float, handshake_rtt: bool = True, logs: ChunkLogs | None = None):
        for t in targets:
            if not 0 < t < 65536:
                raise SystemExit(f"delayproxy: target port {t} out of range")
        self.targets = list(targets)
        self.delay = delay
        self.handshake_rtt = handshake_rtt
        self.logs = logs or ChunkLogs()
        self.ports: dict = {}
        self.servers = []
        self.conns: set = set()
        self.connections = 0   # numbers each connection in --trace

    async def start(self) -> None:
        for t in self.targets:
            srv = await asyncio.start_server(lambda r, w, t=t: self._conn(r, w, t), LOOPBACK, 0,
                                             reuse_address=True)
            self.servers.append(srv)
            self.ports[t] = srv.sockets[0].getsockname()[1]

    async def _conn(self, creader, cwriter, target: int) -> None:
        task = asyncio.current_task()
        self.conns.add(task)
        _nodelay(cwriter)
        peer = cwriter.get_extra_info("peername")
        if not peer or peer[0] != LOOPBACK:   # listeners are on 127.0.0.1; belt and braces
            cwriter.close()
            self.conns.discard(task)
            return
        try:
            if self.handshake_rtt:
                await asyncio.sleep(2 * self.delay)   # SYN, SYN-ACK: one round trip before data
            sreader, swriter = await asyncio.open_connection(LOOPBACK, target)
        except OSError:
            cwriter.close()
            self.conns.discard(task)
            return
        _nodelay(swriter)
        try:
            self.connections += 1
            n = self.connections
            await asyncio.gather(_pump(creader, swriter, self.delay, f"{n} >", self.logs),
                                 _pump(sreader, cwriter, self.delay, f"{n} <", self.logs))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (cwriter, swriter):
                try:
                    w.close()
                except (ConnectionError, OSError):
                    pass
            self.conns.discard(task)

    async def stop(self) -> None:
        for s in self.servers:
            s.close()
        for t in list(self.conns):
            t.cancel()
        await asyncio.gather(*self.conns, return_exceptions=True)


async def _stdin_eof() -> None:
    """Returns when stdin reaches EOF (or is not a pipe/file at all: then never)."""
    loop = asyncio.get_running_loop()
    try:
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (OSError, ValueError):
        await asyncio.Event().wait()
        return
    while await reader.read(4096):
        pass


async def amain(a) -> int:
    proxy = Proxy(a.target, a.delay_ms / 1000.0, handshake_rtt=not a.no_handshake_rtt, logs=a.logs)
    await proxy.start()
    print(json.dumps({"ports": {str(k): v for k, v in proxy.ports.items()}, "delay_ms": a.delay_ms,
                      "handshake_rtt": not a.no_handshake_rtt,
                      "max_seconds": a.max_seconds}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(asyncio.sleep(a.max_seconds))]
    if not a.ignore_stdin:
        waits.append(asyncio.ensure_future(_stdin_eof()))
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for p in pending:
        p.cancel()
    await proxy.stop()
    return 0


def _log_file(ap: argparse.ArgumentParser, flag: str, path: str | None):
    """A line-buffered file to append to, None without `path`; a path that cannot be written is a usage error."""
    if not path:
        return None
    try:
        return open(path, "a", buffering=1)
    except OSError as e:
        ap.error(f"{flag} {path}: cannot write there ({e.strerror})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="TCP delay proxy on 127.0.0.1 (bench)")
    ap.add_argument("--target", type=int, action="append", required=True,
                    help="a TCP port on 127.0.0.1 to forward to (repeatable)")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="added delay each way (default 25)")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long (default 3600)")
    ap.add_argument("--no-handshake-rtt", action="store_true",
                    help="connect to the target at once (no round trip for the TCP handshake)")
    ap.add_argument("--ignore-stdin", action="store_true", help="do not stop when stdin reaches EOF")
    ap.add_argument("--trace", help="write one line per chunk read (time, connection, > or <, bytes) here")
    ap.add_argument("--lateness", help="write one line per chunk written (wall time, connection, > or <, ms it "
                                       "went out past its due time) here")
    a = ap.parse_args(argv)
    a.logs = ChunkLogs(*(_log_file(ap, flag, path) for flag, path in (("--trace", a.trace), ("--lateness", a.lateness))))
    if a.delay_ms < 0 or a.max_seconds <= 0:
        ap.error("--delay-ms must be >= 0 and --max-seconds > 0")
    return asyncio.run(amain(a))


if __name__ == "__main__":
    sys.exit(main())
