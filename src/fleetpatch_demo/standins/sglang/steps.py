"""The stand-in server's scheduler loop and its warmup request, as SGLang 0.5.x serves.

Part of the SGLang stand-in package (``sglang_standin.steps`` on a host). Stdlib only.

* One scheduler loop (``StepLoop``): each step runs the worker's real
  ``forward_batch_generation`` once per TP rank (the stand-in's ``forward``), with
  a batch of the requests in flight: an EXTEND batch of the requests that arrived
  since the last step (their prefill), then a DECODE batch holding every running
  request, each of which gets one token per decode step. So a line that a patch
  runs only for batches of 4 or more runs when 4 requests are in flight at once.
* The warmup request (``warmup``) that SGLang 0.5.9's ``_wait_and_warmup`` sends
  itself before it logs "The server is fired up and ready to roll!", unless
  ``--skip-server-warmup``: ``_execute_server_warmup`` reads ``GET /model_info``
  until it answers 200, then sends ``POST /generate`` with
  ``{"text": "The capital city of France is", "sampling_params":
  {"temperature": 0, "max_new_tokens": 8}}`` (a generation model, dp_size 1);
  a failure is logged as ``f"Initialization failed. warmup error: {last_traceback}"``
  and the server kills itself. (The real one sleeps 1 s before each /model_info
  try; the stand-in, whose HTTP server is up already, does not.)
"""
import json
import queue
import threading
import time
import traceback
import urllib.error
import urllib.request

WARMUP_TEXT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8
WARMUP_TRIES = 120
# the server's own URL: never through a proxy the environment names
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Request(object):
    """One /generate request in the loop: `req` is the stand-in's batch entry for it;
    its handler reads ("token", n), ("done", n) or ("failed", None) from `events`."""

    def __init__(self, req, max_new_tokens):
        self.req = req
        self.n = max_new_tokens
        self.tokens = 0
        self.events = queue.Queue()


class StepLoop(object):
    """The scheduler loop: steps while requests are in flight, one at a time.

    `forward(reqs, extend)` runs one step on every TP rank and returns False when the
    scheduler died (the stand-in then exits); `prefill_log(new, running)` logs a
    prefill batch; `token_seconds` is one decode step's time."""

    def __init__(self, forward, prefill_log, token_seconds):
        self.forward, self.prefill_log, self.token_seconds = forward, prefill_log, token_seconds
        self.cond = threading.Condition()
        self.arrived = []
        self.running = []       # touched by the loop's thread only
        self.thread = None
        self.dead = False

    def submit(self, request):
        with self.cond:
            if self.dead:
                request.events.put(("failed", None))
                return
            self.arrived.append(request)
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
                self.thread.start()
            self.cond.notify()

    def _loop(self):
        while True:
            with self.cond:
                while not self.arrived and not self.running:
                    self.cond.wait()
                new, self.arrived = self.arrived, []
            if new and not self._prefill(new):
                return self._fail(new + self.running)
            if self.running and not self._decode():
                return self._fail(self.running)

    def _prefill(self, new):
        self.prefill_log(new, len(self.running))
        if not self.forward([r.req for r in new], True):
            return False
        for r in new:
            if r.n <= 0:
                r.events.put(("done", 0))
            else:
                self.running.append(r)
        return True

    def _decode(self):
        time.sleep(self.token_seconds)
        if not self.forward([r.req for r in self.running], False):
            return False
        still = []
        for r in self.running:
            r.tokens += 1
            r.events.put(("token", r.tokens) if r.tokens < r.n else ("done", r.tokens))
            if r.tokens < r.n:
                still.append(r)
        self.running = still
        return True

    def _fail(self, requests):
        with self.cond:
            self.dead = True
            requests = requests + self.arrived
            self.arrived = []
        for r in requests:
            r.events.put(("failed", None))


def warmup(url, api_key=None, log=None):
    """_execute_server_warmup of 0.5.9 against `url` (the server itself): True once its
    warmup request was answered 200; else the error is logged through `log` (a logger)."""
    headers = {"Authorization": "Bearer %s" % api_key} if api_key else {}
    last = None
    for _ in range(WARMUP_TRIES):
        try:
            with _DIRECT.open(urllib.request.Request(url + "/model_info", headers=headers), timeout=5) as res:
                model_info = json.loads(res.read().decode("utf-8"))
            break
        except Exception:
            last = traceback.format_exc()
            time.sleep(0.05)
    else:
        log.error("Initialization failed. warmup error: %s" % last)
        return False
    request_name = "/generate" if model_info.get("is_generation", True) else "/encode"
    body = {"sampling_params": {"temperature": 0, "max_new_tokens": WARMUP_MAX_NEW_TOKENS if
                                model_info.get("is_generation", True) else 1},
            "text": WARMUP_TEXT}
    post = urllib.request.Request(url + request_name, data=json.dumps(body).encode("utf-8"),
                                  headers=dict(headers, **{"Content-Type": "application/json"}), method="POST")
    try:
        status, text = _post(post)
        assert status == 200, "%s" % text
    except Exception:
        log.error("Initialization failed. warmup error: %s" % traceback.format_exc())
        return False
    return True


def _post(request):
    """(status, body text) of a request, whatever its status."""
    try:
        with _DIRECT.open(request, timeout=600) as res:
            return res.status, res.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
