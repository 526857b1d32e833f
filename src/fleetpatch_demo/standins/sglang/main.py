"""The server's life (``main``): stubs installed, the flags parsed and routed, each of this
node's TP ranks built, then node 0 serves HTTP (warmup, ready line, the serving phase
with SIGTERM's graceful drain) and a node R >= 1 follows node 0."""
import logging
import multiprocessing.connection  # noqa: F401  now, before the stub finder: subprocess probes for Windows modules
import os
import signal
import sys
import time

from fleetpatch_standin_common.httpserver import make_http_server, serve_in_thread
from fleetpatch_standin_common.output import env_float, env_true, flush_streams, line_buffer_streams, rotate_log
from fleetpatch_standin_common.serving import Stop, serve_until_stopped, stop_on_signals

from . import steps
from .auth import ApiKeyCheck
from .handler import Handler, python_ready, rust_ready, rust_server_serves, warmed_up
from .models import TpModelWorker
from .nodes import Node, fail_after, follow
from .release import sglang_version, version_tuple
from .scheduler import forward, prefill_log, spawn_scheduler, token_seconds
from .serverargs import apply_routing, build_server_args, check_server_args, configure_logging, rank_prefix
from .serverargs import server_args_line
from .srtutils import RANK, get_available_gpu_memory, get_exception_traceback
from .state import REQUESTS, State
from .stubrules import install_stubs
from .workers import construct_worker, stub_gpu_steps


logger = logging.getLogger("sglang.srt.entrypoints.engine")


def _on_sigterm_serving(signum, frame):
    # SGLang's SignalHandler.sigterm_handler: only a flag; the watchdog exits
    if not State.terminating:
        logging.getLogger("sglang.srt.managers.tokenizer_manager").warning(
            "SIGTERM received. signum=%r frame=%r. Draining requests and shutting down..."
            % (signum, frame))
    State.terminating = True


