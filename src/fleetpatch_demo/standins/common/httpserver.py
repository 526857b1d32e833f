"""The HTTP side every stand-in shares: a threading server and a uvicorn-like handler base.

* ``UvicornHandler``: a ``BaseHTTPRequestHandler`` that presents itself as uvicorn
  (HTTP/1.1, ``server: uvicorn``), with ``send_body``, ``send_chunk`` (chunked transfer),
  ``read_body``, ``request_path`` and ``access_text`` (uvicorn's access line, without its
  level prefix); http.server's own stderr lines are silenced.
* ``StandinHTTPServer``, ``make_http_server(host, port, handler)`` (IPv6 when `host` has a
  colon), ``serve_in_thread(httpd, name)``.

Stdlib only; Python 3.8+.
"""
import socket
import threading

try:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
except ImportError:  # pragma: no cover - Python < 3.7
    from http.server import BaseHTTPRequestHandler, HTTPServer as ThreadingHTTPServer


class UvicornHandler(BaseHTTPRequestHandler):
    """Base of a stand-in's request handlers: answers as uvicorn does."""

    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def request_path(self):
        """The request's path without its query."""
        return self.path.split("?", 1)[0]

    def read_body(self):
        """The request's body (Content-Length bytes)."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_body(self, code, body=b"", ctype="application/json"):
        """A whole response: status, Content-Type, Content-Length, body (none for HEAD)."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_chunk(self, data):
        """One chunk of a chunked response (b"" ends it)."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def access_text(self, code):
        """uvicorn's access line for this request: 'ADDR:PORT - "REQUEST LINE" CODE REASON'."""
        try:
            code = int(getattr(code, "value", code))
        except (TypeError, ValueError):
            pass
        reason = self.responses.get(code, ("",))[0] if isinstance(code, int) else ""
        return '%s:%d - "%s" %s %s' % (self.client_address[0], self.client_address[1],
                                       self.requestline, code, reason)

    def log_message(self, fmt, *args):
        pass


class StandinHTTPServer(ThreadingHTTPServer):
    """A thread per request, daemon threads, the port reusable at once after a restart."""

    daemon_threads = True
    allow_reuse_address = True


def make_http_server(host, port, handler):
    """A StandinHTTPServer bound to (host, port), IPv6 when `host` has a colon."""
    cls = StandinHTTPServer
    if ":" in host:
        cls = type("StandinHTTPServer6", (StandinHTTPServer,), {"address_family": socket.AF_INET6})
    return cls((host, port), handler)


def serve_in_thread(httpd, name):
    """Serve `httpd` from a daemon thread named `name`; the thread."""
    thread = threading.Thread(target=httpd.serve_forever, name=name, daemon=True)
    thread.start()
    return thread
