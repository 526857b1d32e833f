"""The vLLM stand-in's API server process: `python -m vllm_standin serve MODEL [--flags]` (as
`vllm serve`) or `python -m vllm_standin.api_server --model MODEL [--flags]` (as
`python -m vllm.entrypoints.openai.api_server` of older releases).

Start-up, in vLLM's order, each line quoted from the host's files:
the banner (0.10.x: "vLLM API server version %s"; later: the logo, or with
VLLM_DISABLE_LOG_LOGO=1 "vLLM server version %s, serving model %s"), "non-default args: %s",
the routing's lines (fallback warnings), the EngineCore (its process, "Initializing a V1 LLM
engine (v%s) with config: %s"), the workers ("Using V2 Model Runner", the compile cache lines),
"Starting vLLM API server %d on %s" / "Starting vLLM server on %s" where the release has it,
then uvicorn's lines ending in "Application startup complete." (the ready line).

SIGTERM: uvicorn's shutdown lines, the EngineCore and workers stopped, exit 0.  A start-up error
(a refused setting, "EngineCore failed to start.") exits 1.  An engine that dies while serving
ends the server with exit 1, as vLLM's API server does when its engine is gone.

Test controls: FLEETPATCH_STANDIN_STARTUP_DELAY (seconds before the ready line, default 0).
Stdlib only; Python 3.8+.
"""
import json
import logging
import os
import signal
import sys
import threading
import time

from fleetpatch_standin_common.output import env_float, flush_streams, line_buffer_streams
from fleetpatch_standin_common.serving import Stop, stop_on_signals

from . import host as hostmod, http_api, logs, processes, routing
from .auth import ApiKeyCheck

INFO, WARNING = logging.INFO, logging.WARNING


def banner(host, envs, log, model):
    version = host.version
    if host.version_tuple < (0, 11):
        src = next((b["source"] for b in host.release["extracted"]["banner"]
                    if b["source"].endswith("openai/api_server.py")), "vllm/entrypoints/openai/api_server.py")
        log.quoted(INFO, src, "vLLM API server version", version)
        return
    src = next((b["source"] for b in host.release["extracted"]["banner"] if "serving model" in b["text"]), None)
    if src is None:
        return
    if getattr(envs, "VLLM_DISABLE_LOG_LOGO", False):
        log.quoted(INFO, src, "vLLM server version %s, serving model %s", version, model)
        return
    logo = log.quoter.template(src, "vLLM server version %s, serving model %s")
    if logo is None:
        log.quoted(INFO, src, "vLLM server version %s, serving model %s", version, model)
        return
    import string
    text, line = logo
    keys = {m.group("named") or m.group("braced") for m in string.Template.pattern.finditer(text)
            if m.group("named") or m.group("braced")}
    log.emit(INFO, src, line, string.Template(text).substitute(dict.fromkeys(keys, "")), version, model)


def non_default_args(host, log, model, values, bare):
    args = {"model": model}
    for k, v in values.items():
        if k not in ("model",):
            args[k.replace("-", "_")] = _typed(v)
    for k in bare:
        args[k.replace("-", "_")] = True
    for src in ("vllm/entrypoints/common/startup.py", "vllm/entrypoints/utils.py"):
        if log.quoted(INFO, src, "non-default args: %s", args):
            return


def _typed(v):
    try:
        return json.loads(v)
    except ValueError:
        return v


def fail(log, kind, message, source=None, line=None):
    """A start-up error as Python prints an uncaught exception (vLLM lets it propagate)."""
    flush_streams()
    where = '  File "%s", line %s\n' % (log.quoter.path(source), line) if source else ""
    sys.stderr.write("Traceback (most recent call last):\n%s%s: %s\n" % (where, kind, message))
    sys.stderr.flush()
    return 1


