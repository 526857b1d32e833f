"""The agent's minimal HTTP client: health checks, a worker's load, the smoke request.

Every call goes direct to the server it names: never through the operator's
http_proxy/https_proxy (a server on a private or loopback address would be
asked through the proxy, or not at all), so the plain-http path speaks over a
socket of its own and the https fallback uses a urllib opener without proxies.
"""
import json
import time


def http_get(url, timeout=2.0, headers=None):
    """(status, body) or (None, error). `headers`: extra request headers (the server's API key)."""
    return http_request("GET", url, None, timeout, headers=headers)


def http_request(method, url, data, timeout, limit=1 << 20, headers=None):
    """(status, body) or (None, error), spoken over a socket here, so the host needs no
    curl. Not http.client: it imports email, ssl and urllib.parse, about 17 ms of CPU at
    every agent start (a probe checks health), which a fleet pays once per host. An https
    URL (or anything but plain http://host:port/path) goes through urllib, with its proxy
    handling off: the server is asked directly either way."""
    target = split_http_url(url)
    if target is None:
        return _urllib_request(method, url, data, timeout, limit, headers)
    host, port, path = target
    deadline = time.monotonic() + timeout
    try:
        sock = http_connect(host, port, timeout)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(http_request_bytes(method, host, port, path, data, headers))
            return read_http_response(HTTPReader(sock, deadline), limit)
        finally:
            sock.close()
    except (OSError, ValueError) as e:   # a timeout is an OSError
        return None, (str(e) or type(e).__name__).encode()


def split_http_url(url):
    """(host, port, path) of a plain http:// URL; None for anything else."""
    if not url[:7].lower() == "http://":
        return None
    rest = url[7:].split("#", 1)[0]
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0] or [len(rest)])
    netloc, path = rest[:cut], rest[cut:]
    if "@" in netloc or not netloc:
        return None
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            return None
        host, tail = netloc[1:end], netloc[end + 1:]
    else:
        host, sep, port = netloc.partition(":")
        tail = sep + port
    if not host or tail and (tail[0] != ":" or not tail[1:].isdigit() or not 0 < int(tail[1:]) < 65536):
        return None
    path = path if path.startswith("/") else "/" + path
    return host, int(tail[1:]) if tail else 80, path


def http_connect(host, port, timeout):
    import _socket   # socket.py's enums cost milliseconds at every agent start
    last = None
    for family, kind, proto, _, addr in _socket.getaddrinfo(_no_idna(host), port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect((_no_idna(addr[0]),) + tuple(addr[1:]))
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last or OSError("no address for %s" % host)


def _no_idna(name):
    """A str host goes through the idna codec (which imports stringprep and unicodedata);
    for an ASCII name or address that encoding is the name itself."""
    return name.encode("ascii") if name.isascii() else name


def http_request_bytes(method, host, port, path, data, headers=None):
    authority = ("[%s]" % host if ":" in host else host) + ("" if port == 80 else ":%d" % port)
    head = ("%s %s HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: identity\r\nConnection: close\r\n"
            % (method, path, authority))
    for name, value in sorted((headers or {}).items()):
        head += "%s: %s\r\n" % (name, value)
    if data is not None:
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(data)
    return (head + "\r\n").encode("latin-1") + (data or b"")


class HTTPReader(object):
    """Buffered reads from a socket, each bounded by the request's deadline."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline, self.buf, self.eof = sock, deadline, b"", False

    def fill(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OSError("timed out")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        self.buf += chunk
        self.eof = not chunk
        return bool(chunk)

    def line(self, most=65536):
        while b"\r\n" not in self.buf:
            if len(self.buf) > most or not self.fill():
                raise ValueError("the server sent an incomplete HTTP response")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def take(self, n):
        while len(self.buf) < n and self.fill():
            pass
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def read_http_response(reader, limit):
    """(status, body up to limit bytes): the status line, the headers, then a body by
    Content-Length, chunked, or to the end of the connection."""
    while True:
        status_line = reader.line().decode("latin-1")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError("the server did not answer in HTTP: %r" % status_line[:80])
        headers = {}
        while True:
            line = reader.line().decode("latin-1")
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(parts[1])
        if not 100 <= status < 200:   # an interim 1xx answer is followed by the real one
            break
    if status in (204, 304):
        return status, b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, read_chunked(reader, limit)
    if headers.get("content-length", "").isdigit():
        return status, reader.take(min(limit, int(headers["content-length"])))
    while not reader.eof and len(reader.buf) < limit and reader.fill():
        pass
    return status, reader.buf[:limit]


def read_chunked(reader, limit):
    body = b""
    while len(body) < limit:
        size = reader.line().split(b";", 1)[0].strip()
        try:
            n = int(size, 16)
        except ValueError:
            raise ValueError("the server sent a bad chunk size: %r" % size[:20])
        if n == 0:
            break
        body += reader.take(n)
        reader.line()
    return body[:limit]


def _urllib_request(method, url, data, timeout, limit, extra=None):
    """urllib, for what the socket path does not speak (https, a user in the URL), and
    direct like it: an opener with no proxy handler ignores http_proxy/https_proxy."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"} if data is not None else {}
    headers.update(extra or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=data, method=method, headers=headers),
                         timeout=timeout) as resp:
            return resp.status, resp.read(limit)
    except urllib.error.HTTPError as e:
        return e.code, e.read(4096)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e)).encode()


def http_post_json(url, body, timeout, headers=None):
    """(status, body bytes) or (None, error text)."""
    return http_request("POST", url, json.dumps(body).encode("utf-8"), timeout, headers=headers)
