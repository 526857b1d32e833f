"""How fast a core of this machine is while a run goes on, for a comparison at one speed.

On a shared VM the same work does not take the same CPU time from one minute to the next: a
fixed loop took 12 to 21 ms of CPU from one second to the next on an idle 2-core machine
(2026-12-07), and the same stand-in start cost 130 ms of CPU in one 32-host run and 240 ms in
another, the same in every server of a run. A tool's wall time then says as much about its
run's moment as about the tool. A thread of the bench measures a small fixed loop every
PERIOD_S for as long as the run lasts, on its own CPU clock (so waiting for a core does not
count, only how fast the core is once it runs): the median of those samples is the run's
gauge. The tool under test and the gauge share the cores, so the gauge's own cost (about 1 ms
every 0.1 s) is the same for every tool."""
from __future__ import annotations

import statistics
import threading
import time

PERIOD_S = 0.1
LOOP = 20_000


def sample_ms() -> float:
    t = time.thread_time()
    x = 0
    for i in range(LOOP):
        x += i * i % 7
    return (time.thread_time() - t) * 1000


class SpeedGauge:
    """with SpeedGauge() as g: run(); g.median_ms() -> CPU ms of the loop while it ran."""

    def __init__(self, period_s: float = PERIOD_S):
        self.period_s = period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._measure, name="speed-gauge", daemon=True)

    def _measure(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(sample_ms())

    def __enter__(self) -> "SpeedGauge":
        self.samples.append(sample_ms())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def median_ms(self) -> float | None:
        return round(statistics.median(self.samples), 3) if self.samples else None


def at_reference(wall_s: float, gauge_ms: float | None, reference_ms: float | None) -> float | None:
    """The wall time this run would have taken with the machine at `reference_ms` (CPU-bound
    work scales with the core's speed; the waits that do not, such as a stand-in's 0.5 s
    shutdown poll, scale too here, so this overstates the correction a little)."""
    if not gauge_ms or not reference_ms:
        return None
    return wall_s * reference_ms / gauge_ms
