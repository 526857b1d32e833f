"""The stand-in server across nodes (--nnodes/--node-rank/--dist-init-addr), and
several stand-ins on one host, as real processes on 127.0.0.1.

Each node runs from a package dir of its own (a copy of the release's real files
from its PyPI wheel), as on two hosts, so a patch on one host shows only in the
log of the node that runs there. The nodes meet over TCP on the dist-init-addr
as torch.distributed's TCPStore does: node 0 answers nothing until every rank
has joined; a node R >= 1 serves only SGLang's dummy health check on --port.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetpatch.engines.base import LaunchConfig
from fleetpatch.engines.sglang import PROFILE
from support.standin_sites import standin_site
from support.ports import free_port

READY = "The server is fired up and ready to roll!"
DUMMY = "Dummy health check server started in background thread at 127.0.0.1:%d"
# EAGLE3 on the path each release routes it to: 0.5.9's v1 EAGLEWorker (topk 4,
# no SGLANG_ENABLE_SPEC_V2), the overlapped EAGLEWorkerV2 of the v2-only releases (topk 1).
TOPK = {"0.5.9": "4", "0.5.15": "1", "0.5.23": "1"}
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def launch(version: str) -> list[str]:
    return ["--model-path", "/models/llama", "--speculative-algorithm", "EAGLE3",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", TOPK[version],
            "--speculative-num-draft-tokens", "4" if TOPK[version] == "1" else "8"]


def node_args(version: str, rank: int, port: int, dist_port: int) -> list[str]:
    return launch(version) + ["--tp-size", "2", "--nnodes", "2", "--node-rank", str(rank),
                              "--dist-init-addr", "127.0.0.1:%d" % dist_port, "--port", str(port)]


def mark_def(site: Path, version: str, method: str, text: str) -> str:
    """Log `text` first thing in `method` of the worker class this release runs, in
    this site's copy only; the class's name."""
    predicted = PROFILE.predict(version, LaunchConfig(["python3", "-m", "sglang.launch_server",
                                                       *launch(version), "--tp-size", "2"], {}))
    path = site / predicted.file
    lines = path.read_text().splitlines(True)
    start = next(i for i, line in enumerate(lines) if re.match(r"class %s\b" % predicted.path, line))
    d = next(i for i in range(start, len(lines)) if re.match(r"\s+def %s\(" % method, lines[i]))
    k = d
    while not re.search(r"\)\s*(->\s*[^:]+)?:\s*(#.*)?$", lines[k]):
        k += 1
    indent = re.match(r"\s*", lines[d]).group(0) + "    "
    lines.insert(k + 1, indent + "__import__('logging').getLogger(__name__).info(%r)\n" % text)
    path.write_text("".join(lines))
    return predicted.path


class Proc:
    """A stand-in started as fleetpatch's launcher starts SGLang: stdout and stderr
    appended to a log of its own."""

    def __init__(self, site: Path, args: list[str], log: Path, env: dict | None = None):
        self.log = log
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "FLEETPATCH_STANDIN_", "PYTHON"))}
        clean.update(FLEETPATCH_STANDIN_STARTUP_DELAY="0", PYTHONPATH=str(site), **(env or {}))
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "sglang_standin", *args], cwd=site.parent,
                                         env=clean, stdout=out, stderr=out, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError("no %r in %s (exit %s):\n%s" % (needle, self.log.name, self.proc.poll(),
                                                               self.text()[-3000:]))

    def wait_exit(self, timeout: float = 15) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s still runs:\n%s" % (self.log.name, self.text()[-3000:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start(tmp_path):
    """start(site, args, log_name, env=None) -> Proc; every one is stopped after the test."""
    started = []

    def _start(site: Path, args: list[str], name: str, env: dict | None = None) -> Proc:
        p = Proc(site, args, tmp_path / name, env)
        started.append(p)
        return p
    yield _start
    for p in started:
        p.stop()


def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def generate(port: int, text: str = "The capital of France is") -> tuple[int, bytes]:
    return request(port, "POST", "/generate", {"text": text, "sampling_params": {"max_new_tokens": 2}})


def prefixes(text: str) -> set[str]:
    """The rank prefixes of a log's scheduler lines ('' for the server's own)."""
    return set(re.findall(STAMP + r"((?: \w+)*)\] ", text))


# ---------------------------------------------------------------------------
# two nodes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["0.5.9", "0.5.15"])
def test_two_nodes_meet_and_each_runs_its_own_hosts_worker(tmp_path, start, version):
    a, b = standin_site(tmp_path / "host-a", version), standin_site(tmp_path / "host-b", version)
    cls = mark_def(b, version, "__init__", "PATCH-MARK host-b")
    mark_def(b, version, "forward_batch_generation", "STEP-MARK host-b")
    port0, port1, dist = free_port(), free_port(), free_port()
    n0 = start(a, node_args(version, 0, port0, dist), "node0.log")
    n1 = start(b, node_args(version, 1, port1, dist), "node1.log")
    log0 = n0.wait_for(READY)
    log1 = n1.wait_for(DUMMY % port1)

    # each node built its own TP rank's worker, from its own host's file
    assert re.search(STAMP + r" TP1\] PATCH-MARK host-b$", log1, re.M), (cls, log1[-3000:])
    assert "PATCH-MARK" not in log0
    assert prefixes(log0) == {"", " TP0"} and prefixes(log1) == {"", " TP1"}
    for log, rank in ((log0, 0), (log1, 1)):
        assert re.search(STAMP + r" TP%d\] Init torch distributed begin\.$" % rank, log, re.M)
        assert re.search(STAMP + r" TP%d\] Init torch distributed ends\. elapsed=" % rank, log, re.M)
        assert re.search(STAMP + r" TP%d\] max_total_num_tokens=" % rank, log, re.M)
        assert "Traceback" not in log
    assert READY not in log1 and "Uvicorn running" not in log1

    # a step node 0 serves runs on node 1's worker too (TP ranks step together)
    before = len(re.findall(STAMP + r" TP1\] STEP-MARK host-b$", n1.text(), re.M))   # the warmup request's
    status, body = generate(port0)
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 2
    steps = re.findall(STAMP + r" TP1\] STEP-MARK host-b$", n1.text(), re.M)
    assert len(steps) == before + 3   # the prefill (EXTEND) batch, then a DECODE batch per token
    assert "STEP-MARK" not in n0.text()


def test_node_zero_is_not_ready_until_node_one_joins(tmp_path, start):
    a, b = standin_site(tmp_path / "host-a", "0.5.9"), standin_site(tmp_path / "host-b", "0.5.9")
    port0, port1, dist = free_port(), free_port(), free_port()
    n0 = start(a, node_args("0.5.9", 0, port0, dist), "node0.log")
    n0.wait_for("Init torch distributed begin.")
    waited_until = time.monotonic() + 1.0
    while time.monotonic() < waited_until:
        # SGLang starts its HTTP server once the schedulers are up: nothing listens yet
        with pytest.raises(ConnectionRefusedError):
            request(port0, "GET", "/health")
        time.sleep(0.1)
    assert n0.proc.poll() is None
    assert READY not in n0.text() and "Init torch distributed ends" not in n0.text()
    assert "Load weight begin" not in n0.text()   # no worker before the world has formed

    joined_at = time.monotonic()
    n1 = start(b, node_args("0.5.9", 1, port1, dist), "node1.log")
    n0.wait_for(READY)
    assert request(port0, "GET", "/health")[0] == 200
    elapsed = float(re.search(r"TP0\] Init torch distributed ends\. elapsed=([\d.]+) s", n0.text()).group(1))
    assert elapsed >= 1.0   # node 0 waited in the rendezvous all along
    n1.wait_for(DUMMY % port1)
    assert time.monotonic() - joined_at < 10


def test_node_one_serves_no_real_api_only_the_dummy_health_check(tmp_path, start):
    a, b = standin_site(tmp_path / "host-a", "0.5.9"), standin_site(tmp_path / "host-b", "0.5.9")
    port0, port1, dist = free_port(), free_port(), free_port()
    n0 = start(a, node_args("0.5.9", 0, port0, dist), "node0.log")
    n1 = start(b, node_args("0.5.9", 1, port1, dist), "node1.log")
    n0.wait_for(READY)
    n1.wait_for(DUMMY % port1)
    for path in ("/health", "/health_generate", "/ping"):
        assert request(port1, "GET", path) == (200, b""), path
    for path in ("/v1/loads", "/get_load", "/server_info", "/get_server_info", "/model_info"):
        assert request(port1, "GET", path) == (404, b'{"detail":"Not Found"}'), path
    assert generate(port1)[0] == 404
    # uvicorn at log_level "warning": node 1 logs no access line, nor any uvicorn line
    assert "INFO:" not in n1.text()
    # node 0 answers all of it
    assert request(port0, "GET", "/v1/loads")[0] == 200
    info = json.loads(request(port0, "GET", "/server_info")[1])
    assert (info["nnodes"], info["node_rank"], info["dist_init_addr"]) == (2, 0, "127.0.0.1:%d" % dist)


def test_a_failed_node_one_leaves_node_zero_serving(tmp_path, start):
    """FLEETPATCH_STANDIN_FAIL_RANK=1: node 1's scheduler dies after start, and node 0
    goes on answering /health 200 and /generate (upstream SGLang issue #3099). Both
    nodes get the same environment, as a fleet would: only rank 1 acts on it."""
    a, b = standin_site(tmp_path / "host-a", "0.5.9"), standin_site(tmp_path / "host-b", "0.5.9")
    port0, port1, dist = free_port(), free_port(), free_port()
    env = {"FLEETPATCH_STANDIN_FAIL_RANK": "1", "FLEETPATCH_STANDIN_FAIL_AFTER_S": "0.5"}
    n0 = start(a, node_args("0.5.9", 0, port0, dist), "node0.log", env)
    n1 = start(b, node_args("0.5.9", 1, port1, dist), "node1.log", env)
    n0.wait_for(READY)
    n1.wait_for(DUMMY % port1)
    assert request(port1, "GET", "/health")[0] == 200   # up, before its failure
    assert n1.wait_exit() == 1
    log1 = n1.text()
    assert re.search(STAMP + r" TP1\] Scheduler hit an exception: Traceback \(most recent call last\):$",
                     log1, re.M), log1[-2000:]
    assert "FLEETPATCH_STANDIN_FAIL_RANK=1" in log1
    assert re.search(STAMP + r"\] Received sigquit from a child process\. It usually means the child failed\.$",
                     log1, re.M)
    with pytest.raises(ConnectionRefusedError):
        request(port1, "GET", "/health")

    assert n0.proc.poll() is None
    assert request(port0, "GET", "/health")[0] == 200
    status, body = generate(port0)
    assert status == 200 and json.loads(body)["text"]
    assert "Traceback" not in n0.text() and "FLEETPATCH_STANDIN_FAIL_RANK" not in n0.text()


def test_a_rank_that_never_joins_times_the_rendezvous_out(tmp_path, start):
    """Node 0 alone: torch's TCPStore gives up waiting for clients; node 1 alone (its
    rank 0 never there): the client gives up connecting. Each exits 1 unready."""
    site = standin_site(tmp_path / "host-a", "0.5.9")
    env = {"FLEETPATCH_STANDIN_DIST_TIMEOUT": "1"}
    port0, port1, dist0, dist1 = free_port(), free_port(), free_port(), free_port()
    began = time.monotonic()
    n0 = start(site, node_args("0.5.9", 0, port0, dist0), "node0.log", env)
    n1 = start(site, node_args("0.5.9", 1, port1, dist1), "node1.log", env)
    assert n0.wait_exit() == 1 and n1.wait_exit() == 1
    assert time.monotonic() - began < 10
    log0, log1 = n0.text(), n1.text()
    assert re.search(STAMP + r" TP0\] Scheduler hit an exception: Traceback", log0), log0[-2000:]
    assert ("torch.distributed.DistStoreError: Timed out after 2 seconds waiting for clients. "
            "1/2 clients joined.") in log0
    assert re.search(STAMP + r" TP1\] Scheduler hit an exception: Traceback", log1), log1[-2000:]
    assert ("torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying "
            "to connect to (127.0.0.1, %d)." % dist1) in log1
    for log in (log0, log1):
        assert "Received sigquit from a child process. It usually means the child failed." in log
        assert READY not in log and "Dummy health check server" not in log and "Load weight" not in log


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_node_one_goes_when_node_zero_does(tmp_path, start, version):
    """Before 0.5.21 node 0's end kills node 1's scheduler (its next gloo broadcast
    fails). From 0.5.21 a SIGTERM on node 1 is logged and it waits for node 0's
    ShutdownReq broadcast, which node 0 sends when it exits gracefully."""
    a, b = standin_site(tmp_path / "host-a", version), standin_site(tmp_path / "host-b", version)
    port0, port1, dist = free_port(), free_port(), free_port()
    env = {"FLEETPATCH_STANDIN_SIGTERM_POLL": "0.1"}
    n0 = start(a, node_args(version, 0, port0, dist), "node0.log", env)
    n1 = start(b, node_args(version, 1, port1, dist), "node1.log", env)
    n0.wait_for(READY)
    n1.wait_for(DUMMY % port1)
    shutdown_broadcast = tuple(map(int, version.split("."))) >= (0, 5, 21)
    if shutdown_broadcast:
        n1.proc.send_signal(signal.SIGTERM)
        n1.wait_for("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast to stop "
                    "the schedulers.")
        assert request(port1, "GET", "/health")[0] == 200 and n1.proc.poll() is None
    n0.proc.send_signal(signal.SIGTERM)
    assert n0.wait_exit() == 0
    if shutdown_broadcast:
        assert n1.wait_exit() == 0
        assert "Scheduler or DataParallelController %d terminated with 0" % n1.proc.pid in n1.text()
        assert "Traceback" not in n1.text()
    else:
        assert n1.wait_exit() == 1
        assert re.search(STAMP + r" TP1\] Scheduler hit an exception: Traceback", n1.text())
        assert "Connection closed by peer [127.0.0.1]:%d" % dist in n1.text()
    assert "Traceback" not in n0.text()


# ---------------------------------------------------------------------------
# several stand-ins on one host
# ---------------------------------------------------------------------------

def test_two_standins_from_one_package_dir_serve_on_two_ports_with_their_own_logs(tmp_path, start):
    site = standin_site(tmp_path / "site", "0.5.9")
    ports = free_port(), free_port()
    servers = [start(site, launch("0.5.9") + ["--port", str(p)], "server-%d.log" % p) for p in ports]
    for s in servers:
        s.wait_for(READY)
    for s, port in zip(servers, ports):
        assert request(port, "GET", "/health")[0] == 200
        assert generate(port, "to %d" % port)[0] == 200
    time.sleep(0.2)
    for s, port, o, other in zip(servers, ports, reversed(servers), reversed(ports)):
        text = s.text()
        assert "Uvicorn running on http://127.0.0.1:%d " % port in text
        assert "Started server process [%d]" % s.proc.pid in text
        assert "Started server process [%d]" % o.proc.pid not in text
        assert "Uvicorn running on http://127.0.0.1:%d " % other not in text
        assert text.count(READY) == 1 and text.count('"POST /generate HTTP/1.1" 200') == 2  # warm-up + ours
