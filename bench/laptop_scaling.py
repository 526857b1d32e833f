"""The laptop's CPU for work that grows with the fleet, at fleet sizes the test fleet cannot reach:
opening the hosts' SSH clients against a known_hosts file of as many hosts (plain or hashed
names), and one redraw of the live view's table on a terminal of 50 lines. No host is contacted.

    python3 bench/laptop_scaling.py [--sizes 32,300,1000] [--reps 3] [SRC ...]

SRC: a checkout's `src` (default: this checkout's); several are measured one after the other, each
in fresh processes, e.g. `git archive OLD src | tar -x -C /tmp/old` then `/tmp/old/src src`.
Prints, per SRC and size, the median CPU (time.process_time) of each part over --reps processes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SRC = os.path.join(os.path.dirname(HERE), "src")

# Run in a fresh process per measurement: argv = src, part, size, hashed.
PROBE = r'''
import io, os, sys, tempfile, time
src, part, n, hashed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
sys.path.insert(0, src)
if part == "clients":
    import paramiko, yaml
    from paramiko.hostkeys import HostKeys
    from fleetpatch.inventory import parse_inventory
    from fleetpatch import remote
    key = paramiko.ECDSAKey.generate()
    folder = tempfile.mkdtemp()
    known = os.path.join(folder, "known_hosts")
    addr = lambda i: "10.%d.%d.%d" % (i // 62500, i // 250 % 250, i % 250 + 1)
    with open(known, "w") as f:
        for i in range(n):
            name = "[%s]:2222" % addr(i)
            f.write("%s %s %s\n" % (HostKeys.hash_host(name) if hashed else name, key.get_name(), key.get_base64()))
    inv = parse_inventory(yaml.safe_dump({
        "defaults": {"user": "root", "known_hosts": known, "port": 2222, "engine": {"python": "/usr/bin/python3"},
                     "server": {"log": "/tmp/x.log",
                                "restart": {"kind": "command", "start": "{python} -m x", "pidfile": "/tmp/x.pid"}}},
        "hosts": {"h%d" % i: {"address": addr(i)} for i in range(n)}}))
    hosts = list(inv.hosts.values())
    try:   # a checkout with one known_hosts read per run: the run's reader, as the Job holds it
        from fleetpatch.knownhosts import KnownHosts
        extra = (KnownHosts(),)
    except ImportError:
        extra = ()
    remote.connection_for(hosts[0], inv.hosts, False, *[type(e)() for e in extra])   # imports
    t = time.process_time()
    for h in hosts:   # what SSHTransport.open does for each host before it dials
        remote.connection_for(h, inv.hosts, False, *extra)
    print(time.process_time() - t)
else:
    from rich.console import Console
    from rich.live import Live
    from fleetpatch import report
    console = Console(file=io.StringIO(), width=120, height=50, force_terminal=True)
    view = report.View("rollout", ["gpu-%04d" % i for i in range(n)], console=console, live=True)
    for i, row in enumerate(view.rows.values()):
        phase = ("verify", "queued", "done")[i % 3]
        row.update(phase=phase, since=time.monotonic(), stage="batch 1 of 1",
                   detail="verified" if phase == "done" else " 1.2s waiting for the server's ready line")
    live = Live(report._LiveTable(view), console=console, auto_refresh=False)
    live.start()
    live.refresh()
    t = time.process_time()
    for _ in range(5):
        live.refresh()
    took = (time.process_time() - t) / 5
    live.stop()   # before the print: Live takes stdout over while it runs
    print(took)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description="The laptop's CPU for work that grows with the fleet (SSH clients "
                                             "against a known_hosts of as many hosts, a live-view redraw), "
                                             "at fleet sizes the test fleet cannot reach; no host is contacted.")
    ap.add_argument("--sizes", default="32,300,1000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("src", nargs="*", default=[DEFAULT_SRC])
    a = ap.parse_args()
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: expected whole numbers separated by commas, got {a.sizes!r}")
    if a.reps < 1 or any(n < 1 for n in sizes):
        ap.error("--reps and every size must be 1 or more")
    for src in a.src:
        if not os.path.isfile(os.path.join(src, "fleetpatch", "__init__.py")):
            ap.error(f"{src}: not a checkout's src folder (no fleetpatch/__init__.py in it)")
    for src in a.src:
        for n in sizes:
            for part, hashed in (("clients", "0"), ("clients", "1"), ("live", "0")):
                runs = []
                for _ in range(a.reps):
                    out = subprocess.run([sys.executable, "-c", PROBE, src, part, str(n), hashed],
                                         capture_output=True, text=True)
                    if out.returncode != 0:
                        raise SystemExit(f"{src} {part} {n}: {out.stderr.strip().splitlines()[-1:]}")
                    runs.append(float(out.stdout))
                what = {"clients": f"{n} hosts' SSH clients, known_hosts of {n} " + ("hashed names" if hashed == "1"
                                                                                       else "names"),
                        "live": f"one live-view redraw, {n} hosts, 50-line terminal"}[part]
                print(f"{src:<28} {what:<62} median {statistics.median(runs) * 1000:8.1f} ms", flush=True)


if __name__ == "__main__":
    main()