def _serve_until_stopped(exit_after, reason="FLEETPATCH_STANDIN_EXIT_AFTER_READY"):
    """The serving phase: returns the exit code.

    SIGTERM as in 0.5.9's TokenizerManager.sigterm_watchdog: every
    FLEETPATCH_STANDIN_SIGTERM_POLL seconds (SGLang: 5) the unfinished
    requests are counted and logged; the server exits 0 once there are none.
    Meanwhile /health answers 503 and new /generate requests are served."""
    signal.signal(signal.SIGTERM, _on_sigterm_serving)
    log = logging.getLogger("sglang.srt.managers.tokenizer_manager")

    def drained():
        rids = REQUESTS.unfinished()
        log.info("Gracefully exiting... Remaining number of requests %d. Remaining requests "
                 "remaining_rids=%r." % (len(rids), rids))
        flush_streams()
        return not rids

    def died():
        try:
            raise RuntimeError("stand-in scheduler died (%s)" % reason)
        except RuntimeError:
            logging.getLogger("sglang.srt.managers.scheduler").error(
                "Scheduler hit an exception: %s" % get_exception_traceback())
            logging.getLogger("sglang.srt.entrypoints.engine").error(
                "Received sigquit from a child process. It usually means the child failed.")
            flush_streams()
            return 1

    return serve_until_stopped(fatal=lambda: State.fatal, terminating=lambda: State.terminating,
                               drained=drained, poll=max(0.05, env_float("FLEETPATCH_STANDIN_SIGTERM_POLL", 0.5)),
                               exit_after=exit_after, on_deadline=died)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    line_buffer_streams()
    stop_on_signals()
    httpd = None
    try:
        install_stubs()
        server_args_mod, server_args = build_server_args(argv)
        # Warnings of the routing reach stderr bare: logging is not configured yet.
        apply_routing(server_args)
        flush_streams()

        configure_logging(server_args)
        check_server_args(server_args)
        logger.info(server_args_line(server_args))

        rotate = os.environ.get("FLEETPATCH_STANDIN_ROTATE_LOG")
        if rotate:
            rotate_log(rotate)

        State.server_args = server_args
        State.api_key_check = ApiKeyCheck(server_args)
        State.version = sglang_version()
        node = State.node = Node(server_args)
        sched_log = logging.getLogger("sglang.srt.managers.scheduler")
        tp_size = max(1, int(server_args.tp_size or 1))
        dp_rank = 0 if (getattr(server_args, "dp_size", 1) or 1) > 1 else None
        for tp_rank in node.tp_ranks:
            RANK.update(tp_rank=tp_rank, tp_size=tp_size)
            configure_logging(server_args, rank_prefix(server_args, tp_rank, dp_rank))
            try:
                if node.multi and tp_rank == node.tp_ranks[0]:
                    node.rendezvous()
                if server_args.speculative_algorithm is not None and env_true("FLEETPATCH_STANDIN_SPAWN_SCHEDULER"):
                    max_total = spawn_scheduler(argv, tp_rank, dp_rank)
                elif server_args.speculative_algorithm is not None:
                    worker = construct_worker(server_args_mod, server_args, tp_rank, dp_rank)
                    stub_gpu_steps(worker)
                    State.workers.append(worker)
                    max_total = getattr(getattr(worker, "target_worker", None), "max_total_num_tokens", 400000)
                else:
                    target = TpModelWorker(server_args=server_args, gpu_id=tp_rank, tp_rank=tp_rank)
                    max_total = target.max_total_num_tokens
                if env_true("FLEETPATCH_STANDIN_CRASH_AFTER_INIT"):
                    raise RuntimeError("CUDA error: an illegal memory access was encountered "
                                       "(stand-in FLEETPATCH_STANDIN_CRASH_AFTER_INIT)")
                sched_log.info(
                    "max_total_num_tokens=%s, chunked_prefill_size=%s, max_prefill_tokens=%s, "
                    "max_running_requests=%s, context_len=%s, available_gpu_mem=%.2f GB"
                    % (max_total, server_args.chunked_prefill_size, server_args.max_prefill_tokens,
                       server_args.max_running_requests or 48, server_args.context_length or 131072,
                       get_available_gpu_memory()))
                State.scheduler_info = {"status": "ready", "max_total_num_tokens": max_total,
                                        "max_req_input_len": max_total - 6}
            except Exception:
                sched_log.error("Scheduler hit an exception: %s" % get_exception_traceback())
                configure_logging(server_args)
                logging.getLogger("sglang.srt.entrypoints.engine").error(
                    "Received sigquit from a child process. It usually means the child failed.")
                flush_streams()
                return 1
        configure_logging(server_args)
        REQUESTS.setup(server_args.max_running_requests or 48)
        State.loop = steps.StepLoop(forward, prefill_log, token_seconds())
        if node.rank > 0:
            return follow(node, server_args)

        host = server_args.host or "127.0.0.1"
        httpd = make_http_server(host, int(server_args.port), Handler)
        serve_in_thread(httpd, "http")
        shown_host = "[%s]" % host if ":" in host else host
        rust = State.rust_server = rust_server_serves()
        if rust:
            logging.getLogger("sglang.srt.rust_server.server").info(
                "SGLANG_RUST_SERVER enabled, Rust server listen on %s:%s" % (shown_host, httpd.server_address[1]))
        else:
            # uvicorn's lines, with SGLang's set_uvicorn_logging_configs format
            uv = logging.getLogger("uvicorn.error")
            uv.info("INFO:     Started server process [%d]" % os.getpid())
            uv.info("INFO:     Waiting for application startup.")
            uv.info("INFO:     Application startup complete.")
            uv.info("INFO:     Uvicorn running on http://%s:%s (Press CTRL+C to quit)"
                    % (shown_host, httpd.server_address[1]))

        time.sleep(max(0.0, env_float("FLEETPATCH_STANDIN_STARTUP_DELAY", 0.2)))
        if env_true("FLEETPATCH_STANDIN_NEVER_READY"):
            while True:
                time.sleep(0.2)
        if not warmed_up(server_args, shown_host, httpd.server_address[1]):
            return 1
        if rust:
            rust_ready()
        else:
            python_ready()

        exit_after = env_float("FLEETPATCH_STANDIN_EXIT_AFTER_READY", None)
        reason = "FLEETPATCH_STANDIN_EXIT_AFTER_READY"
        fails_in = fail_after(node)
        if fails_in is not None and (exit_after is None or fails_in < exit_after):
            exit_after, reason = fails_in, "FLEETPATCH_STANDIN_FAIL_RANK=0"
        rc = _serve_until_stopped(exit_after, reason)
        if rc == 0 and State.terminating and version_tuple() >= (0, 5, 21):
            node.shutdown()
        return rc
    except Stop:
        flush_streams()
        return 0
    finally:
        if httpd is not None:
            try:
                httpd.server_close()
            except Exception:
                pass
        flush_streams()
