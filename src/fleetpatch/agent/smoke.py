"""The smoke requests of a restart, sent from the host once the server is ready.

They run in a thread beside the follow, which keeps streaming the log meanwhile;
the follow says when they began and ended (host clock), so the laptop takes its
verdict after them. The answers are the laptop's to judge."""
import json
import threading
import time

from .base import pack
from .http import http_post_json


class SmokeRequests(object):
    """`requests` POSTs of `prompt` to `url`/generate, `concurrency` at a time."""

    def __init__(self, spec):
        self.spec = spec
        self.thread = None
        self.started = None
        self.ended = None
        self.answers = []      # (status, body) per request, in the order they were sent
        self.told = False

    def start(self):
        self.started = time.time()
        self.thread = threading.Thread(target=self._run, name="fleetpatch-smoke")
        self.thread.daemon = True
        self.thread.start()

    def _run(self):
        total = max(0, int(self.spec.get("requests", 1)))
        slots = list(range(total))
        answers = [None] * total
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not slots:
                        return
                    i = slots.pop(0)
                answers[i] = self._one()

        threads = [threading.Thread(target=worker) for _ in range(max(1, min(total, int(self.spec.get("concurrency", 1)))))]
        for t in threads:
            t.daemon = True
            t.start()
        for t in threads:
            t.join()
        self.answers = answers
        self.ended = time.time()

    def _one(self):
        status, body = http_post_json(self.spec["url"].rstrip("/") + "/generate",
                                      {"text": self.spec.get("prompt", "Hello"),
                                       "sampling_params": {"max_new_tokens": int(self.spec.get("max_new_tokens", 8)),
                                                           "temperature": 0}},
                                      float(self.spec.get("timeout", 60)))
        return status, body if isinstance(body, bytes) else str(body).encode("utf-8", "replace")

    def event(self):
        """The `smoke` event once every answer is in (once), else None."""
        if self.told or self.thread is None or self.thread.is_alive():
            return None
        self.told = True
        # every answer's status; the first bad answer's body (else the first one's) suffices
        bad = next((a for a in self.answers if not answered_text(a)), None)
        shown = [bad or self.answers[0]] if self.answers else []
        return {"t": "smoke", "started": self.started, "ended": self.ended,
                "statuses": [a[0] for a in self.answers],
                "bodies": [{"status": a[0], "body": pack(a[1][:65536])} for a in shown]}


def answered_text(answer):
    """Whether a /generate answer is HTTP 200 with a non-empty string `text` (the laptop says why not)."""
    status, body = answer
    if status != 200:
        return False
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("text"), str) and bool(doc["text"])
