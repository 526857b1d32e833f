"""The smoke requests of a restart, sent from the host once the server is ready.

They run in a thread beside the follow, which keeps streaming the log meanwhile;
the follow says when they began and ended (host clock), so the laptop takes its
verdict after them. The answers are the laptop's to judge."""
import json
import os
import threading
import time

from .apikey import refused_text, scrub_bytes
from .base import pack
from .http import http_get, http_post_json


class SmokeRequests(object):
    """`requests` POSTs of `prompt` to the server (`url` + the profile's `path`), `concurrency` at a time;
    `server_key`: a callable giving the server's apikey.ServerKey once it runs (its key goes with each request)."""

    def __init__(self, spec, server_key=None, env_name=None):
        self.spec = spec
        self.server_key = server_key
        self.env_name = env_name
        self.found = None      # the ServerKey the requests were sent with
        self.thread = None
        self.started = None
        self.ended = None
        self.answers = []      # (status, body) per request, in the order they were sent
        self.told = False
        self.done = False      # every answer is in (set before the end is signalled on `end_fd`)
        self.end_fd = None     # readable once they are: the follow's select wakes on it, no polling

    def start(self):
        self.found = self.server_key() if self.server_key is not None else None
        self.started = time.time()
        try:
            self.end_fd, signal_fd = os.pipe()   # the thread owns (and closes) the writing end
            os.set_blocking(self.end_fd, False)
        except OSError:
            self.end_fd, signal_fd = None, None   # no pipe: the follow polls for the end
        self.thread = threading.Thread(target=self._signalled_run, args=(signal_fd,), name="fleetpatch-smoke")
        self.thread.daemon = True
        self.thread.start()

    def _signalled_run(self, signal_fd):
        try:
            self._run()
        finally:
            self.done = True
            if signal_fd is not None:
                try:
                    os.write(signal_fd, b"x")
                except OSError:   # the follow has ended and closed its end: nobody waits
                    pass
                os.close(signal_fd)

    def ended_signalled(self):
        """Read the end's signal (the follow's select saw `end_fd` readable). Its writing end closed,
        `end_fd` stays readable: the follow waits on it only until the event is told (Follow.wake)."""
        if self.end_fd is not None:
            try:
                os.read(self.end_fd, 16)
            except OSError:   # EAGAIN: nothing there
                pass

    def close(self):
        if self.end_fd is not None:
            os.close(self.end_fd)
            self.end_fd = None

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
        status, body = post_smoke(self.spec, self.spec.get("prompt", "Hello"), int(self.spec.get("max_new_tokens", 8)),
                                  self.found.headers() if self.found is not None else None)
        return status, body if isinstance(body, bytes) else str(body).encode("utf-8", "replace")

    def event(self):
        """The `smoke` event once every answer is in (once), else None."""
        if self.told or not self.done:   # done: set by the thread once every answer is in (or it failed)
            return None
        self.told = True
        # every answer's status; the first bad answer's body (else the first one's) suffices
        bad = next((a for a in self.answers if not answered_text(a, self.spec.get("answer", "text"))), None)
        shown = [bad or self.answers[0]] if self.answers else []
        keys = [self.found.key] if self.found is not None and self.found.key else []
        out = {"t": "smoke", "started": self.started, "ended": self.ended,
               "statuses": [a[0] for a in self.answers],
               "bodies": [{"status": a[0], "body": pack(scrub_bytes(a[1][:65536], keys))} for a in shown]}
        refused = refused_text(shown[0][0], self.found, self.env_name) if shown else None
        if refused:   # a 401: whether the agent had the server's key, and what to do
            out["auth"] = refused
        return out


def post_smoke(spec, prompt, max_new_tokens, headers=None):
    """One smoke request as the engine's profile shaped it (`path`, `body`: SGLang's POST /generate
    when the laptop sent neither); the prompt and max_new_tokens go where that body has them. A body
    that needs the served model's name and has none gets it from `model_from` (GET /v1/models).
    `headers`: the server's API key (apikey.ServerKey.headers)."""
    base = spec["url"].rstrip("/")
    body = spec.get("body")
    if body is None:   # SGLang's /generate
        return http_post_json(base + "/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0}}, float(spec.get("timeout", 60)), headers)
    body = dict(body)
    if spec.get("model_from") and not body.get("model"):
        model, why = served_model(base + spec["model_from"], headers)
        if model is None:
            return why
        body["model"] = model
    return http_post_json(base + spec.get("path", "/generate"), body, float(spec.get("timeout", 60)), headers)


def served_model(url, headers=None):
    """(the first model id of an OpenAI GET /v1/models answer, None) or (None, (status, why as bytes)):
    the status of a refusal is kept (a 401 says the server wants its API key)."""
    status, body = http_get(url, timeout=10.0, headers=headers)
    if status != 200:
        return None, (status if status == 401 else None, (
            "GET %s answered %s: %s" % (url, status or "nothing", body[:200].decode("utf-8", "replace"))).encode("utf-8"))
    try:
        data = json.loads(body.decode("utf-8")).get("data")
        return str(data[0]["id"]), None
    except (ValueError, AttributeError, LookupError, TypeError):
        return None, (None, ("GET %s: no model id in %r" % (url, body[:200])).encode("utf-8"))


def answered_text(answer, how="text"):
    """Whether an answer is HTTP 200 with non-empty generated text (the laptop says why not): `how`
    "text" reads the JSON object's `text` (SGLang), "choices" choices[0].text (OpenAI completions)."""
    status, body = answer
    if status != 200:
        return False
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    if how == "choices":
        choices = doc.get("choices")
        doc = choices[0] if isinstance(choices, list) and choices else None
    return isinstance(doc, dict) and isinstance(doc.get("text"), str) and bool(doc["text"])
