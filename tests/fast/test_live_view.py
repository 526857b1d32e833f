"""The live view on a terminal: the table is drawn by rich's own refresh from the hosts' rows as
they are then (not rebuilt at every event, issue 34); what it shows at the end is each host's
last phase, its detail and the time from its first phase to `done`."""
import io
import re
import time

from rich.console import Console

from fleetpatch.report import View


def frames(out: str) -> list[str]:
    """The text of each frame the live view drew, escape sequences dropped."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    return [f for f in text.split("fleetpatch rollout") if f.strip()]


def test_live_view_shows_each_host_last_phase_and_time():
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    with View("rollout", ["h1", "h2"], console=console, live=True) as view:
        view.progress("h1", "connect")
        view.progress("h2", "connect")
        view.progress("h1", "verify", " 0.1s waiting for the marker")
        time.sleep(0.3)   # rich redraws 8 times a second: a frame shows the rows of that moment
        assert any("waiting for the marker" in f for f in frames(out.getvalue())), out.getvalue()
        view.progress("h1", "done", "verified")
        view.progress("h2", "done", "failed")
    last = frames(out.getvalue())[-1]
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
            for ln in last.splitlines() if ln.startswith("│") and ln.split("│")[1].strip() in ("h1", "h2")}
    assert rows["h1"][0] == "done" and rows["h1"][2] == "verified", last
    assert rows["h2"][0] == "done" and rows["h2"][2] == "failed", last
    took = float(rows["h1"][1].rstrip("s"))
    assert 0.2 <= took < 5, last   # connect -> done: the sleep inside it counts, the exit does not
    assert "2/2" in last, last     # the progress bar counted both hosts done


def test_a_fleet_taller_than_the_terminal_shows_what_fits_failures_and_hosts_at_work_first():
    """300 hosts on a 30-line terminal: each frame fits the terminal (drawn whole, a frame cost
    the laptop 74 ms, 8 times a second), every failed host and host at work is in it, and the
    hosts left out are counted."""
    out = io.StringIO()
    console = Console(file=out, width=120, height=30, force_terminal=True, color_system=None)
    hosts = [f"gpu-{i:03d}" for i in range(300)]
    with View("rollout", hosts, console=console, live=True) as view:
        for i in range(0, 60):
            view.progress(hosts[i], "done", "not-executed" if i == 7 else "verified")
        view.progress(hosts[250], "done", "unreachable")
        for i in range(60, 75):
            view.progress(hosts[i], "verify", " 0.4s waiting for the server's ready line")
        time.sleep(0.3)
        frame = frames(out.getvalue())[-1]
    drawn = [ln.split("│")[1].strip() for ln in frame.splitlines() if ln.startswith("│")]
    assert len(frame.strip("\n").splitlines()) <= 30, frame
    assert {"gpu-007", "gpu-250"} <= set(drawn), frame
    assert set(hosts[60:75]) <= set(drawn), frame
    assert drawn == sorted(drawn)   # in the table's order
    assert f"and {300 - len(drawn)} more hosts: " in frame, frame


def test_on_a_narrow_terminal_the_hosts_shown_as_blocks_still_fit_and_the_rest_are_counted():
    out = io.StringIO()
    console = Console(file=out, width=60, height=24, force_terminal=True, color_system=None)
    hosts = [f"gpu-{i:03d}" for i in range(40)]
    with View("rollout", hosts, console=console, live=True) as view:
        for h in hosts:
            view.stage(h, "batch 1 of 1")
        for h in hosts[:10]:
            view.progress(h, "verify", " 0.4s waiting for the probe's records of the server")
        time.sleep(0.3)
        frame = frames(out.getvalue())[-1]
    assert "host: " not in frame and "│" not in frame, frame   # one block per host, not the table
    assert len(frame.strip("\n").splitlines()) <= 24, frame
    shown = [h for h in hosts if h in frame]
    assert shown and set(shown) <= set(hosts[:10]), frame
    assert f"and {40 - len(shown)} more hosts: " in frame, frame
