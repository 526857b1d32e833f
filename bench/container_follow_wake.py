"""A container follow's wait for output (issue 34): the old 50 ms poll against the wake on the
daemon's log stream. A unix socket server answers as the daemon does and writes one line every
`--every` s for `--seconds`; the follow's loop (RequestReader.poll with Follow's waits, then the
follower's read) runs in-process both ways. Prints, each way: wakes, CPU, and the delay from each
line's write to its read (median / max).

    PYTHONPATH=src python3 bench/container_follow_wake.py [--seconds 3] [--every 0.2]
"""
import argparse
import os
import socket
import statistics
import tempfile
import threading
import time

from fleetpatch.agent.container import ContainerLogFollower
from fleetpatch.agent.follow import Follow
from fleetpatch.agent.logs import StreamWake
from fleetpatch.agent.state import RequestReader


def frame(payload):
    return bytes([1, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def one(way, seconds, every):
    folder = tempfile.mkdtemp(prefix="fp-wake-")
    path = os.path.join(folder, "d.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    os.environ["DOCKER_HOST"] = "unix://" + path
    sent = {}

    def serve():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
        n = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(every)
            n += 1
            sent[n] = time.monotonic()
            conn.sendall(frame(b"2026-12-06T05:00:00.1Z line %d\n" % n))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    follower = ContainerLogFollower("docker", "bench", time.time())
    wake = StreamWake(follower) if way == "wake" else None
    r, w = os.pipe()
    requests = RequestReader(r)
    delays, wakes = [], 0
    cpu = time.process_time()
    while follower.stream is not None and not follower.stream.closed:
        wait = Follow.POLL_S if wake is None else Follow.WATCHED_POLL_S
        requests.poll(wait, wake)
        wakes += 1
        for _, _, lines in follower.read():
            now = time.monotonic()
            delays += [now - sent[int(l.split()[-1])] for l in lines]
    cpu = time.process_time() - cpu
    follower.close()
    srv.close()
    os.close(r)
    os.close(w)
    return wakes, cpu, delays


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--every", type=float, default=0.2)
    args = ap.parse_args()
    for way in ("poll", "wake", "poll", "wake"):
        wakes, cpu, delays = one(way, args.seconds, args.every)
        print("%-4s: %3d wakes, %.1f ms CPU, %d lines, delay from write to read: median %.2f ms, max %.2f ms"
              % (way, wakes, cpu * 1e3, len(delays), statistics.median(delays) * 1e3, max(delays) * 1e3))


if __name__ == "__main__":
    main()
