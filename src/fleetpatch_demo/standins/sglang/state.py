"""The server's state, shared by its HTTP handler, its scheduler loop and main:
``State`` (readiness, the workers, the node, SIGTERM, a fatal exit) and ``REQUESTS``
(running and waiting requests, as the real scheduler counts them)."""
import threading
import time


class State(object):
    """The server process's state (one server per process), set by main and read by the
    handler, the scheduler loop and the nodes."""

    ready = False
    warming = False         # the warmup request is being served (before ready)
    loop = None             # steps.StepLoop: the scheduler loop
    server_args = None
    api_key_check = None    # auth.ApiKeyCheck: --api-key / --admin-api-key, checked before any route
    scheduler_info = {}
    version = "unknown"
    workers = []            # the constructed draft worker of each TP rank (of this node)
    node = None             # Node: this server's place in a multi-node launch
    schedulers = []         # FLEETPATCH_STANDIN_SPAWN_SCHEDULER: (process, pipe) of each spawned scheduler
    terminating = False     # SIGTERM received: drain, then exit
    fatal = None            # exit code once the scheduler died during a request
    rust_server = False     # SGLANG_RUST_SERVER=1 on 0.5.22+: no uvicorn, the Rust ready line


class RequestCounts(object):
    """Running and waiting requests, as the real scheduler counts them.

    A request waits until one of ``max_running_requests`` slots is free, then
    runs; the counts are what /v1/loads and /get_load report and what the
    SIGTERM watchdog waits for."""

    def __init__(self):
        self.lock = threading.Lock()
        self.forward_lock = threading.Lock()  # one scheduler loop: forwards are serial
        self.slots = None
        self.running = {}   # rid -> start time
        self.waiting = {}

    def setup(self, max_running):
        self.slots = threading.Semaphore(max(1, int(max_running)))

    def unfinished(self):
        with self.lock:
            return list(self.waiting) + list(self.running)

    def counts(self):
        with self.lock:
            return len(self.running), len(self.waiting)

    def enter(self, rid):
        with self.lock:
            self.waiting[rid] = time.time()
        self.slots.acquire()
        with self.lock:
            self.waiting.pop(rid, None)
            self.running[rid] = time.time()

    def leave(self, rid):
        with self.lock:
            started = self.running.pop(rid, None)
        if started is not None:
            self.slots.release()


REQUESTS = RequestCounts()
