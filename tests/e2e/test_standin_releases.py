"""The stand-in server on today's SGLang releases (0.5.15 on: v2 only, overlapped or
synchronous), run against each release's real files from its PyPI wheel.

For each release and path the stand-in must pick the worker that the profile
predicts (and that the tree's own spec_info.create_worker returns: the stand-in
calls it), log that release's routing line (the synchronous path's text is read
from the release's generated facts), dump ServerArgs in the release's shape, and
really import and construct the worker from the host's tree (a marker inserted in
the tree's worker __init__ is logged).
"""
from __future__ import annotations

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
from fleetpatch.engines.sglang_facts import FACTS_DIR
from support.standin_sites import standin_site

READY = "The server is fired up and ready to roll!"
EAGLE3 = ["--model-path", "/models/llama", "--speculative-algorithm", "EAGLE3",
          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4", "--port", "0"]
SYNC = ["--disable-overlap-schedule"]
# Releases whose real files the stand-in runs (0.5.20+: ServerArgs a msgspec Struct
# assembled from arg_groups/fields; 0.5.22+: the dump redacted, the Rust server).
RELEASES = ("0.5.15", "0.5.16", "0.5.19", "0.5.20", "0.5.22", "0.5.23")


def facts(version: str) -> dict:
    return json.loads((FACTS_DIR / f"{version}.json").read_text())["extracted"]


def sync_line(version: str) -> str:
    (text,) = [e["text"] for e in facts(version)["routing_log_lines"]["lines"]
               if e["text"].startswith("Non-overlap (synchronous) spec v2 is used")]
    return text


def mark_init(site: Path, rel_file: str, cls: str, text: str) -> None:
    """Log `text` as the first statement of cls.__init__ in the site's copy."""
    path = site / rel_file
    lines = path.read_text().splitlines(True)
    start = next(i for i, line in enumerate(lines) if re.match(r"class %s\b" % cls, line))
    d = next(i for i in range(start, len(lines)) if re.match(r"\s+def __init__\(", lines[i]))
    k = d
    while not re.search(r"\)\s*(->\s*[^:]+)?:\s*(#.*)?$", lines[k]):
        k += 1
    indent = re.match(r"\s*", lines[d]).group(0) + "    "
    lines.insert(k + 1, indent + "__import__('logging').getLogger(__name__).info(%r)\n" % text)
    path.write_text("".join(lines))


def run_until_ready(site: Path, args: list[str], timeout: float = 30,
                    extra_env: dict | None = None) -> tuple[int | None, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "FLEETPATCH_STANDIN_", "PYTHON"))}
    env.update(FLEETPATCH_STANDIN_STARTUP_DELAY="0", PYTHONPATH=str(site), **(extra_env or {}))
    log = site.parent / ("server-%d.log" % time.monotonic_ns())
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_standin", *args], cwd=site.parent, env=env,
                                stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and READY not in log.read_text() and proc.poll() is None:
            time.sleep(0.05)
        exited = proc.poll()
        if exited is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            finally:
                if proc.poll() is None:
                    proc.kill()
    return exited, log.read_text(errors="replace")


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("sync", [False, True], ids=["overlapped", "synchronous"])
def test_standin_runs_the_release_routing(tmp_path, version, sync):
    launch = EAGLE3 + (SYNC if sync else [])
    predicted = PROFILE.predict(version, LaunchConfig(["python3", "-m", "sglang.launch_server", *launch], {}))
    assert predicted.starts and predicted.path and predicted.overlap is (not sync), predicted
    site = standin_site(tmp_path / ("site-" + version), version)
    mark_init(site, predicted.file, predicted.path, "STANDIN-RELEASE-MARK " + predicted.path)
    rc, log = run_until_ready(site, launch)
    assert rc is None and READY in log, log[-3000:]
    assert "Traceback (most recent call last)" not in log, log
    # the worker the tree's create_worker returned, built from the host's file
    assert re.findall(r"STANDIN-RELEASE-MARK (\w+)$", log, re.M) == [predicted.path]
    assert (sync_line(version) in log) is sync
    (dump,) = [line for line in log.splitlines() if "server_args=" in line]
    shape = facts(version)["server_args_dump"]["shape"]
    payload = dump.split("server_args=", 1)[1]
    assert payload.startswith("ServerArgs(" if shape == "ServerArgs(...)" else "{"), (shape, dump[:200])
    assert ("'disable_overlap_schedule': True" in payload or "disable_overlap_schedule=True" in payload) is sync


def redacted(payload: str) -> bool:
    return "'watermark_key': '<redacted>'" in payload


@pytest.mark.parametrize("version", ["0.5.20", "0.5.22", "0.5.23"])
def test_rust_server_prints_the_ready_line_from_0522(tmp_path, version):
    """SGLANG_RUST_SERVER=1: from 0.5.22 the ready line is the Rust server's (the text
    the release's facts name a Rust .so for), Python's http_server logs none and
    uvicorn does not run; 0.5.20 still logs Python's."""
    rust_in_facts = any(r["source"].endswith(".so") for r in facts(version)["ready"])
    site = standin_site(tmp_path / ("site-" + version), version)
    rc, log = run_until_ready(site, EAGLE3 + SYNC, extra_env={"SGLANG_RUST_SERVER": "1"})
    assert rc is None, log[-3000:]
    (ready,) = [line for line in log.splitlines() if READY in line]
    python_line = re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] " + re.escape(READY) + "$", ready)
    assert (python_line is None) is rust_in_facts, (version, ready)
    assert ("Uvicorn running on" in log) is not rust_in_facts
    assert ("SGLANG_RUST_SERVER enabled, Rust server listen on 127.0.0.1:" in log) is rust_in_facts
    assert sync_line(version) in log
    (dump,) = [line for line in log.splitlines() if "server_args=" in line]
    assert redacted(dump) is (version >= "0.5.22")
