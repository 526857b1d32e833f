"""A container host's follow wakes when the container writes (issue 34): the daemon's log stream's
socket is in the follow's select, beside the laptop's requests, instead of a 50 ms poll. Against a
unix socket server that answers as the daemon does (HTTP/1.0, the framed stream until it closes)."""
from __future__ import annotations

import os
import socket
import threading

from fleetpatch.agent.container import ContainerLogFollower
from fleetpatch.agent.follow import Follow
from fleetpatch.agent.logs import StreamWake
from fleetpatch.agent.state import RequestReader


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_the_follow_of_a_container_wakes_on_its_output_and_stops_watching_at_the_streams_end(tmp_path, monkeypatch):
    path = str(tmp_path / "docker.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    monkeypatch.setenv("DOCKER_HOST", "unix://" + path)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-config"))
    write, end = threading.Event(), threading.Event()

    def serve():
        conn, _ = srv.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n\r\n")
        write.wait(30)
        conn.sendall(frame(1, b"2026-12-06T05:00:00.1Z The server is fired up and ready to roll!\n"))
        end.wait(30)
        conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    follower = ContainerLogFollower("docker", "abc123", 1796534565.5)
    assert follower.stream is not None, "the daemon's socket is the way in"
    wake = Follow.wake_for(follower)
    assert isinstance(wake, StreamWake) and wake.watching()
    laptop_r, laptop_w = os.pipe()      # the laptop's requests: nothing comes on them here
    requests = RequestReader(laptop_r)
    assert follower.read() == []
    woken = []

    def wait_forever():
        # no deadline: only a readable descriptor ends this wait, and the laptop sends nothing
        woken.append(requests.poll(None, wake))

    for event in (write, end):
        waiter = threading.Thread(target=wait_forever, daemon=True)
        waiter.start()
        event.set()
        waiter.join(30)
        assert not waiter.is_alive(), "the follow slept through the container's output"
        assert woken.pop() is None and not requests.eof
        if event is write:
            assert follower.read() == [("container abc123", 1, ["The server is fired up and ready to roll!"])]
            assert wake.watching()
    assert follower.read() == [] and not wake.watching(), "an ended stream is watched no more (it would spin)"
    assert wake.fds() == ([wake.fd] if wake.fd is not None else [])
    follower.close()
    wake.close()
    os.close(laptop_r)
    os.close(laptop_w)
    srv.close()
