"""A bounded load generator: a steady mix of streaming and plain /generate requests.

Loopback only, bounded in requests and in time, stops by itself. Each of
``concurrency`` threads sends one request after another. Streams are spread
evenly at ``stream_share`` of the requests, and request i asks for
``tokens[i % len(tokens)]`` new tokens (so some requests can outlast a
server's stop grace). Outcomes:

* ok: HTTP 200 and a well-formed answer (plain: JSON with a string
  ``text``; stream: ``data: {...}`` events ending ``data: [DONE]``).
* cut: a stream that started (HTTP 200) and ended without ``[DONE]`` - the
  router ends a stream cut by a dying worker this way, with no error.
* failed: anything else (connection refused or reset before an answer, an
  HTTP error, a malformed answer, a timeout, an ``error`` event).

``python -m fleetpatch_demo.loadgen http://127.0.0.1:30080 --seconds 10``
prints the counts as JSON. stdlib only.
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

MAX_SECONDS = 3600.0
MAX_REQUESTS = 1_000_000
OK, CUT, FAILED = "ok", "cut", "failed"


@dataclass
class Outcome:
    index: int
    stream: bool
    tokens: int
    started: float
    ended: float
    result: str                  # OK | CUT | FAILED
    detail: str = ""


def _loopback(url: str) -> tuple:
    p = urllib.parse.urlsplit(url)
    if p.scheme != "http" or p.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError("the load generator only sends to http://127.0.0.1, localhost or [::1], not %r" % url)
    return p.hostname, p.port or 80, (p.path.rstrip("/") or "") + "/generate"


def send_one(url: str, stream: bool, tokens: int, timeout: float = 30.0, prompt: str = "Hello") -> tuple:
    """(result, detail) of one /generate through `url`."""
    host, port, path = _loopback(url)
    body = json.dumps({"text": prompt, "stream": stream, "sampling_params": {"max_new_tokens": tokens}})
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            return FAILED, "no answer: %s" % (e.__class__.__name__ + (": %s" % e if str(e) else ""))
        if r.status != 200:
            return FAILED, "HTTP %d %s" % (r.status, r.read(200).decode("utf-8", "replace"))
        if not stream:
            try:
                raw = r.read()
                doc = json.loads(raw.decode("utf-8"))
            except (OSError, http.client.HTTPException, ValueError) as e:
                return FAILED, "bad answer: %s" % e.__class__.__name__
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                return FAILED, "answer without a string 'text'"
            return OK, ""
        events = 0
        try:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return OK, "%d events" % events
                try:
                    doc = json.loads(data.decode("utf-8"))
                except ValueError:
                    return FAILED, "malformed event %r" % data[:80]
                if isinstance(doc, dict) and "error" in doc:
                    return FAILED, "error event: %s" % json.dumps(doc["error"])[:200]
                events += 1
        except (OSError, http.client.HTTPException) as e:
            return CUT, "after %d events: %s" % (events, e.__class__.__name__)
        return CUT, "ended after %d events without [DONE]" % events
    finally:
        conn.close()


@dataclass
class LoadGen:
    """Closed-loop load through one URL; use as a context manager or call run()."""

    url: str
    concurrency: int = 4
    stream_share: float = 0.5            # fraction of requests that stream
    tokens: Sequence[int] = (8, 40, 120)  # max_new_tokens, cycled
    max_requests: int = 10_000
    max_seconds: float = 600.0
    pause: float = 0.0                   # seconds between one thread's requests
    timeout: float = 30.0                # per request
    outcomes: List[Outcome] = field(default_factory=list)

    def __post_init__(self):
        _loopback(self.url)
        if not 1 <= self.concurrency <= 256:
            raise ValueError("concurrency must be 1..256, got %r" % self.concurrency)
        if not 0.0 <= self.stream_share <= 1.0:
            raise ValueError("stream_share must be within 0..1, got %r" % self.stream_share)
        if not self.tokens or any(int(t) < 1 for t in self.tokens):
            raise ValueError("tokens must be positive integers, got %r" % (self.tokens,))
        self.max_requests = max(1, min(int(self.max_requests), MAX_REQUESTS))
        self.max_seconds = max(0.1, min(float(self.max_seconds), MAX_SECONDS))
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._deadline = None
        self.in_flight = 0

    def _is_stream(self, i: int) -> bool:
        # spread evenly: request i streams when the running share would fall short
        return int((i + 1) * self.stream_share) > int(i * self.stream_share)

    def _take(self) -> Optional[int]:
        with self._lock:
            if self._stop.is_set() or self._next >= self.max_requests or time.monotonic() >= self._deadline:
                return None
            i = self._next
            self._next += 1
            self.in_flight += 1
            return i

    def _loop(self) -> None:
        while True:
            i = self._take()
            if i is None:
                return
            stream = self._is_stream(i)
            tokens = int(self.tokens[i % len(self.tokens)])
            t0 = time.time()
            try:
                result, detail = send_one(self.url, stream, tokens, self.timeout)
            except Exception as e:  # never lose a request from the counts
                result, detail = FAILED, "client error: %r" % e
            with self._lock:
                self.outcomes.append(Outcome(i, stream, tokens, t0, time.time(), result, detail))
                self.in_flight -= 1
            if self.pause:
                self._stop.wait(self.pause)

    def start(self) -> "LoadGen":
        self._deadline = time.monotonic() + self.max_seconds
        for n in range(self.concurrency):
            t = threading.Thread(target=self._loop, name="loadgen-%d" % n, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, wait: float = 60.0) -> Dict[str, int]:
        """Send no new request; wait (bounded) for those in flight; the counts."""
        self._stop.set()
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.counts()

    def wait(self) -> Dict[str, int]:
        """Until the request or time bound is reached."""
        for t in self._threads:
            t.join(self.max_seconds + self.timeout + 5)
        return self.counts()

    def run(self) -> Dict[str, int]:
        return self.start().wait()

    def counts(self) -> Dict[str, int]:
        with self._lock:
            done = list(self.outcomes)
            sent = self._next
        c = {"sent": sent, OK: 0, FAILED: 0, CUT: 0,
             "streams": sum(1 for o in done if o.stream), "in_flight": sent - len(done)}
        for o in done:
            c[o.result] += 1
        return c

    def bad(self) -> List[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.result != OK]

    def __enter__(self) -> "LoadGen":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetpatch_demo.loadgen", description=__doc__.split("\n")[0])
    ap.add_argument("url", help="the router (or a worker) on loopback, e.g. http://127.0.0.1:30080")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--stream-share", type=float, default=0.5)
    ap.add_argument("--tokens", default="8,40,120", help="max_new_tokens to cycle through, comma-separated")
    a = ap.parse_args(argv)
    try:
        lg = LoadGen(a.url, concurrency=a.concurrency, stream_share=a.stream_share,
                     tokens=[int(t) for t in a.tokens.split(",") if t.strip()],
                     max_requests=a.requests, max_seconds=a.seconds)
    except ValueError as e:
        print("loadgen: %s" % e, file=sys.stderr)
        return 2
    counts = lg.run()
    print(json.dumps(counts))
    return 0 if counts[FAILED] == 0 and counts[CUT] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
