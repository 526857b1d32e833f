"""Floods of the server's log, judged in bounded memory. Issue 24 (4): every line of the log since the restart is judged. A server that
prints 200 MB right after its restart, before its settings dump, its marker and its
ready line, verifies; the laptop and the agent stay in bounded memory.

The flood is the server's own interpreter: a .pth in the host's site-packages that
writes 200 MB to stdout (which a `command` restart appends to the log) when the
server's environment asks for it, before SGLang's (the stand-in's) first line."""
from __future__ import annotations

import os
import threading
import time

from support.waits import wait_for
from support.localhost import job
from fleetpatch import steps

FLOOD_MB = 200
LINE = b"[2026-01-05 10:11:12] INFO chatty: " + b"x" * 64 + b"\n"

FLOOD_PTH = (
    "import os, sys; n = int(os.environ.get('FLOODTEST_MB') or 0); "
    "block = (" + repr(LINE) + " * ((1 << 20) // " + str(len(LINE)) + ")) if n else b''; "
    "list(map(sys.stdout.buffer.write, [block] * n)); n and sys.stdout.buffer.flush()\n")


def rss_kb(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def agent_rss_kb() -> int:
    """The largest resident size of a running fleetpatch agent (found by its bootstrap)."""
    most = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"fleetpatch-agent" not in f.read():
                        continue
            except OSError:
                continue
            most = max(most, rss_kb(pid))
    return most


def test_a_200_mb_flood_before_the_marker_is_judged_to_the_end_and_verifies(lh):
    (lh.site / "zz_floodtest.pth").write_text(FLOOD_PTH)
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "0", "FLOODTEST_MB": str(FLOOD_MB)})
    peaks = {"agent_kb": 0, "laptop_kb": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peaks["agent_kb"] = max(peaks["agent_kb"], agent_rss_kb())
            peaks["laptop_kb"] = max(peaks["laptop_kb"], rss_kb("self"))
            time.sleep(0.05)

    before_kb = rss_kb("self")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = steps.deploy(job(lh, host=host, timeout=120)[0], host)
    finally:
        stop.set()
        watcher.join()
    growth_mb = (peaks["laptop_kb"] - before_kb) / 1024
    print(f"\n{FLOOD_MB} MB before the marker: {r.status}, {r.details.get('log_lines')} lines judged, "
          f"{r.details.get('log_lines_kept')} kept, agent peak RSS {peaks['agent_kb'] / 1024:.0f} MB, "
          f"laptop RSS growth {growth_mb:.0f} MB")
    log = lh.log.read_bytes()
    marker_at = log.find(b"fleetpatch spec-path-beacon: EAGLEWorker (")
    assert log.count(LINE) >= FLOOD_MB * ((1 << 20) // len(LINE)), "the flood was written"
    assert marker_at > FLOOD_MB << 20, "the marker comes after the flood"
    assert r.status == "verified" and r.executed_path == "EAGLEWorker", r.message
    marker_line = log[:marker_at].count(b"\n") + 1
    assert any(m["line_no"] == marker_line for m in r.markers), (marker_line, r.markers)
    assert r.details["log_lines"] >= log[:marker_at].count(b"\n"), "every line up to the marker was judged"
    assert r.details["log_lines_kept"] < 5000, "the laptop keeps what decides, not the flood"
    assert peaks["agent_kb"] < 100 * 1024, f"agent peak RSS {peaks['agent_kb']} kB"
    assert growth_mb < 150, f"the laptop grew {growth_mb:.0f} MB"
    assert not lh.lock.exists()


BURST_MB = 200


def test_a_200_mb_burst_after_the_restart_verifies_in_seconds_with_bounded_memory(lh):
    """A second writer appends 200 MB to the log while the server starts (after its
    markers, before its ready line): the agent reads in bounded chunks, the laptop keeps
    a bounded window and judges incrementally, and the host verifies in seconds."""
    import resource
    import threading
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "1.0"})
    line = b"[2026-01-05 10:11:12] INFO chatty: " + b"x" * 64 + b"\n"
    block = line * ((1 << 20) // len(line))
    peaks = {"agent_kb": 0}
    stop = threading.Event()

    def flood():
        if not wait_for(lambda: lh.log.exists() and b"Uvicorn running" in lh.log.read_bytes()):
            return
        with open(lh.log, "ab") as f:
            for _ in range(BURST_MB):
                f.write(block)
        peaks["flooded_at"] = time.monotonic()

    def watch():
        while not stop.is_set():
            peaks["agent_kb"] = max(peaks["agent_kb"], agent_rss_kb())
            time.sleep(0.05)

    threads = [threading.Thread(target=flood, daemon=True), threading.Thread(target=watch, daemon=True)]
    for t in threads:
        t.start()
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    try:
        r = steps.deploy(job(lh, host=host, timeout=60)[0], host)
    finally:
        took = time.monotonic() - started
        stop.set()
        for t in threads:
            t.join()
    laptop_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    print(f"\n200 MB burst: {r.status} in {took:.1f}s, agent peak RSS {peaks['agent_kb'] / 1024:.0f} MB, "
          f"laptop peak growth {laptop_growth_mb:.0f} MB, lines not kept {r.details.get('log_lines_not_kept')}")
    assert "flooded_at" in peaks and lh.log.stat().st_size > BURST_MB * len(block), "the burst was written"
    assert r.status == "verified", r.message
    assert took < 30, f"verification took {took:.1f}s"
    assert peaks["agent_kb"] < 100 * 1024, f"agent peak RSS {peaks['agent_kb']} kB"
    assert laptop_growth_mb < 150, f"laptop grew {laptop_growth_mb:.0f} MB"
    assert not lh.lock.exists()


# ------------------------------------------- 6: stacked patches and --force
