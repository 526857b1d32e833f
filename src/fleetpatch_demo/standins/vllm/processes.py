"""vLLM's processes: the API server, the EngineCore, the workers.

* EngineCore runs in a process of its own (multiprocessing, named ``EngineCore_DP0`` in 0.10.x,
  ``EngineCore`` later), started with ``VLLM_WORKER_MULTIPROC_METHOD`` (fork by default), unless
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: then it runs inside the API server's process.
* With ``--tensor-parallel-size`` N > 1 the EngineCore's MultiprocExecutor starts N worker
  processes ``Worker_TP<r>`` the same way; with N = 1 the UniProcExecutor runs the worker inside
  the EngineCore process.
* Each worker builds the drafter from the host's files, loads its (stubbed) model, compiles or
  loads from the compile cache, and runs the drafter's propose step at each engine step.

Messages go over multiprocessing pipes: ("step", n) -> ("ok", classes) or ("error", traceback).
A child whose parent is gone (EOF on its pipe) exits.
Stdlib only; Python 3.8+.
"""
import logging
import multiprocessing
import os
import signal
import sys
import traceback

from . import compile_cache, drafter, host as hostmod, routing

INFO = logging.INFO


class Launch(object):
    """What every process of the server needs to set itself up again (picklable for spawn)."""

    def __init__(self, site_dir, argv, env_method):
        self.site_dir, self.argv, self.method = site_dir, list(argv), env_method

    def parse(self):
        return routing.parse_argv(self.argv)

    @property
    def tp(self):
        return int(self.parse()[1].get("tensor-parallel-size", self.parse()[1].get("tp", 1)))


def mp_context(method):
    return multiprocessing.get_context(method)


# --------------------------------------------------------------------------- workers
class Worker(object):
    """One rank's model runner: the drafter of the launch, built from the host's files."""

    def __init__(self, launch, rank, host, envs, log):
        self.launch, self.rank, self.host, self.envs, self.log = launch, rank, host, envs, log
        self.drafter = None
        self.compiled = None

    def start(self):
        model, values, bare = self.launch.parse()
        route = routing.choose(self.host.release, self.envs, self.host.quoter, model, values, bare)
        route.hf_doc = routing.read_config(model)
        route.architectures = list(route.hf_doc.get("architectures") or [])
        if route.runner == "v2":
            # gpu_worker.py: the positive sign of Model Runner V2 (not in releases with V2 only)
            self.log.quoted(INFO, "vllm/v1/worker/gpu_worker.py", "Using V2 Model Runner")
        self.load_model_lines(route, model)
        if route.spec is None:
            return
        config = drafter.vllm_config(model, route, values, bare, self.launch.tp)
        self.drafter = drafter.build(self.host.release, route, config)
        self.compiled = compile_cache.start(self.log, self.drafter, self.envs.VLLM_CACHE_ROOT, self.rank,
                                            "enforce-eager" in bare, self.host.site_dir,
                                            config.scheduler_config.max_num_batched_tokens)

    def load_model_lines(self, route, model):
        """The model runner's load_model lines (its file: V1 gpu_model_runner.py, V2 gpu/model_runner.py)."""
        source = "vllm/v1/worker/gpu/model_runner.py" if route.runner == "v2" else "vllm/v1/worker/gpu_model_runner.py"
        for needle, arg in (("Starting to load model", model), ("Loading drafter model", None),
                            ("Model loading took", "0.01")):
            if needle == "Loading drafter model" and route.spec is None:
                continue
            hit = self.log.quoter.quote(source, needle)
            if hit is not None:
                self.log.emit(INFO, source, hit[1], hit[0], *compile_cache.fill(hit[0], arg, 0.01))

    def step(self):
        if self.drafter is not None:
            self.drafter.propose()
        return self.drafter.class_name if self.drafter else None


def worker_main(launch, rank, conn, parent_end):
    """A worker process (Worker_TP<rank>)."""
    if parent_end is not None:
        parent_end.close()
    host = hostmod.Host(launch.site_dir)
    envs, log = hostmod.set_up(host, host.worker_name(rank))
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    try:
        worker = Worker(launch, rank, host, envs, log)
        worker.start()
        conn.send(("ready", worker.drafter.class_name if worker.drafter else None))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    serve_steps(conn, worker.step)


