"""A container host's agent asks the Docker daemon over its unix socket (issue 34): when it
does (and when it leaves it to the CLI), how it reads the daemon's framed log stream, and
what a refused socket says. The calls against a real daemon run in tests/fleet/test_container_*."""
from __future__ import annotations

import json
import socket
import time

import pytest

from fleetpatch.agent import runtime_api
from fleetpatch.agent.base import AgentError
from fleetpatch.agent.container import resolve


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


@pytest.fixture
def dead_socket(tmp_path):
    """A unix socket file that nobody listens on any more (connect: ECONNREFUSED)."""
    path = str(tmp_path / "docker.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    return path


def test_the_socket_is_used_only_where_the_cli_would_go_too(tmp_path, dead_socket):
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    unix = {"DOCKER_HOST": f"unix://{dead_socket}", "HOME": str(home)}
    assert runtime_api.api_socket("docker", unix) == dead_socket
    assert runtime_api.api_socket("/usr/bin/docker", unix) == dead_socket
    assert runtime_api.api_socket("podman", unix) is None                       # podman: its CLI
    assert runtime_api.api_socket("docker", dict(unix, DOCKER_HOST="tcp://10.0.0.1:2375")) is None
    assert runtime_api.api_socket("docker", dict(unix, DOCKER_CONTEXT="rootless")) is None
    assert runtime_api.api_socket("docker", dict(unix, DOCKER_HOST=f"unix://{tmp_path}/none.sock")) is None
    # no DOCKER_HOST: a context chosen in the CLI's config leaves it to the CLI
    (home / ".docker" / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    assert runtime_api.api_socket("docker", {"HOME": str(home)}) is None
    (home / ".docker" / "config.json").write_text(json.dumps({"currentContext": "default"}))
    assert runtime_api.cli_context({"HOME": str(home)}) is None
    (home / ".docker" / "config.json").write_text("not json")
    assert runtime_api.cli_context({"HOME": str(home)}) is None


def test_framed_output_is_joined_and_a_cut_frame_waits_for_its_rest():
    data = frame(1, b"2026-12-06T05:00:00.1Z one\n") + frame(2, b"2026-12-06T05:00:00.2Z two\n")
    tail = frame(1, b"2026-12-06T05:00:00.3Z three\n")
    out, rest = runtime_api.deframe(data + tail[:11])
    assert out == b"2026-12-06T05:00:00.1Z one\n2026-12-06T05:00:00.2Z two\n"
    assert rest == tail[:11]
    out, rest = runtime_api.deframe(rest + tail[11:])
    assert out == b"2026-12-06T05:00:00.3Z three\n" and rest == b""
    assert runtime_api.deframe(tail[:5]) == (b"", tail[:5])


def test_a_container_name_is_one_path_segment():
    assert runtime_api.quote("sglang-h01_x.2") == "sglang-h01_x.2"
    assert runtime_api.quote("a/../b?c") == "a%2F..%2Fb%3Fc"


def test_a_socket_nobody_answers_is_one_line_before_anything_changes(dead_socket, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead_socket}")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    with pytest.raises(AgentError) as e:
        resolve({"container": {"name": "sglang-x", "runtime": "docker"}})
    msg = e.value.message
    assert msg.startswith(f"container sglang-x (docker): the runtime cannot be reached: cannot connect to "
                          f"{dead_socket}"), msg
    assert "nothing was changed" in msg and "\n" not in msg


def test_the_log_stream_reads_a_daemon_answer_frame_by_frame(tmp_path):
    """LogStream against a unix socket server that answers as the daemon does (HTTP/1.0, the
    body the framed stream until it closes), the frames arriving cut anywhere."""
    import threading
    path = str(tmp_path / "d.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    body = frame(1, b"2026-12-06T05:00:00.1Z ready\n") + frame(2, b"2026-12-06T05:00:00.2Z err\n")
    asked = []
    go = threading.Event()

    def serve():
        conn, _ = srv.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        asked.append(head.decode())
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n\r\n" + body[:13])
        go.wait(5)
        conn.sendall(body[13:])
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    stream = runtime_api.LogStream(path, "abc123", 1796534565.5, tty=False)
    got = b""
    got += stream.read(1 << 20)[0]
    go.set()
    t.join(5)
    ended = False
    for _ in range(200):
        out, _, ended = stream.read(1 << 20)
        got += out
        if ended:
            break
        time.sleep(0.02)
    srv.close()
    assert asked[0].startswith("GET /containers/abc123/logs?follow=1&stdout=1&stderr=1&timestamps=1&since="
                               "1796534565.500000000 HTTP/1.0\r\n")
    assert got == b"2026-12-06T05:00:00.1Z ready\n2026-12-06T05:00:00.2Z err\n" and ended
