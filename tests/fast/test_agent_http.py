"""The agent's own HTTP client (health checks, /v1/loads, the smoke request) against
real HTTP servers: what the server said, bounded waits, no proxy detour."""
from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from fleetpatch import hostagent


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
    assert hostagent.http_get(server + "/health") == (200, b"ok")


def test_an_error_status_is_the_servers_not_a_failure(server):
    assert hostagent.http_get(server + "/down") == (503, b"draining")


def test_a_chunked_answer_is_put_together(server):
    assert hostagent.http_get(server + "/chunked") == (200, b"hello world")


def test_a_post_sends_json(server):
    status, body = hostagent.http_post_json(server + "/generate", {"text": "hi"}, timeout=5)
    assert status == 200
    assert json.loads(body) == {"echo": {"text": "hi"}, "type": "application/json"}


def test_a_slow_server_is_given_up_on_at_the_timeout(server):
    t = time.monotonic()
    status, err = hostagent.http_get(server + "/slow", timeout=0.5)
    assert status is None and err
    assert time.monotonic() - t < 2


def test_nothing_listening_is_an_error_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, err = hostagent.http_get(f"http://127.0.0.1:{port}/health", timeout=1)
    assert status is None and b"refused" in err.lower()


def test_the_operators_http_proxy_does_not_catch_a_loopback_health_check(server, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert hostagent.http_get(server + "/health") == (200, b"ok")


def test_an_ipv6_loopback_server_is_reached_by_its_bracketed_address():
    class V6(Server):
        address_family = socket.AF_INET6
    try:
        srv = V6(("::1", 0), Handler)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert hostagent.http_get(f"http://[::1]:{srv.server_address[1]}/health") == (200, b"ok")
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
        status, err = hostagent.http_get(f"http://127.0.0.1:{listener.getsockname()[1]}/health", timeout=2)
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
    assert hostagent.split_http_url(url) == target
