"""The API server's HTTP side, as vLLM's OpenAI-compatible server answers:

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

try:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
except ImportError:  # pragma: no cover - Python < 3.7
    from http.server import BaseHTTPRequestHandler, HTTPServer as ThreadingHTTPServer

from . import logs

WORDS = (" Paris", ".", " It", " is", " the", " capital", " of", " France", ",", " and")
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error",
           503: "Service Unavailable"}


class ServerState(object):
    """What the handlers read: readiness, the engine client, the served model, the version."""

    def __init__(self, engine, model, served_name, version, on_engine_dead):
        self.engine, self.model, self.served_name, self.version = engine, model, served_name, version
        self.ready = False
        self.dead = False
        self.lock = threading.Lock()
        self.on_engine_dead = on_engine_dead


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def reply(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            logs.uvicorn('%s:%d - "%s %s HTTP/1.1" %d %s' % (self.client_address[0], self.client_address[1],
                                                           self.command, self.path, code, REASONS.get(code, "")))

        def do_GET(self):
            path = self.path.split("?", 1)[0]
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
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path.split("?", 1)[0] != "/v1/completions":
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
    server = ThreadingHTTPServer((host, port), make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="uvicorn", daemon=True)
    thread.start()
    return server
