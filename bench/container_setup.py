"""What the container test bed costs: image builds and a container's start to ready.

    python bench/container_setup.py [--fresh] [--starts 5] [--out bench/container_setup.json]

On the tests' Docker daemon (FLEETPATCH_TEST_DOCKER_SOCK, else a private one started here):
the base image's import from the cached trixie root, the engine image's build (both cold
with --fresh, which removes the two images first; then a second, cached call of each),
and, --starts times, ``docker run`` of the engine container (the stand-in as main process,
host network) until its /health answers 200.  Needs root.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from fleetpatch_demo import containerhost, images
from fleetpatch_demo.dockerd import DEFAULT_SOCK, SOCK_ENV, Dockerd
from fleetpatch_demo.fleet import _free_ports


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def start_to_ready(docker: Dockerd, image: str) -> float:
    port = _free_ports(1)[0]
    name = f"fleetpatch-bench-{os.getpid()}-{port}"
    t = time.monotonic()
    docker.cli("run", "-d", "--name", name, "--restart", "always", "--network", "host",
               "-e", "FLEETPATCH_STANDIN_STARTUP_DELAY=0.2", image, *containerhost.server_argv(port, 4, 8))
    try:
        while not _healthy(port):
            if time.monotonic() - t > 60:
                raise RuntimeError(f"{name}: no 200 within 60 s")
            time.sleep(0.02)
        return time.monotonic() - t
    finally:
        containerhost.remove(docker, name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fresh", action="store_true", help="remove both images first: cold builds")
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--version", default="0.5.9")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    docker = Dockerd(os.environ.get(SOCK_ENV) or DEFAULT_SOCK)
    t = time.monotonic()
    reused = docker.ping()
    docker.start()
    result = {"daemon": "reused" if reused else f"started in {time.monotonic() - t:.2f}s"}
    if a.fresh:
        for tag in (images.engine_image(docker, a.version), images.base_image(docker)):
            docker.cli("rmi", "-f", tag)
    result["cold" if a.fresh else "first"] = images.build_times(docker, a.version)
    result["cached"] = images.build_times(docker, a.version)
    image = images.engine_image(docker, a.version)
    starts = [start_to_ready(docker, image) for _ in range(a.starts)]
    result["start_to_ready_s"] = {"runs": [round(s, 3) for s in starts],
                                  "median": round(statistics.median(starts), 3),
                                  "note": "includes the stand-in's 0.2 s model-load delay"}
    result["image"] = image
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