def serve_steps(conn, step):
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if msg[0] == "stop":
            return
        try:
            conn.send(("ok", step()))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class Executor(object):
    """UniProcExecutor (TP 1: the worker in this process) or MultiprocExecutor (a process per rank)."""

    def __init__(self, launch, host, envs, log):
        self.launch, self.host, self.envs, self.log = launch, host, envs, log
        self.local = None
        self.links = []
        self.procs = []

    def start(self):
        tp = self.launch.tp
        if tp == 1:
            self.local = Worker(self.launch, 0, self.host, self.envs, self.log)
            self.local.start()
            return
        ctx = mp_context(self.launch.method)
        for rank in range(tp):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(name=self.host.worker_name(rank), target=worker_main,
                            args=(self.launch, rank, theirs, mine if self.launch.method == "fork" else None),
                            daemon=True)
            p.start()
            theirs.close()
            self.links.append(mine)
            self.procs.append(p)
        for link in self.links:
            kind, value = link.recv()
            if kind == "error":
                raise WorkerError(value)

    def step(self):
        if self.local is not None:
            return [self.local.step()]
        out = []
        for link in self.links:
            link.send(("step",))
        for link in self.links:
            kind, value = link.recv()
            if kind == "error":
                raise WorkerError(value)
            out.append(value)
        return out

    def stop(self):
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(5)


class WorkerError(Exception):
    """A worker's traceback (text)."""


# --------------------------------------------------------------------------- EngineCore
class EngineCore(object):
    def __init__(self, launch, host, envs, log):
        self.launch, self.host, self.envs, self.log = launch, host, envs, log
        self.executor = Executor(launch, host, envs, log)

    def start(self):
        model, values, bare = self.launch.parse()
        self.log.quoted(INFO, "vllm/v1/engine/core.py", "Initializing a V1 LLM engine", self.host.version,
                        config_repr(model, values))
        self.executor.start()

    def step(self):
        return self.executor.step()


def config_repr(model, values):
    keys = ("speculative-config", "tensor-parallel-size", "max-model-len", "dtype")
    parts = ["model=%r" % model] + ["%s=%s" % (k.replace("-", "_"), values[k]) for k in keys if k in values]
    return ", ".join(parts)


def engine_core_main(launch, conn, parent_end, name):
    """The EngineCore process: build the executor and its workers, then serve steps; an error is
    vLLM's "EngineCore failed to start." / "EngineCore encountered a fatal error." and exit 1."""
    if parent_end is not None:
        parent_end.close()
    host = hostmod.Host(launch.site_dir)
    envs, log = hostmod.set_up(host, name)
    core = EngineCore(launch, host, envs, log)
    signal.signal(signal.SIGTERM, lambda *a: (core.executor.stop(), os._exit(0)))
    try:
        core.start()
    except Exception as e:
        log_exception(log, "EngineCore failed to start.", e)
        conn.send(("error", "EngineCore failed to start."))
        core.executor.stop()
        sys.exit(1)
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            core.executor.stop()
            os._exit(0)
        if msg[0] == "stop":
            core.executor.stop()
            return
        try:
            conn.send(("ok", core.step()))
        except Exception as e:
            log_exception(log, "EngineCore encountered a fatal error.", e)
            conn.send(("error", "EngineCore encountered a fatal error."))
            core.executor.stop()
            sys.exit(1)


def log_exception(log, needle, exc):
    """core.py's logger.exception(needle) with the traceback (a worker's own, where it failed there)."""
    detail = str(exc) if isinstance(exc, WorkerError) else traceback.format_exc()
    hit = log.quoter.quote("vllm/v1/engine/core.py", needle)
    text, line = hit if hit else (needle, 0)
    log.emit(logging.ERROR, "vllm/v1/engine/core.py", line, text + "\n" + detail.rstrip())


class EngineClient(object):
    """The API server's side: the EngineCore in a process of its own, or in this one."""

    def __init__(self, launch, host, envs, log, multiprocess):
        self.launch, self.host, self.envs, self.log = launch, host, envs, log
        self.multiprocess = multiprocess
        self.proc = None
        self.conn = None
        self.inproc = None

    def start(self):
        if not self.multiprocess:
            self.inproc = EngineCore(self.launch, self.host, self.envs, self.log)
            self.inproc.start()
            return True
        ctx = mp_context(self.launch.method)
        mine, theirs = ctx.Pipe()
        name = self.host.engine_core_name()
        self.proc = ctx.Process(name=name, target=engine_core_main,
                                args=(self.launch, theirs, mine if self.launch.method == "fork" else None, name))
        self.proc.start()
        theirs.close()
        self.conn = mine
        try:
            kind, _ = self.conn.recv()
        except EOFError:
            kind = "error"
        return kind == "ready"

    def step(self):
        """One engine step; raises EngineDead if the engine failed."""
        if self.inproc is not None:
            try:
                return self.inproc.step()
            except Exception as e:
                log_exception(self.log, "EngineCore encountered a fatal error.", e)
                raise EngineDead()
        try:
            self.conn.send(("step",))
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            raise EngineDead()
        if kind != "ok":
            raise EngineDead()
        return value

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else os.getpid()

    def stop(self):
        if self.inproc is not None:
            self.inproc.executor.stop()
        if self.proc is not None and self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


class EngineDead(Exception):
    pass
