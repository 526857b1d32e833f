"""How busy the machine is, moment by moment, while each tool does the bench's job (issue 34).

The bench's "machine busy" is one figure per run. At 32 hosts on 2 cores a tool's wall time is
about its CPU over the two cores, plus the moments the cores sit idle: this script shows when
those are. One fleet of N sshd hosts (loopback, the bench's hosts and reset), the tools
interleaved per repeat after a warm-up round, /proc/stat sampled every 50 ms during each run,
and per run a line of the machine's busy share in BUCKET_S steps:

    python3 bench/busy_timeline.py [--hosts 32] [--repeats 3] [--tools fleetpatch,pyinfra]
                                   [--json FILE]

Tools: fleetpatch, fleetpatch-noprobe, pyinfra, baseline (run as bench/run.py runs them:
fleetpatch from the bench's venv, installed from this checkout first).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: the fleet, the tools, the reset)
from fleetpatch_demo.fleet import Fleet, HostSpec  # noqa: E402

SAMPLE_S = 0.05
BUCKET_S = 0.25
TOOLS = ("fleetpatch", "fleetpatch-noprobe", "pyinfra", "baseline")


class BusySampler(threading.Thread):
    """(seconds since the start, busy jiffies, all jiffies) of the whole machine every SAMPLE_S."""

    def __init__(self):
        super().__init__(name="busy-sampler", daemon=True)
        self.samples: list[tuple[float, int, int]] = []
        self._finished = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while True:
            self.samples.append((time.monotonic() - t0, *bench.cpu_busy()))
            if self._finished.wait(SAMPLE_S):
                return

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self._finished.set()
        self.join()

    def buckets(self) -> list[int]:
        """The busy share (%) of each BUCKET_S step of the run."""
        out, start, s = [], 0.0, self.samples
        while len(s) > 1 and start < s[-1][0]:
            seg = [x for x in s if start <= x[0] < start + BUCKET_S + 1e-9]
            if len(seg) >= 2:
                out.append(round(100 * (seg[-1][1] - seg[0][1]) / max(1, seg[-1][2] - seg[0][2])))
            start += BUCKET_S
        return out

    def busy_pct(self) -> int:
        (_, b0, a0), (_, b1, a1) = self.samples[0], self.samples[-1]
        return round(100 * (b1 - b0) / max(1, a1 - a0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tools", default="fleetpatch,pyinfra")
    ap.add_argument("--json", default=None, help="also write every run's buckets here")
    a = ap.parse_args()
    tools = [t for t in a.tools.split(",") if t]
    if not tools or set(tools) - set(TOOLS):
        ap.error(f"--tools: choose from {','.join(TOOLS)}, not {a.tools!r}")
    if not 1 <= a.hosts <= bench.MAX_HOSTS or a.repeats < 1:
        ap.error(f"--hosts takes 1..{bench.MAX_HOSTS} and --repeats 1 or more")
    bench.ensure_tools(True, need_pyinfra="pyinfra" in tools, need_ansible=False)
    if any(t.startswith("fleetpatch") for t in tools):
        bench.install_fleetpatch(True)
    diff_text = bench.DIFF.read_text()
    files = bench.changed_files(diff_text)
    root = Path(tempfile.mkdtemp(prefix="fp-busy-"))
    wd = root / "work"
    wd.mkdir()
    specs = [HostSpec(f"h{i:02d}", version=bench.VERSION, spec_v2=(i % 2 == 1), startup_delay=0.0)
             for i in range(a.hosts)]
    runs = []
    try:
        with Fleet(root / "fleet", specs) as fleet:
            net, names = bench.loopback_net(fleet), fleet.names
            runners = {
                "fleetpatch": lambda tag: bench.run_fleetpatch(fleet, names, wd, tag, net),
                "fleetpatch-noprobe": lambda tag: bench.run_fleetpatch(fleet, names, wd, tag, net, probe=False),
                "pyinfra": lambda tag: bench.run_pyinfra(fleet, names, wd, tag, files, net),
                "baseline": lambda tag: bench.run_baseline(fleet, names, wd, tag, diff_text, files, net),
            }
            for rep in range(a.repeats + 1):        # round 0 warms each tool's caches on the hosts
                for tool in tools:
                    bench.reset_keeping_agent_cache(fleet)
                    fleet.clear_commands()
                    bench.wait_quiet(15)
                    with BusySampler() as sampler:
                        r = runners[tool](f"{tool}-{rep}")
                    ok = sum(1 for h in r["hosts"].values() if h.get("ok"))
                    if rep == 0:
                        continue
                    cells = sampler.buckets()
                    runs.append({"tool": tool, "repeat": rep, "wall_s": round(r["wall_s"], 3), "ok": ok,
                                 "busy_pct": sampler.busy_pct(), "buckets_pct": cells})
                    print(f"{tool:18s} #{rep} {r['wall_s']:5.2f} s  {ok}/{a.hosts} ok  busy {sampler.busy_pct():3d} %: "
                          + " ".join(f"{c:3d}" for c in cells), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"hosts": a.hosts, "bucket_s": BUCKET_S, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
