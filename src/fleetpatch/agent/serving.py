"""Serving checks run ON the host: drain (wait until the worker has nothing in
flight), smoke (one generate request, then its expected log lines), bake (watch
the server a while). The laptop takes the worker out of its routers; these read
the worker's own figures where the worker is (the routers' load figures count
tokens, not requests)."""
import json
import time

from .apikey import known_key, refused_text, scrub_bytes
from .base import AgentError, pack, protocol
from .container import resolve
from .http import http_get
from .logs import close_reader, log_reader_since
from .procs import pid_alive
from .restart import log_position, server_pid, uses_journal
from .smoke import post_smoke


def read_worker_load(url, headers=None):
    """(running, waiting, path), or (None, the HTTP status or None, why) when the worker does not answer
    with its load; `headers`: the server's API key."""
    base = url.rstrip("/")
    why = None
    for path in ("/v1/loads", "/get_load"):
        status, body = http_get(base + path, timeout=3.0, headers=headers)
        if status == 200:
            try:
                running, waiting = protocol.parse_worker_loads(json.loads(body.decode("utf-8", "replace")))
                return running, waiting, path
            except ValueError as e:
                raise AgentError("router-error", "GET %s%s answered, but not as SGLang does (%s)" % (base, path, e))
        why = "GET %s%s: %s" % (base, path, "HTTP %s" % status if status else body.decode("utf-8", "replace"))
        if status != 404:
            return None, status, why
    return None, None, why


def serving_pid(req):
    """The pid of the server a serving request is for (a container host's: its main process, or the
    server started in it), None when it is not running or cannot be told. Never raises."""
    restart = req.get("restart") or {}
    if not restart:
        return None
    if req.get("container") and not restart.get("_container"):   # drain: the container is not checked first
        try:
            restart = dict(restart, _container=resolve(req))
        except AgentError:
            return None
    return server_pid(restart)


def op_drain(state, req):
    """Wait (at most `wait` s) until the worker at `url` has no running and no waiting
    request. The laptop calls it again until its --drain-timeout: short calls keep a
    Ctrl-C on the laptop answered within one of them."""
    url = req["url"]
    deadline = time.monotonic() + max(0.0, float(req.get("wait", 2.0)))
    pid = serving_pid(req)
    found = known_key(state, pid, req.get("api_key_env"))   # SGLang asks its key for /v1/loads
    first = None
    while True:
        running, waiting, source = read_worker_load(url, found.headers())
        if first is None:
            first = (running or 0) + (waiting or 0)   # what this call found in flight
        if running is None:
            if pid is not None and not pid_alive(pid):
                # a server that is not running has nothing in flight
                return {"drained": True, "running": 0, "waiting": 0, "source": "server not running", "first": 0}
            refused = refused_text(waiting, found, req.get("api_key_env"))
            if refused:
                raise AgentError("router-error", "cannot read the load of the worker %s from the host: %s"
                                 % (url, refused))
            raise AgentError("router-error", "cannot read the load of the worker %s from the host (%s); is "
                             "server.url right, and does it answer on this host?" % (url, source))
        if running == 0 and waiting == 0:
            return {"drained": True, "running": 0, "waiting": 0, "source": source, "first": first}
        if time.monotonic() >= deadline:
            return {"drained": False, "running": running, "waiting": waiting, "source": source, "first": first}
        time.sleep(float(req.get("poll", 0.1)))


def op_smoke(state, req):
    """POST the smoke prompt from the host (SGLang's /generate, or the profile's `path` and `body`); then, if `expect` lines are
    given, read the server's output written since the request until each has appeared
    (at most `expect_wait` s). The laptop judges the answer."""
    since = time.time()
    pos = log_position(req["log"]) if req.get("log") and req.get("log") != "journal" else {}
    found = known_key(state, serving_pid(req), req.get("api_key_env"))
    status, body = post_smoke(req, req.get("prompt", "Hello"), int(req.get("max_new_tokens", 4)), found.headers())
    keys = [found.key] if found.key else []
    out = {"status": status, "body": pack(scrub_bytes(body[:65536], keys) if isinstance(body, bytes) else b"")}
    refused = refused_text(status, found, req.get("api_key_env"))
    if refused:   # a 401: whether the agent had the server's key, and what to do
        out["auth"] = refused
    expect = list(req.get("expect") or [])
    if not expect or status != 200:
        return out
    reader = log_reader_since(req, since - 1, pos)
    found, seen = {}, 0
    deadline = time.monotonic() + float(req.get("expect_wait", 5.0))
    try:
        while True:
            for _path, first, lines in reader.read():
                for i, line in enumerate(lines):
                    seen += 1
                    for text in expect:
                        if text not in found and text in line:
                            found[text] = {"line_no": first + i, "line": line[:500]}
            if len(found) == len(expect) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    finally:
        close_reader(reader)
    out.update({"found": found, "missing": [t for t in expect if t not in found], "lines_read": seen})
    return out


def op_bake(state, req):
    """Watch the server `seconds` s: its process alive, its health endpoint 200, and no
    new line holding a `forbid` text. Ends at the first problem."""
    restart = req.get("restart") or {}
    forbid = list(req.get("forbid") or [])
    pos = log_position(req["log"]) if req.get("log") and req.get("log") != "journal" else {}
    reader = log_reader_since(req, time.time(), pos) if req.get("log") or uses_journal(restart, None) else None
    deadline = time.monotonic() + float(req.get("seconds", 10))
    found = known_key(state, serving_pid(req), req.get("api_key_env"))   # for a health_url that wants it
    checks, lines_read = 0, 0
    try:
        while True:
            pid = server_pid(restart)
            if not pid_alive(pid):
                return {"ok": False, "problem": "the server process is not running (pid %s)" % pid,
                        "checks": checks}
            if req.get("health_url"):
                status, _ = http_get(req["health_url"], timeout=2.0, headers=found.headers())
                if status != 200:
                    return {"ok": False, "problem": "GET %s answered %s" % (req["health_url"], status or "nothing"),
                            "checks": checks}
            for _path, first, lines in (reader.read() if reader is not None else []):
                for i, line in enumerate(lines):
                    lines_read += 1
                    for text in forbid:
                        if text in line:
                            return {"ok": False, "problem": "line %d of the log since the bake began holds %r: %s"
                                    % (first + i, text, line[:300]), "checks": checks}
            checks += 1
            if time.monotonic() >= deadline:
                return {"ok": True, "checks": checks, "lines_read": lines_read}
            time.sleep(0.25)
    finally:
        close_reader(reader)
