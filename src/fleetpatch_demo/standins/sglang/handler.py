"""The HTTP API of node 0 (``Handler``), behind the release's API key check (auth.py): /health, /health_generate, /server_info,
/get_server_info, /model_info, /v1/loads, /get_load, POST /generate (plain or streamed);
uvicorn's access lines; the warmup request and the ready line (Python's, or 0.5.22+'s
Rust server's with SGLANG_RUST_SERVER=1)."""
import json
import logging
import os
import random
import sys
import time

from fleetpatch_standin_common.httpserver import UvicornHandler
from fleetpatch_standin_common.output import flush_streams

from . import steps
from .envs import parse_env_bool
from .release import version_tuple
from .scheduler import load_deprecated, loads_v1
from .serverargs import record_fields
from .state import REQUESTS, State
from .workers import Req


_WORDS = ("Paris", ".", " It", " is", " the", " capital", " of", " France", ",", " and")


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def server_info():
    sa = State.server_args
    info = {name: _jsonable(getattr(sa, name, None)) for name in record_fields(sa)}
    info.update(State.scheduler_info)
    info["internal_states"] = [{}]
    info["version"] = State.version
    return info


class Handler(UvicornHandler):
    def refused(self, path):
        """The release's API key check (auth.py), before any route: True when it answered instead."""
        hit = State.api_key_check.refusal(self.command, path, self.headers.get("Authorization")) \
            if State.api_key_check is not None else None
        if hit is not None:
            self.send_body(hit[0], hit[1])
        return hit is not None

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if self.refused(path):
            return
        if path in ("/health", "/health_generate"):
            if State.terminating:
                logging.getLogger("sglang.srt.entrypoints.http_server").info(
                    "Health check request received during shutdown. Returning 503.")
                self.send_body(503)
            else:
                self.send_body(200 if State.ready else 503)
        elif path == "/v1/loads":
            self.send_body(200, json.dumps(loads_v1()).encode())
        elif path == "/get_load":
            logging.getLogger("sglang.srt.entrypoints.http_server").warning(
                "Endpoint '/get_load' is deprecated and will be removed in a future version. "
                "Please use '/v1/loads' instead.")
            self.send_body(200, json.dumps(load_deprecated()).encode())
        elif path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                logging.getLogger("sglang.srt.entrypoints.http_server").warning(
                    "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                    "Please use '/server_info' instead.")
            self.send_body(200, json.dumps(server_info()).encode())
        elif path in ("/model_info", "/get_model_info"):
            sa = State.server_args
            self.send_body(200, json.dumps({"model_path": sa.model_path, "tokenizer_path": sa.tokenizer_path,
                                        "is_generation": True}).encode())
        else:
            self.send_body(404, b'{"detail":"Not Found"}')

    do_HEAD = do_GET

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        if self.refused(path):
            return
        if path != "/generate":
            self.send_body(404, b'{"detail":"Not Found"}')
            return
        if State.fatal is not None:
            self.close_connection = True
            return
        if not (State.ready or State.warming):
            self.send_body(503, b'{"detail":"server is not ready"}')
            return
        refused = os.environ.get("FLEETPATCH_STANDIN_GENERATE_STATUS")
        if refused:   # a test's server that answers /generate with this status
            self.send_body(int(refused), b"the stand-in refuses /generate (FLEETPATCH_STANDIN_GENERATE_STATUS)\n"
                                     b"second line")
            return
        try:
            req = json.loads(raw.decode("utf-8") or "null")
            if not isinstance(req, dict):
                raise ValueError("body is not a JSON object")
            params = req.get("sampling_params") or {}
            n = int(params.get("max_new_tokens", 128))
            if n < 0:
                raise ValueError("max_new_tokens must be >= 0")
        except (ValueError, TypeError, AttributeError) as e:
            self.send_body(422, json.dumps({"detail": "invalid request: %s" % e}).encode())
            return
        self._generate(req, n)

    def _generate(self, req, n):
        """One request through the scheduler loop (steps.StepLoop): prefilled in the
        next step's EXTEND batch, then one token per DECODE step with everything in flight."""
        rid = "%032x" % random.getrandbits(128)
        prompt = req.get("text") if isinstance(req.get("text"), str) else ""
        prompt_tokens = max(1, len(prompt.split()))
        stream = bool(req.get("stream"))
        started = time.time()
        REQUESTS.enter(rid)
        try:
            request = steps.Request(Req(rid, n), n)
            request.prompt_tokens = prompt_tokens
            State.loop.submit(request)
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
            text = ""
            while True:
                kind, count = request.events.get()
                if kind == "failed":
                    return self._die()
                if count:
                    text += _WORDS[(count - 1) % len(_WORDS)]
                done = kind == "done"
                if stream and (count or done):
                    self.send_chunk(b"data: " + json.dumps(self._out(rid, text, count, prompt_tokens, started, done)).encode() + b"\n\n")
                if done:
                    break
            if stream:
                self.send_chunk(b"data: [DONE]\n\n")
                self.send_chunk(b"")
            else:
                self.send_body(200, json.dumps(self._out(rid, text, n, prompt_tokens, started, True)).encode())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: abort, as SGLang does
        finally:
            REQUESTS.leave(rid)

    def _out(self, rid, text, n, prompt_tokens, started, done):
        return {"text": text, "output_ids": list(range(n)),
                "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
                              "prompt_tokens": prompt_tokens, "completion_tokens": n, "cached_tokens": 0,
                              "e2e_latency": round(time.time() - started, 4)}}

    def _die(self):
        # the scheduler died: the connection is dropped, no answer
        self.close_connection = True

    def log_request(self, code="-", size="-"):
        # uvicorn's access log line (the Rust server logs none)
        if State.rust_server:
            return
        logging.getLogger("uvicorn.access").info("INFO:     " + self.access_text(code))


def rust_server_serves():
    """SGLANG_RUST_SERVER=1 on 0.5.22+: the Rust extension serves HTTP, runs the
    warm-up and prints the ready line itself; Python's http_server never starts.
    (0.5.17 - 0.5.21 still log Python's ready line after its warm-up.)"""
    try:
        wanted = parse_env_bool(os.environ.get("SGLANG_RUST_SERVER", "false"))
    except ValueError:
        wanted = False  # EnvBool: an invalid value reads as the default
    return wanted and version_tuple() >= (0, 5, 22)


def warmed_up(server_args, shown_host, port):
    """_wait_and_warmup: SGLang's warmup request through the server itself (steps.warmup)
    before "ready", unless --skip-server-warmup. False: it failed (logged), the server exits."""
    if getattr(server_args, "skip_server_warmup", False):
        return True
    State.warming = True
    try:
        ok = steps.warmup("http://%s:%s" % (shown_host, port), getattr(server_args, "api_key", None),
                          logging.getLogger("sglang.srt.entrypoints.http_server"))
    finally:
        State.warming = False
    if not ok:
        flush_streams()
        State.fatal = State.fatal or 1
    return ok and State.fatal is None


def python_ready():
    State.ready = True
    logging.getLogger("sglang.srt.entrypoints.http_server").info("The server is fired up and ready to roll!")
    flush_streams()


def rust_ready():
    """The Rust server's ready line (sglang-server's api_server/http/app.rs): the
    same text as Python's, in tracing-subscriber's format, on stdout. The wheel
    holds the text; the format is the stand-in's reading of the crate (tracing)."""
    State.ready = True
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%06dZ" % int((now % 1) * 1e6)
    flush_streams()
    sys.stdout.write("%s  INFO sglang_server::api_server::http::app: "
                     "The server is fired up and ready to roll!\n" % stamp)
    flush_streams()