def run(argv):
    line_buffer_streams()
    stop_on_signals()
    host = hostmod.Host()
    envs, log = hostmod.set_up(host, host.api_server_name())
    model, values, bare = routing.parse_argv(argv)
    banner(host, envs, log, model)
    non_default_args(host, log, model, values, bare)
    try:
        route = routing.choose(host.release, envs, host.quoter, model, values, bare)
    except routing.StartupError as e:
        return fail(log, e.kind, e.message, e.source, e.line)
    for process, level, source, needle, args in route.lines:
        if needle is None:      # a message assembled from the host file's pieces, at the given line
            log.emit(level, source, args[1], args[0])
        else:
            log.quoted(level, source, needle, *args)
    launch = processes.Launch(host.site_dir, argv, envs.VLLM_WORKER_MULTIPROC_METHOD)
    if route.engine == "v0":
        log.quoted(INFO, "vllm/engine/llm_engine.py", "Initializing a V0 LLM engine", host.version,
                   processes.config_repr(model, values), True)
        engine = V0Engine()
    else:
        engine = processes.EngineClient(launch, host, envs, log, bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING))
        try:
            ok = engine.start()
        except Stop:            # SIGTERM/SIGINT while the engine starts: stop it, exit 0
            engine.stop()
            raise
        except Exception as e:
            processes.log_exception(log, "EngineCore failed to start.", e)
            ok = False
        if not ok:
            hit = host.quoter.quote("vllm/v1/engine/core_client.py", "Engine core initialization failed")
            return fail(log, "RuntimeError", hit[0] if hit else
                        "Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    return serve(host, envs, log, engine, model, values)


class V0Engine(object):
    """The V0 engine: no drafter (speculative decoding is refused on V0), nothing per step."""

    pid = os.getpid()

    def step(self):
        return []

    def stop(self):
        pass


def serve(host, envs, log, engine, model, values):
    bind = values.get("host") or "0.0.0.0"
    port = int(values.get("port", 8000))
    done = threading.Event()
    code = {"exit": 0}

    def engine_dead():
        code["exit"] = 1
        done.set()

    state = http_api.ServerState(engine, model, values.get("served-model-name", model), host.version, engine_dead)
    # read through the host's real vllm/envs.py, as build_app does
    state.api_key_check = ApiKeyCheck(host.version_tuple, values.get("api-key"), getattr(envs, "VLLM_API_KEY", None))
    try:
        server = http_api.serve(state, bind, port)
    except OSError as e:
        return fail(log, "OSError", "[Errno %s] error while attempting to bind on address (%r, %d): %s"
                    % (e.errno, bind, port, e.strerror))
    address = "http://%s:%d" % (bind, port)
    if not log.quoted(INFO, "vllm/entrypoints/openai/api_server.py", "Starting vLLM API server", 0, address):
        log.quoted(INFO, "vllm/entrypoints/openai/api_server.py", "Starting vLLM server on", address)
    logs.uvicorn("Started server process [%d]" % os.getpid())
    logs.uvicorn("Waiting for application startup.")

    def on_term(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # the model's load and warm-up (a test control): a stop signal meanwhile ends the start
    if not done.wait(env_float("FLEETPATCH_STANDIN_STARTUP_DELAY", 0.0)):
        state.ready = True
        logs.uvicorn("Application startup complete.")
        logs.uvicorn("Uvicorn running on %s (Press CTRL+C to quit)" % address)
    while not done.wait(0.5):
        pass
    logs.uvicorn("Shutting down")
    state.ready = False
    server.shutdown()
    logs.uvicorn("Waiting for application shutdown.")
    engine.stop()
    logs.uvicorn("Application shutdown complete.")
    logs.uvicorn("Finished server process [%d]" % os.getpid())
    flush_streams()
    return code["exit"]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    elif argv and not argv[0].startswith("-"):
        sys.stderr.write("usage: python -m vllm_standin serve MODEL [--flags]\n")
        return 2
    try:
        return run(argv)
    except Stop:
        flush_streams()
        return 0
