"""Multi-node launches (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``): the
rendezvous of every rank (torch.distributed's TCPStore, its errors as torch names them),
node 0 sending each step to the other nodes, and a node R >= 1's life (``follow``): the
dummy health server, the steps node 0 sends, its end when node 0 goes or shuts down."""
import errno
import json
import logging
import os
import signal
import socket
import time

from fleetpatch_standin_common.httpserver import make_http_server, serve_in_thread
from fleetpatch_standin_common.output import env_float, flush_streams
from fleetpatch_standin_common.serving import Stop

from .handler import Handler
from .release import version_tuple
from .scheduler import forward, scheduler_died
from .srtutils import get_free_port
from .state import State
from .workers import Req

logger = logging.getLogger("sglang.srt.entrypoints.engine")


# torch.distributed's errors, named as a traceback prints them.
class DistError(RuntimeError):
    pass


class DistStoreError(DistError):
    pass


class DistNetworkError(DistError):
    pass


for _cls in (DistError, DistStoreError, DistNetworkError):
    _cls.__module__ = "torch.distributed"


# What torch's store client raises when the other end of its connection has closed.
_CLOSED = "Failed to recv, got 0 bytes. Connection was likely closed."


class _Link(object):
    """One rendezvous connection: JSON lines over TCP."""

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""

    def send(self, msg):
        self.conn.sendall(json.dumps(msg).encode() + b"\n")

    def recv(self, deadline):
        """The next message; socket.timeout at the deadline, EOFError when the other side is gone."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.conn.settimeout(left)
            data = self.conn.recv(65536)
            if not data:
                raise EOFError(_CLOSED)
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line.decode("utf-8"))

    def close(self):
        try:
            self.conn.close()
        except OSError:
            pass


class Node(object):
    """This server's node in a multi-node launch, and its rendezvous."""

    def __init__(self, server_args):
        self.nnodes = max(1, int(getattr(server_args, "nnodes", 1) or 1))
        self.rank = int(getattr(server_args, "node_rank", 0) or 0)
        tp_size = max(1, int(server_args.tp_size or 1))
        pp_size = max(1, int(getattr(server_args, "pp_size", 1) or 1))
        # engine.py's rank ranges (_launch_scheduler_processes / _calculate_rank_ranges)
        nodes_per_pp_rank = max(self.nnodes // pp_size, 1)
        pp_per_node = max(pp_size // self.nnodes, 1)
        tp_per_node = tp_size // nodes_per_pp_rank
        first_tp = tp_per_node * (self.rank % nodes_per_pp_rank)
        first_pp = pp_per_node * (self.rank // nodes_per_pp_rank)
        self.tp_ranks = list(range(first_tp, first_tp + tp_per_node))
        self.world_size = tp_size * pp_size
        # ModelRunner: rank = tp_size * pp_rank + tp_rank
        self.ranks = [tp_size * pp + tp for pp in range(first_pp, first_pp + pp_per_node) for tp in self.tp_ranks]
        self.peers = []        # node 0: the link of every other node that joined
        self.link = None       # node R >= 1: the link to node 0
        self.store = None      # node 0: the listening socket, open as long as the server lives
        self.addr = _dist_init_addr(server_args) if self.nnodes > 1 else None
        self.timeout = _dist_timeout(server_args)

    @property
    def multi(self):
        return self.nnodes > 1

    def rendezvous(self):
        """Every rank joins before any goes on: init_process_group's TCPStore."""
        init = logging.getLogger("sglang.srt.model_executor.model_runner")
        newest = version_tuple() >= (0, 5, 21)   # distributed/bootstrap.py's init_parallel_runtime
        init.info("Init parallel begin." if newest else "Init torch distributed begin.")
        started = time.monotonic()
        deadline = started + self.timeout
        if self.rank == 0:
            self._serve_store(deadline)
        else:
            self._join_store(deadline)
        elapsed = time.monotonic() - started
        if newest:
            init.info("Init parallel ends. elapsed=%.2f s" % elapsed)
        elif version_tuple() >= (0, 5, 9):
            init.info("Init torch distributed ends. elapsed=%.2f s, mem usage=0.09 GB" % elapsed)
        else:
            init.info("Init torch distributed ends. mem usage=0.09 GB")

    def _serve_store(self, deadline):
        host, port = self.addr
        v6 = ":" in host
        store = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # like the TCPStore server: every interface, whatever HOST names
            store.bind(("::" if v6 else "0.0.0.0", port))
            store.listen(64)
        except OSError as e:
            store.close()
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. port: %d, useIpv6: %s, "
                "code: %d, name: %s, message: %s" % (port, str(v6).lower(), -(e.errno or 0),
                                                    errno.errorcode.get(e.errno, "?"), (e.strerror or "").lower())) from None
        self.store = store
        joined = set(self.ranks)
        while len(joined) < self.world_size:
            if time.monotonic() >= deadline:
                raise DistStoreError("Timed out after %d seconds waiting for clients. %d/%d clients joined."
                                     % (int(self.timeout) + 1, len(joined), self.world_size))
            store.settimeout(max(0.01, min(0.5, deadline - time.monotonic())))
            try:
                conn, _ = store.accept()
            except socket.timeout:
                continue
            link = _Link(conn)
            try:
                hello = link.recv(min(deadline, time.monotonic() + 5))
                ranks = set(int(r) for r in hello["ranks"])
            except (socket.timeout, EOFError, OSError, ValueError, KeyError, TypeError):
                link.close()
                continue
            if not ranks or ranks & joined or not all(0 <= r < self.world_size for r in ranks):
                link.close()   # a rank twice, or none of this world: not a member
                continue
            joined |= ranks
            self.peers.append(link)
        for link in list(self.peers):
            try:
                link.send({"go": self.world_size})
            except OSError:
                self.peers.remove(link)
        # Connections after this are held by the kernel and never answered: a late
        # node waits out its deadline, as against a world that has formed.

    def _join_store(self, deadline):
        host, port = self.addr
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistNetworkError("The client socket has timed out after %dms while trying to connect "
                                       "to (%s, %d)." % (int(self.timeout * 1000), host, port))
            try:
                conn = socket.create_connection((host, port), timeout=min(left, 2.0))
                break
            except OSError:
                time.sleep(min(0.1, max(0.0, left)))
        link = _Link(conn)
        try:
            link.send({"node_rank": self.rank, "ranks": self.ranks})
            link.recv(deadline)
        except socket.timeout:
            link.close()
            raise DistStoreError("Socket Timeout") from None
        except (EOFError, OSError):
            link.close()
            raise DistNetworkError(_CLOSED) from None
        conn.settimeout(None)
        self.link = link

    def send_step(self, reqs, extend):
        """Node 0: the step its workers run, to every other node (before its own)."""
        msg = {"forward": bool(extend), "reqs": [[r.rid, r.sampling_params.max_new_tokens] for r in reqs]}
        sent = []
        for link in list(self.peers):
            try:
                link.send(msg)
                sent.append(link)
            except OSError:
                self._drop(link)
        return sent

    def wait_step(self, sent):
        """Node 0: every node that took the step has run it; one that died is left out (#3099)."""
        for link in sent:
            try:
                link.recv(time.monotonic() + 30)
            except (socket.timeout, EOFError, OSError, ValueError):
                self._drop(link)

    def _drop(self, link):
        link.close()
        if link in self.peers:
            self.peers.remove(link)

    def shutdown(self):
        """Node 0, 0.5.21+: the ShutdownReq broadcast that stops every node's schedulers."""
        for link in list(self.peers):
            try:
                link.send({"shutdown": True})
            except OSError:
                pass


def _dist_init_addr(server_args):
    addr = getattr(server_args, "dist_init_addr", None)
    if not addr:
        # ModelRunner: tcp://127.0.0.1:<nccl_port>, a port of this node's own, so
        # nodes launched without --dist-init-addr never meet and time out.
        return "127.0.0.1", int(getattr(server_args, "nccl_port", None) or get_free_port())
    if addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
    else:
        host, _, port = addr.rpartition(":")
    return host, int(port)


def _dist_timeout(server_args):
    seconds = env_float("FLEETPATCH_STANDIN_DIST_TIMEOUT", None)
    if seconds is None:
        seconds = getattr(server_args, "dist_timeout", None)
    # torch's default for an NCCL process group (default_pg_nccl_timeout): 10 minutes
    return float(seconds) if seconds else 600.0


def fail_after(node):
    """FLEETPATCH_STANDIN_FAIL_RANK: seconds until this node's scheduler dies, or None."""
    wanted = os.environ.get("FLEETPATCH_STANDIN_FAIL_RANK", "").strip()
    if not wanted.isdigit() or int(wanted) != node.rank:
        return None
    return max(0.0, env_float("FLEETPATCH_STANDIN_FAIL_AFTER_S", 0.0))


class DummyHealthHandler(Handler):
    """utils/common.py's launch_dummy_health_check_server (every release 0.5.7 -
    0.5.23): a FastAPI app with GET /ping, /health, /health_generate answering 200;
    uvicorn at log_level "warning", so no access lines."""

    ROUTES = ("/ping", "/health", "/health_generate")

    def do_GET(self):
        if self.path.split("?", 1)[0] in self.ROUTES:
            self.send_body(200)
        else:
            self.send_body(404, b'{"detail":"Not Found"}')

    do_HEAD = do_GET

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.split("?", 1)[0] in self.ROUTES:
            self.send_body(405, b'{"detail":"Method Not Allowed"}')
        else:
            self.send_body(404, b'{"detail":"Not Found"}')

    def log_request(self, code="-", size="-"):
        pass


def _host_port(host, port):
    # 0.5.10+ logs NetworkAddress(host, port).to_host_port_str(): IPv6 in brackets
    if ":" in host and version_tuple() >= (0, 5, 10):
        return "[%s]:%s" % (host, port)
    return "%s:%s" % (host, port)


def _on_sigterm_follower(signum, frame):
    # engine.py 0.5.21+: a node R >= 1 waits for node 0's ShutdownReq broadcast;
    # before, SIGTERM ended it at once.
    if version_tuple() < (0, 5, 21):
        raise Stop()
    logging.getLogger("sglang.srt.entrypoints.engine").warning(
        "SIGTERM received on node_rank %d; waiting for the rank-0 ShutdownReq broadcast to stop "
        "the schedulers." % State.node.rank)


def follow(node, server_args):
    """A node R >= 1 after its workers are built (engine.py, node_rank >= 1): the
    dummy health server on --port, then the steps node 0 sends, until it goes."""
    host = server_args.host or "127.0.0.1"
    httpd = make_http_server(host, int(server_args.port), DummyHealthHandler)
    serve_in_thread(httpd, "health-check-server")
    logging.getLogger("sglang.srt.utils.common").info(
        "Dummy health check server started in background thread at %s" % _host_port(host, server_args.port))
    flush_streams()
    signal.signal(signal.SIGTERM, _on_sigterm_follower)
    fails_in = fail_after(node)
    dies_at = None if fails_in is None else time.monotonic() + fails_in
    first = node.tp_ranks[0]
    try:
        while True:
            if dies_at is not None and time.monotonic() >= dies_at:
                try:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered "
                                       "(stand-in FLEETPATCH_STANDIN_FAIL_RANK=%d)" % node.rank)
                except RuntimeError:
                    return scheduler_died(server_args, first)
            step = 0.2 if dies_at is None else max(0.01, min(0.2, dies_at - time.monotonic()))
            if node.link is None:   # --node-rank >= 1 with --nnodes 1: nobody to follow
                time.sleep(step)
                continue
            try:
                msg = node.link.recv(time.monotonic() + step)
            except socket.timeout:
                continue
            except (EOFError, OSError):
                # node 0 is gone: the scheduler's next broadcast over gloo fails
                try:
                    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
                                       "by peer [%s]:%d" % node.addr) from None
                except RuntimeError:
                    return scheduler_died(server_args, first)
            if msg.get("shutdown"):
                for _ in node.tp_ranks:
                    logger.error("Scheduler or DataParallelController %d terminated with 0" % os.getpid())
                return 0
            reqs = [Req(rid, n) for rid, n in msg.get("reqs", [])]
            if not forward(reqs, msg.get("forward")):
                return State.fatal
            node.link.send({"ok": True})
    finally:
        httpd.server_close()
