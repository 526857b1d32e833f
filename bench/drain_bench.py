"""Drained against naive rollouts under load: requests failed, rollout wall time,
and the time fleetpatch adds per host beyond the drain itself.

    python bench/drain_bench.py --sizes 8,32 --out bench/drain_results.json

Per size N: the sshd test fleet (N hosts, the stand-in server: 20 ms a token,
0.5.9's SIGTERM drain) behind the real sglang-router (round_robin) on loopback;
N clients send half streaming, half plain requests of 0.2 s, 1.2 s and 3 s
through the router for the whole rollout (batches of N/4, stop grace 1 s).
First the drained rollout (router section), then, on a reset fleet, the same
rollout with --no-router (today's restart). Needs root and /usr/sbin/sshd,
like the tests; the router is the test extra's sglang-router.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fleetpatch_demo.fleet import Fleet, HostSpec  # noqa: E402
from fleetpatch_demo.loadgen import LoadGen  # noqa: E402
from fleetpatch_demo.routerproc import RouterProcess  # noqa: E402
from fleetpatch.router import Router  # noqa: E402

ENV = {"FLEETPATCH_STANDIN_TOKEN_SECONDS": "0.02", "FLEETPATCH_STANDIN_SIGTERM_POLL": "0.2"}
TOKENS = (10, 60, 150)


def inventory(fleet: Fleet, router_url: str) -> dict:
    doc = fleet.inventory()
    doc["defaults"]["router"] = {"urls": [router_url]}
    doc["defaults"]["server"]["restart"]["stop_grace"] = 1
    for name, h in fleet.hosts.items():
        doc["hosts"][name]["server"]["url"] = f"http://127.0.0.1:{h.http_port}"
    return doc


def one_rollout(fleet: Fleet, router_url: str, work: Path, n: int, extra: list) -> dict:
    fleet.reset_all()
    r = Router(router_url)
    for h in fleet.hosts.values():
        r.add(f"http://127.0.0.1:{h.http_port}", timeout=30)
    report = work / f"report-{n}-{'naive' if extra else 'drained'}.json"
    argv = [sys.executable, "-m", "fleetpatch", "rollout", "--patch", "dynamic-spec-disable", "--group", "all",
            "--canary", "0", "--batch", str(max(1, n // 4)), "--report", str(report), *extra]
    with LoadGen(router_url, concurrency=min(n, 32), tokens=TOKENS, max_seconds=1800) as lg:
        time.sleep(1.0)
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
        wall = time.monotonic() - t0
        time.sleep(0.5)
        counts = lg.stop()
    doc = json.loads(report.read_text())
    hosts = doc["hosts"].values()
    drains = [h["router"]["drained_s"] for h in hosts if h.get("router") and h["router"]["drained_s"] is not None]
    beyond = [h["duration_s"] - h["router"]["drained_s"] for h in hosts
              if h.get("router") and h["router"]["drained_s"] is not None]
    return {"hosts": n, "mode": "naive" if extra else "drained", "exit": proc.returncode, "wall_s": round(wall, 2),
            "verified": sum(1 for h in hosts if h["status"] == "verified"), **counts,
            "drain_s_mean": round(sum(drains) / len(drains), 2) if drains else None,
            "per_host_beyond_drain_s_mean": round(sum(beyond) / len(beyond), 2) if beyond else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8,32")
    ap.add_argument("--out", default=str(REPO / "bench" / "drain_results.json"))
    a = ap.parse_args(argv)
    rows = []
    for n in [int(x) for x in a.sizes.split(",") if x.strip()]:
        with tempfile.TemporaryDirectory(prefix=f"drainbench{n}-") as tmp:
            tmp = Path(tmp)
            specs = [HostSpec(f"b{i}", spec_v2=(i % 2 == 1), startup_delay=0.3, env=ENV) for i in range(n)]
            with Fleet(tmp / "fleet", specs) as fleet, RouterProcess(tmp / "router.log") as rp:
                (tmp / "hosts.yaml").write_text(yaml.safe_dump(inventory(fleet, rp.url), sort_keys=False))
                for extra in ([], ["--no-router"]):
                    row = one_rollout(fleet, rp.url, tmp, n, extra)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("| hosts | mode | wall s | sent | failed | cut | drain s (mean) | fleetpatch s/host beyond the drain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['hosts']} | {r['mode']} | {r['wall_s']} | {r['sent']} | {r['failed']} | {r['cut']} | "
              f"{r['drain_s_mean'] if r['drain_s_mean'] is not None else '-'} | "
              f"{r['per_host_beyond_drain_s_mean'] if r['per_host_beyond_drain_s_mean'] is not None else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
