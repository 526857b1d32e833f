"""bench/delayproxy.py: the loopback TCP proxy the benchmark's slow network goes through.

A real TCP echo server behind the real proxy process: every exchange takes at least
the configured round trip, bytes arrive intact and in order, EOF is passed on, and
the proxy stops by itself (time bound) and when its parent closes its stdin."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from support.paths import REPO

PROXY = REPO / "bench" / "delayproxy.py"


@pytest.fixture
def echo_port():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=pump, args=(c,), daemon=True).start()

    def pump(c):
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    c.shutdown(socket.SHUT_WR)
                    return
                c.sendall(d)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def start(target: int, *args: str) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, str(PROXY), "--target", str(target), *args],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = json.loads(p.stdout.readline())
    return p, info["ports"][str(target)]


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def exchange(s: socket.socket) -> float:
    t = time.monotonic()
    s.sendall(b"x")
    assert s.recv(16) == b"x"
    return time.monotonic() - t


def test_every_exchange_takes_the_round_trip_and_a_new_connection_one_more(echo_port):
    p, port = start(echo_port, "--delay-ms", "40", "--max-seconds", "30")
    try:
        s = connect(port)
        first = exchange(s)
        rest = [exchange(s) for _ in range(4)]
        s.close()
        assert first >= 0.160          # handshake round trip + the exchange's own
        assert min(rest) >= 0.080      # 40 ms each way
        assert max(rest) < 0.080 + 0.5  # a delay, not a stall (generous: 2 shared cores)
    finally:
        p.stdin.close()
        p.wait(10)


def test_lateness_names_each_chunk_it_forwarded_and_how_late_it_went(echo_port, tmp_path):
    """--lateness: one line per chunk written (wall time, connection, direction, ms past its due
    time), so the bench can tell the proxy's own lag from the link's delay. A proxy held still
    (SIGSTOP, as a starved one is) while a chunk waits its delay sends it late, and says so."""
    log = tmp_path / "late.txt"
    p, port = start(echo_port, "--delay-ms", "100", "--max-seconds", "30", "--lateness", str(log))
    try:
        t0 = time.time()
        s = connect(port)
        for _ in range(3):
            exchange(s)
        s.sendall(b"y")
        time.sleep(0.03)              # read by the proxy, due 100 ms after it was
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGCONT)
        assert s.recv(16) == b"y"
        s.close()
        t1 = time.time()
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.stdin.close()
        p.wait(10)
    rows = [line.split() for line in log.read_text().splitlines()]
    assert [r[2] for r in rows[:8]] == [">", "<"] * 4      # each byte out, then its echo back
    assert {r[1] for r in rows} == {"1"}                    # one connection
    assert all(t0 <= float(r[0]) <= t1 + 1 and float(r[3]) >= 0 for r in rows), rows
    assert float(rows[6][3]) >= 200, rows                   # the stopped byte: about 400 ms late


def test_bulk_data_arrives_intact_in_order_and_eof_is_passed_on(echo_port):
    p, port = start(echo_port, "--delay-ms", "20", "--max-seconds", "30")
    try:
        s = connect(port)
        data = bytes(range(256)) * 40000   # 10 MB
        sender = threading.Thread(target=lambda: (s.sendall(data), s.shutdown(socket.SHUT_WR)))
        t = time.monotonic()
        sender.start()
        got = bytearray()
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        took = time.monotonic() - t
        sender.join()
        s.close()
        assert bytes(got) == data
        # latency is added, throughput is not capped: 10 MB in far less than one
        # round trip per chunk would take
        assert took < 5
    finally:
        p.stdin.close()
        p.wait(10)


def test_stops_by_itself_after_max_seconds(echo_port):
    p, port = start(echo_port, "--delay-ms", "1", "--max-seconds", "1", "--ignore-stdin")
    try:
        assert p.wait(10) == 0
        with pytest.raises(OSError):
            connect(port).recv(1)
    finally:
        if p.poll() is None:
            p.kill()


def test_stops_when_its_parent_closes_stdin(echo_port):
    p, port = start(echo_port, "--max-seconds", "600")
    s = connect(port)
    p.stdin.close()
    assert p.wait(10) == 0
    s.settimeout(5)
    assert s.recv(1) == b""   # open connections are closed, not left hanging
    s.close()


def test_listens_on_loopback_only(echo_port):
    p, port = start(echo_port, "--max-seconds", "30")
    try:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
        local = [line.split()[3] for line in out.splitlines() if line.strip()]
        assert local == [f"127.0.0.1:{port}"]
    finally:
        p.stdin.close()
        p.wait(10)


def test_bad_arguments_are_refused_without_a_traceback():
    p = subprocess.run([sys.executable, str(PROXY), "--target", "70000"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    assert p.returncode != 0 and "70000" in (p.stdout + p.stderr) and "Traceback" not in p.stderr


def test_the_timeline_reads_each_phase_of_a_connection_from_the_trace(tmp_path):
    """bench/proxy_timeline.py's reading of --trace: a host that answers a 20 KB job after 30 ms
    of its own work and a laptop that judges the answer for 20 ms before its 20 KB apply. The
    pre-flight is the round trip and the host's work; the laptop's 20 ms is told apart from it."""
    sys.path.insert(0, str(REPO / "bench"))
    import proxy_timeline

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def read_at_least(c, n):
        got = b""
        while len(got) < n:
            chunk = c.recv(65536)
            assert chunk, "closed early"
            got += chunk

    def host():
        c, _ = srv.accept()
        with c:
            c.sendall(b"SSH-2.0-host\r\n")
            read_at_least(c, 14 + 20_000)      # the version line, then the job
            time.sleep(0.03)                   # the agent's start and read
            c.sendall(b"a" * 10_000)
            read_at_least(c, 20_000)           # the apply
            c.sendall(b"done")

    threading.Thread(target=host, daemon=True).start()
    trace = tmp_path / "trace.txt"
    p, port = start(srv.getsockname()[1], "--delay-ms", "100", "--max-seconds", "30", "--trace", str(trace))
    try:
        t0 = time.monotonic()
        s = connect(port)
        s.sendall(b"SSH-2.0-laptop\r\n")
        read_at_least(s, 14)                   # the host's version line before the job, as in SSH
        s.sendall(b"j" * 20_000)
        read_at_least(s, 10_000)
        time.sleep(0.02)                       # the laptop's judgement
        s.sendall(b"p" * 20_000)
        read_at_least(s, 4)
        s.close()
        time.sleep(0.2)
    finally:
        p.stdin.close()
        p.wait(10)
    srv.close()
    (events,) = proxy_timeline.connections(trace.read_text().splitlines(), t0).values()
    phases = proxy_timeline.host_phases(events, 0.100)
    assert phases["first_bytes"] < phases["job_sent"] < phases["apply_sent"] <= phases["end"], phases
    assert 0.200 + 0.030 - 0.005 <= phases["preflight"] < 0.200 + 0.030 + 0.5, phases   # 2 x 100 ms + 30 ms
    # the answer's way back (100 ms) is the pre-flight's, not the laptop's: told apart, not added twice
    assert 0.020 - 0.005 <= phases["laptop"] < 0.020 + 0.080, phases
