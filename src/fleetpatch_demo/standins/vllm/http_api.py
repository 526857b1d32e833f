"""The API server's HTTP side, as vLLM's OpenAI-compatible server answers, behind the release's
API key check (auth.py):

* ``GET /health``: 200 once the engine is up (503 before, and after the engine died);
* ``GET /v1/models``: the served model (``--served-model-name`` or the model);
* ``GET /version``: ``{"version": <installed vLLM>}``;
* ``POST /v1/completions``: OpenAI's shape (``choices[0].text``); each request is an engine step
  that runs the drafter's propose step in every worker (``max_tokens`` tokens of text);
* uvicorn's access log line for each request (``INFO:     HOST:PORT - "GET /health HTTP/1.1" 200 OK``).
Stdlib only; Python 3.8+.
"""
import json
import threading
import time

from fleetpatch_standin_common.httpserver import UvicornHandler, make_http_server, serve_in_thread

from . import logs

WORDS = (" Paris", ".", " It", " is", " the", " capital", " of", " France", ",", " and")


class ServerState(object):
    """What the handlers read: readiness, the engine client, the served model, the version."""

    def __init__(self, engine, model, served_name, version, on_engine_dead):
        self.engine, self.model, self.served_name, self.version = engine, model, served_name, version
        self.ready = False
        self.dead = False
        self.lock = threading.Lock()
        self.on_engine_dead = on_engine_dead
        self.api_key_check = None   # auth.ApiKeyCheck: --api-key / VLLM_API_KEY, checked before any route


def make_handler(state):
    class Handler(UvicornHandler):
        def reply(self, code, doc):
            self.send_body(code, json.dumps(doc).encode())
            logs.uvicorn(self.access_text(code))

        def refused(self):
            """The release's API key check (auth.py), before any route: True when it answered instead."""
            check = state.api_key_check
            hit = check.refusal(self.command, self.request_path(), self.headers.get("Authorization")) \
                if check is not None else None
            if hit is not None:
                self.send_body(hit[0], hit[1])
                logs.uvicorn(self.access_text(hit[0]))
            return hit is not None

        def do_GET(self):
            path = self.request_path()
            if self.refused():
                return
            if path == "/health":
                self.reply(200 if state.ready and not state.dead else 503, {})
            elif path == "/version":
                self.reply(200, {"version": state.version})
            elif path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": state.served_name, "object": "model",
                                                             "created": int(time.time()), "owned_by": "vllm",
                                                             "root": state.model, "parent": None}]})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            raw = self.read_body()
            if self.refused():
                return
            if self.request_path() != "/v1/completions":
                self.reply(404, {"detail": "Not Found"})
                return
            try:
                req = json.loads(raw or b"{}")
                max_tokens = int(req.get("max_tokens", 16))
            except (ValueError, TypeError, AttributeError):
                self.reply(400, {"object": "error", "message": "invalid JSON body", "type": "BadRequestError",
                                 "code": 400})
                return
            if not state.ready or state.dead:
                self.reply(503, {"object": "error", "message": "the engine is not running", "code": 503})
                return
            from .processes import EngineDead
            try:
                with state.lock:
                    for _ in range(max(1, min(max_tokens, 64))):
                        state.engine.step()
            except EngineDead:
                state.dead = True
                self.reply(500, {"object": "error", "message": "EngineCore encountered an issue.",
                                 "type": "InternalServerError", "code": 500})
                state.on_engine_dead()
                return
            text = "".join(WORDS[i % len(WORDS)] for i in range(max_tokens))
            self.reply(200, {"id": "cmpl-%d" % int(time.time() * 1e6), "object": "text_completion",
                             "created": int(time.time()), "model": req.get("model") or state.served_name,
                             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": max_tokens,
                                       "total_tokens": max_tokens + 1}})

    return Handler


def serve(state, host, port):
    server = make_http_server(host, port, make_handler(state))
    serve_in_thread(server, "uvicorn")
    return server
