"""The scheduler: one step on every TP rank's worker (``forward``), the loads it reports
(/v1/loads, /get_load), its prefill log line, its death (``scheduler_died``), and, with
FLEETPATCH_STANDIN_SPAWN_SCHEDULER=1, a rank's worker built in a spawned scheduler process."""
import logging
import os
import time

from fleetpatch_standin_common.output import env_float, flush_streams

from .serverargs import apply_routing, build_server_args, configure_logging, rank_prefix
from .srtutils import RANK, get_exception_traceback
from .state import REQUESTS, State
from .stubrules import install_stubs
from .workers import Batch, construct_worker


def loads_v1():
    """GET /v1/loads of 0.5.9 (sglang/srt/entrypoints/v1_loads.py)."""
    running, waiting = REQUESTS.counts()
    max_running = (State.server_args.max_running_requests if State.server_args else None) or 48
    load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_used_tokens": 0, "max_total_num_tokens": State.scheduler_info.get("max_total_num_tokens", 0),
            "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
            "utilization": round(running / float(max_running), 4), "max_running_requests": max_running,
            "num_total_reqs": running + waiting}
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "version": State.version, "dp_rank_count": 1, "loads": [load],
            "aggregate": {"total_running_reqs": running, "total_waiting_reqs": waiting,
                          "total_reqs": running + waiting, "avg_token_usage": 0.0,
                          "avg_throughput": 0.0, "avg_utilization": load["utilization"]}}


def load_deprecated():
    """GET /get_load: one GetLoadReqOutput per DP rank."""
    running, waiting = REQUESTS.counts()
    return [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
             "num_tokens": 0, "ts_tic": time.perf_counter()}]


def forward(reqs, extend):
    """One scheduler step: every TP rank's worker runs forward_batch_generation.

    An exception there is what kills a real scheduler: logged as such, and
    the server exits 1."""
    if not State.workers:
        return True
    sa = State.server_args
    tp_size = max(1, int(sa.tp_size or 1))
    node = State.node
    with REQUESTS.forward_lock:
        sent = node.send_step(reqs, extend) if node is not None else []
        ranks = node.tp_ranks if node is not None else range(len(State.workers))
        try:
            for tp_rank, worker in zip(ranks, State.workers):
                RANK.update(tp_rank=tp_rank, tp_size=tp_size)
                if tp_size > 1:
                    configure_logging(sa, rank_prefix(sa, tp_rank, None))
                worker.forward_batch_generation(Batch(list(reqs), extend))
        except Exception:
            logging.getLogger("sglang.srt.managers.scheduler").error(
                "Scheduler hit an exception: %s" % get_exception_traceback())
            configure_logging(sa)
            logging.getLogger("sglang.srt.entrypoints.engine").error(
                "Received sigquit from a child process. It usually means the child failed.")
            flush_streams()
            State.fatal = 1
            return False
        finally:
            if tp_size > 1:
                configure_logging(sa)
        if sent:
            node.wait_step(sent)
        return True


def token_seconds():
    return max(0.0, env_float("FLEETPATCH_STANDIN_TOKEN_SECONDS", 0.01))


def scheduler_died(server_args, tp_rank):
    """In an except block: what SGLang logs when a scheduler raises, and the exit code."""
    configure_logging(server_args, rank_prefix(server_args, tp_rank, None))
    logging.getLogger("sglang.srt.managers.scheduler").error(
        "Scheduler hit an exception: %s" % get_exception_traceback())
    configure_logging(server_args)
    logging.getLogger("sglang.srt.entrypoints.engine").error(
        "Received sigquit from a child process. It usually means the child failed.")
    flush_streams()
    return 1


def prefill_log(new, running):
    """The scheduler's line for a prefill (EXTEND) batch of `new` requests."""
    logging.getLogger("sglang.srt.managers.scheduler").info(
        "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: 0.00, "
        "#running-req: %d, #queue-req: %d, " % (len(new), sum(getattr(r, "prompt_tokens", 1) for r in new),
                                                running, REQUESTS.counts()[1]))


def _spawned_scheduler(argv, tp_rank, dp_rank, conn):
    """A scheduler process (multiprocessing spawn): build this rank's worker with the
    tree's real code, say its token budget, then live as long as the server does."""
    install_stubs()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)   # the routing warnings were printed once, by the server
    try:
        server_args_mod, server_args = build_server_args(argv)
        apply_routing(server_args)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    tp_size = max(1, int(server_args.tp_size or 1))
    RANK.update(tp_rank=tp_rank, tp_size=tp_size)
    configure_logging(server_args, rank_prefix(server_args, tp_rank, dp_rank))
    try:
        worker = construct_worker(server_args_mod, server_args, tp_rank, dp_rank)
        conn.send(("ok", getattr(getattr(worker, "target_worker", None), "max_total_num_tokens", 400000)))
    except Exception:
        conn.send(("error", get_exception_traceback()))
        return
    try:
        conn.recv()   # EOF (or anything): the server is gone
    except (EOFError, OSError):
        pass


def spawn_scheduler(argv, tp_rank, dp_rank):
    """Build one rank's worker in a spawned scheduler process; its max_total_num_tokens."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_spawned_scheduler, args=(argv, tp_rank, dp_rank, there), daemon=True,
                       name="scheduler_TP%d" % tp_rank)
    proc.start()
    there.close()
    State.schedulers.append((proc, here))
    status, value = here.recv()
    if status != "ok":
        raise RuntimeError("the spawned scheduler failed:\n" + value)
    return value
