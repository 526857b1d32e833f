"""The agent's own HTTP client (health checks, /v1/loads, the smoke request) against
real HTTP servers: what the server said, bounded waits, no proxy detour."""
from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from fleetpatch.agent import http as agent_http


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"ok")
        elif self.path == "/down":
            self._send(503, b"draining")
        elif self.path == "/chunked":
            self.protocol_version = "HTTP/1.1"
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, b"late")
        else:
            self._send(404, b"")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, json.dumps({"echo": json.loads(body), "type": self.headers["Content-Type"]}).encode())

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass   # the slow handler writes after the client gave up: that is the point


@pytest.fixture(scope="module")
def server():
    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_a_healthy_server_answers_200_with_its_body(server):
    assert agent_http.http_get(server + "/health") == (200, b"ok")


def test_an_error_status_is_the_servers_not_a_failure(server):
    assert agent_http.http_get(server + "/down") == (503, b"draining")


def test_a_chunked_answer_is_put_together(server):
    assert agent_http.http_get(server + "/chunked") == (200, b"hello world")


def test_a_post_sends_json(server):
    status, body = agent_http.http_post_json(server + "/generate", {"text": "hi"}, timeout=5)
    assert status == 200
    assert json.loads(body) == {"echo": {"text": "hi"}, "type": "application/json"}


def test_a_slow_server_is_given_up_on_at_the_timeout(server):
    t = time.monotonic()
    status, err = agent_http.http_get(server + "/slow", timeout=0.5)
    assert status is None and err
    assert time.monotonic() - t < 2


def test_nothing_listening_is_an_error_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, err = agent_http.http_get(f"http://127.0.0.1:{port}/health", timeout=1)
    assert status is None and b"refused" in err.lower()


def test_the_operators_http_proxy_does_not_catch_a_loopback_health_check(server, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert agent_http.http_get(server + "/health") == (200, b"ok")


class RecordingListener:
    """A TCP listener that records each connection made to it (a stand-in proxy, or a
    target that does not speak TLS) and closes it at once."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connections = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.connections.append(conn.recv(4096))
            except OSError:
                self.connections.append(b"")
            conn.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def proxy(monkeypatch):
    """The operator's proxy, as the environment names it for every scheme."""
    listener = RecordingListener()
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{listener.port}")
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    yield listener
    listener.close()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_https_request_goes_direct_not_through_the_operators_proxy(proxy, method):
    """An https server (urllib's part of the client) is still asked directly: the operator's
    proxy never sees the agent's health, drain or smoke calls."""
    target = RecordingListener()
    try:
        url = f"https://127.0.0.1:{target.port}/generate"
        status, _ = (agent_http.http_get(url, timeout=2) if method == "GET"
                     else agent_http.http_post_json(url, {"text": "hi"}, timeout=2))
        assert status is None   # the target does not speak TLS: an error, not an answer
        assert proxy.connections == [], f"the request went through the proxy: {proxy.connections[:1]}"
        assert len(target.connections) == 1 and target.connections[0][:1] == b"\x16", "a TLS hello, sent direct"
    finally:
        target.close()


def test_a_post_to_the_server_goes_direct_with_the_proxy_set(server, proxy):
    status, body = agent_http.http_post_json(server + "/generate", {"text": "hi"}, timeout=5)
    assert status == 200 and json.loads(body)["echo"] == {"text": "hi"}
    assert proxy.connections == []


def test_an_ipv6_loopback_server_is_reached_by_its_bracketed_address():
    class V6(Server):
        address_family = socket.AF_INET6
    try:
        srv = V6(("::1", 0), Handler)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert agent_http.http_get(f"http://[::1]:{srv.server_address[1]}/health") == (200, b"ok")
    finally:
        srv.shutdown()


def test_a_listener_that_does_not_speak_http_is_an_error_naming_what_it_said():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def answer():
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
            conn.close()
        threading.Thread(target=answer, daemon=True).start()
        status, err = agent_http.http_get(f"http://127.0.0.1:{listener.getsockname()[1]}/health", timeout=2)
    assert status is None and b"SSH-2.0" in err


@pytest.mark.parametrize("url, target", [
    ("http://127.0.0.1:30000/health", ("127.0.0.1", 30000, "/health")),
    ("http://localhost/health?x=1#frag", ("localhost", 80, "/health?x=1")),
    ("HTTP://[::1]:8080", ("::1", 8080, "/")),
    ("http://h:8080?q", ("h", 8080, "/?q")),
    # everything else goes to urllib, whose error says what is wrong
    ("https://h/health", None), ("http://user@h/", None), ("http://h:99999/", None),
    ("http://h:x/", None), ("http://[::1/", None), ("http:///x", None), ("http://:8080/", None),
])
def test_only_a_plain_http_url_is_spoken_over_the_socket(url, target):
    assert agent_http.split_http_url(url) == target
