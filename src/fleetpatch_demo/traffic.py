"""The demo's router and traffic: the real sglang-router on loopback in front of
the demo fleet, a steady mix of streaming and plain requests through it while
a step runs, and a live line of what happened to them.

The router outlives the demo command (the demo's hosts.yaml names it, so the
everyday commands need it); it is recorded in ``router.json`` under the demo's
root, and ``stop_router`` (``fleetpatch demo --down``) ends it by that record,
checking the pid still is that router. The load generator is threads of the
demo process: it ends when the step ends, at the latest with the demo.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from rich.console import Console
from rich.live import Live
from rich.text import Text

from fleetpatch.agent.procs import proc_stat

from .loadgen import CUT, FAILED, OK, LoadGen
from . import routerproc
from .routerproc import RouterProcess

RECORD = "router.json"
LOG = "router.log"
PIP_HINT = "pip install sglang-router"
# Request lengths at the stand-in's 0.01 s a token: 0.2 s, 0.6 s, 1.5 s, so a
# worker taken out of the router usually still has a request to finish.
TOKENS = (20, 60, 150)
CONCURRENCY = 4
PLAIN_EVERY = 3.0          # seconds between plain (not a terminal) traffic lines


def available() -> bool:
    return routerproc.router_command() is not None


def missing_line() -> str:
    return (f"sglang-router is not installed, so the demo runs without a router and traffic "
            f"(to see a rollout that drops no request: {PIP_HINT}).")


# ---------------------------------------------------------------- the router process


def start_router(root: Path, timeout: float = 30.0) -> Callable[[Dict[str, str]], str]:
    """Launch the router now, in the background (its start takes a second or two,
    as long as the fleet's); record it. Returns finish(worker_urls): waits until
    it answers and lists each worker (name -> URL) healthy, and gives its URL.
    finish raises RuntimeError or RouterError."""
    box: dict = {}

    def launch():
        try:
            rp = RouterProcess(root / LOG)
            metrics = int(rp.argv[rp.argv.index("--prometheus-port") + 1])
            stat = proc_stat(rp.proc.pid)
            _write_record(root, {"pid": rp.proc.pid, "starttime": str(stat.start) if stat else "", "port": rp.port,
                                 "metrics_port": metrics, "url": rp.url})
            box["rp"] = rp.wait_ready(timeout)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
            box["error"] = e

    thread = threading.Thread(target=launch, name="router-start", daemon=True)
    thread.start()

    def finish(worker_urls: Dict[str, str]) -> str:
        from fleetpatch.router import Router
        thread.join(timeout + 90)
        if "rp" not in box:
            raise RuntimeError(str(box.get("error") or "the router did not start"))
        router = Router(box["rp"].url)
        for url in worker_urls.values():
            router.add(url, timeout=timeout)
        return box["rp"].url

    finish.launched = thread  # type: ignore[attr-defined]
    return finish


def _write_record(root: Path, doc: dict) -> None:
    tmp = root / (RECORD + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(root / RECORD)


def read_record(root: Path) -> Optional[dict]:
    try:
        doc = json.loads((root / RECORD).read_text())
        return doc if isinstance(doc, dict) and isinstance(doc.get("pid"), int) else None
    except (OSError, ValueError):
        return None


def _is_that_router(doc: dict) -> bool:
    """The recorded router is alive (not a zombie), not a reused pid: same start
    time, and a router's command line (0.3.x retitles itself "sglang::router")."""
    stat = proc_stat(doc["pid"])
    if stat is None or stat.state == "Z" or str(stat.start) != str(doc.get("starttime")):
        return False
    try:
        with open(f"/proc/{doc['pid']}/cmdline", "rb") as f:
            return b"sglang" in f.read()
    except OSError:
        return False


def _group_members(pgid: int) -> List[int]:
    out = []
    for d in os.listdir("/proc"):
        stat = proc_stat(d) if d.isdigit() else None
        if stat and stat.state != "Z" and stat.pgrp == pgid:
            out.append(int(d))
    return out


def stop_router(root: Path, wait: float = 10.0) -> Optional[str]:
    """Stop the recorded router (SIGTERM, SIGKILL after `wait`) and forget it.
    A sentence saying what was done, or None when none is recorded."""
    doc = read_record(root)
    if doc is None:
        return None
    pid = doc["pid"]
    running = _is_that_router(doc)
    if running:
        # its own session: the group is the router and whatever it spawned
        for sig, grace in ((signal.SIGTERM, wait), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except OSError:
                pass
            deadline = time.monotonic() + grace
            while _group_members(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not _group_members(pid):
                break
    for name in (RECORD, RECORD + ".tmp"):
        try:
            (root / name).unlink()
        except OSError:
            pass
    if running:
        return f"Stopped the router {doc.get('url')} (pid {pid})."
    return f"The router {doc.get('url')} was not running."


def ports(doc: Optional[dict]) -> List[int]:
    return [int(p) for p in ((doc or {}).get("port"), (doc or {}).get("metrics_port")) if p]


# ---------------------------------------------------------------- traffic during a step


class Traffic:
    """A LoadGen through the router plus what the router lists, as one line."""

    def __init__(self, router_url: str, names_by_url: Dict[str, str], log: Optional[Path] = None):
        self.router_url = router_url
        self.log = log  # the router's, for the user when something goes wrong
        self.names_by_url = names_by_url
        self.lg = LoadGen(router_url, concurrency=CONCURRENCY, stream_share=0.5, tokens=TOKENS,
                          max_seconds=600, timeout=60)
        self.started = 0.0
        self.in_router = ""
        self._stop = threading.Event()
        self._poller: Optional[threading.Thread] = None

    def start(self) -> "Traffic":
        self.started = time.monotonic()
        self.lg.start()
        self._poller = threading.Thread(target=self._poll, name="router-list", daemon=True)
        self._poller.start()
        return self

    def _poll(self) -> None:
        from fleetpatch.router import Router, RouterError
        router = Router(self.router_url, http_timeout=2)
        while not self._stop.is_set():
            try:
                healthy = sorted(self.names_by_url.get(w.url, w.url) for w in router.list_workers()
                                 if w.healthy is not False)
                self.in_router = ",".join(healthy) or "none"
            except RouterError:
                self.in_router = "?"
            self._stop.wait(0.5)

    def stop(self, wait: float = 30.0) -> Dict[str, int]:
        """No new request; the counts once those in flight end (at most `wait` s;
        a second Ctrl-C stops waiting: the clients are daemon threads)."""
        self._stop.set()
        try:
            return self.lg.stop(wait)
        except KeyboardInterrupt:
            return self.lg.counts()

    def line(self) -> str:
        c = self.lg.counts()
        return (f"traffic {time.monotonic() - self.started:4.0f}s: {c['sent']} requests sent, {c[OK]} served, "
                f"{c[FAILED]} failed, {c[CUT]} cut, {c['in_flight']} in flight; "
                f"the router sends to: {self.in_router or '...'}")

    def __rich_console__(self, console, options):
        """The terminal line: short enough for 80 columns, never wrapped (Live redraws it in place)."""
        c = self.lg.counts()
        t = Text(f"traffic: sent {c['sent']}  ")
        t.append(f"served {c[OK]}", style="green")
        t.append("  ")
        t.append(f"failed {c[FAILED]}", style="bold red" if c[FAILED] else "")
        t.append("  ")
        t.append(f"cut {c[CUT]}", style="bold red" if c[CUT] else "")
        short = " ".join(n.rsplit("-", 1)[-1] for n in (self.in_router or "...").split(","))
        t.append(f"  router -> {short}", style="dim")
        t.truncate(options.max_width, overflow="ellipsis")
        t.no_wrap = True
        yield t


def run_child(console: Console, argv: List[str], traffic: Traffic,
              on_interrupt: Callable[[subprocess.Popen], None]) -> tuple:
    """Run `argv` with its output shown line by line and the traffic line under it:
    a refreshed rich line on a terminal, a plain line every PLAIN_EVERY s otherwise.
    (returncode, interrupted). The child reads a pipe, so it prints plain progress
    lines rather than its own live table, which would fight with this one."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def relay():
        for raw in proc.stdout:
            console.print(Text(raw.decode("utf-8", "replace").rstrip("\n")), soft_wrap=True)

    reader = threading.Thread(target=relay, name="relay", daemon=True)
    interrupted = False
    live = None
    try:
        if console.is_terminal:
            live = Live(traffic, console=console, refresh_per_second=4, transient=True, redirect_stdout=False,
                        redirect_stderr=False)
            live.start()
        reader.start()
        next_plain = time.monotonic() + PLAIN_EVERY
        while True:
            try:
                proc.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                if live is None and time.monotonic() >= next_plain:
                    console.print(Text(traffic.line()), soft_wrap=True)
                    next_plain += PLAIN_EVERY
            except KeyboardInterrupt:
                interrupted = True
                on_interrupt(proc)
        reader.join(10)
    finally:
        if proc.poll() is None:  # something other than the wait was interrupted
            interrupted = True
            on_interrupt(proc)
            try:
                proc.wait(120)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                proc.kill()
        if live is not None:
            live.stop()
    return proc.returncode, interrupted


def totals_line(counts: Dict[str, int], interrupted: bool = False) -> str:
    when = "until Ctrl-C" if interrupted else "during the rollout"
    return (f"Router traffic {when}: {counts['sent']} requests sent, {counts[OK]} served, "
            f"{counts[FAILED]} failed, {counts[CUT]} cut ({counts['streams']} of them streams).")
