"""The Docker Engine API over its unix socket: what a container host's agent asks the
daemon (inspect, stop, start, the log since a restart) without starting the `docker` CLI.

Why: the CLI is a Go program that starts, reads its config and then makes the same one
API call. Inside a rollout on a loaded machine a `docker inspect` took 0.06-0.1 s of wall
time and ~0.017 s of CPU, and a container deploy started it 6 times per host plus the
long-running `docker logs --follow`; the same call over the socket takes about 1 ms and
0.5 ms of CPU. The CLI stays the way in wherever this side cannot be sure it reaches the
daemon the CLI would: another runtime (podman), DOCKER_HOST other than unix://, a CLI
context (DOCKER_CONTEXT, or a `currentContext` in the CLI's config), or no socket there.
"""
import json
import os
import time

from .http import HTTPReader, read_http_response

DEFAULT_SOCK = "/var/run/docker.sock"


def api_socket(runtime, env=None):
    """The daemon's socket path when `runtime` is Docker and the CLI would talk to that very
    socket; None when only the CLI knows where it goes (then the CLI is used)."""
    env = os.environ if env is None else env
    if os.path.basename(runtime) != "docker" or env.get("DOCKER_CONTEXT"):
        return None
    host = env.get("DOCKER_HOST")
    if host:
        if not host.startswith("unix://"):
            return None
        sock = host[len("unix://"):]
    else:
        if cli_context(env):
            return None
        sock = DEFAULT_SOCK
    return sock if sock.startswith("/") and os.path.exists(sock) else None


def cli_context(env):
    """The CLI config's currentContext, when it names one other than the default."""
    conf = env.get("DOCKER_CONFIG") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".docker")
    try:
        with open(os.path.join(conf, "config.json"), "rb") as f:
            ctx = json.loads(f.read().decode("utf-8", "replace")).get("currentContext")
    except (IOError, OSError, ValueError, AttributeError):
        return None
    return ctx if ctx and ctx != "default" else None


def connect(sock_path, timeout):
    """A connected AF_UNIX socket; OSError (ENOENT, ECONNREFUSED, EACCES, ...) as the kernel says."""
    import _socket   # socket.py's enums cost milliseconds at every agent start
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(sock_path)
    except OSError:
        sock.close()
        raise
    return sock


def request_bytes(method, path, version="1.1"):
    return ("%s %s HTTP/%s\r\nHost: docker\r\nAccept-Encoding: identity\r\nConnection: close\r\n"
            "Content-Length: 0\r\n\r\n" % (method, path, version)).encode("latin-1")


def call(sock_path, method, path, timeout, limit=16 << 20):
    """(status, body) of one API call; OSError when the socket cannot be reached, ValueError
    when what came back is not HTTP."""
    deadline = time.monotonic() + timeout
    sock = connect(sock_path, timeout)
    try:
        sock.sendall(request_bytes(method, path))
        return read_http_response(HTTPReader(sock, deadline), limit)
    finally:
        sock.close()


def quote(name):
    """A container name or id as one path segment (names are [a-zA-Z0-9_.-], ids hex)."""
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
    return "".join(chr(b) if b in safe else "%%%02X" % b for b in bytearray(name.encode("utf-8")))


def message(body):
    """The daemon's error text from its JSON error body (or the body itself)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        return json.loads(text).get("message") or text
    except (ValueError, AttributeError):
        return text


class LogStream(object):
    """`GET /containers/ID/logs?follow=1&timestamps=1&since=T` read without blocking: the raw
    bytes of the container's output, in order, each line with the daemon's timestamp. Asked
    in HTTP/1.0 so that the body is the stream itself (no chunked framing) until the daemon
    closes it; a container without a TTY sends each write in a frame of an 8-byte header
    (stream, 0, 0, 0, size as 4 bytes big-endian) and its payload."""

    def __init__(self, sock_path, container, since, tty, timeout=30.0):
        self.tty = tty
        self.sock = connect(sock_path, timeout)
        self.closed = False
        path = "/containers/%s/logs?follow=1&stdout=1&stderr=1&timestamps=1&since=%.9f" % (quote(container), since)
        self.sock.sendall(request_bytes("GET", path, "1.0"))
        reader = HTTPReader(self.sock, time.monotonic() + timeout)
        head = b""
        while b"\r\n\r\n" not in head:   # the daemon answers its headers at once
            if not reader.fill():
                raise ValueError("the daemon closed the log stream before its headers")
            head, reader.buf = head + reader.buf, b""
        head, _, rest = head.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError("the daemon did not answer in HTTP: %r" % status_line[:80])
        self.status = int(parts[1])
        self.pending = rest   # bytes of the body not parsed into frames yet
        self.sock.setblocking(False)
        self.error = None
        if self.status != 200:
            self.sock.setblocking(True)
            self.sock.settimeout(5)
            body = rest
            try:
                while len(body) < 65536:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        break
                    body += chunk
            except OSError:
                pass
            self.error = message(body)
            self.close()

    def fileno(self):
        return -1 if self.closed else self.sock.fileno()

    def read(self, budget):
        """(bytes of the output, at most about `budget`; True when more is waiting, True when
        the daemon has ended the stream)."""
        chunks, size, ended = [], len(self.pending), self.closed
        while not ended and size < budget:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                ended = True
                break
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
            size += len(chunk)
        data = self.pending + b"".join(chunks)
        if self.tty:
            self.pending = b""
            out = data
        else:
            out, self.pending = deframe(data)
        if ended:
            self.close()
        return out, size >= budget, ended

    def close(self):
        if not self.closed:
            self.closed = True
            self.sock.close()


def deframe(data):
    """(payload of the whole frames in `data`, the bytes of an incomplete last frame)."""
    out, pos = [], 0
    while len(data) - pos >= 8:
        size = int.from_bytes(data[pos + 4:pos + 8], "big")
        if len(data) - pos - 8 < size:
            break
        out.append(data[pos + 8:pos + 8 + size])
        pos += 8 + size
    return b"".join(out), data[pos:]
