"""Read lag: does the load generator read its streams as fast as they arrive?

Place in the flow: the runner wraps a measured run in `watch_read_loop(target)`; for a target
that reads on an event loop of its own (`OpenAITarget.read_loop`) a `LoopLagMonitor` runs a
timer on that loop meanwhile, and `validity.Validity.judge_read_lag` judges the `ReadLag` it
returns. Targets without a `read_loop` (the in-process engine) are not watched.

Why: lateness (send - scheduled) sees a late *sender* only. A client whose reading falls
behind (its core saturated by parsing) still sends on time, and every chunk it reads late
adds that delay to TTFT and ITL. The bytes' arrival on the socket is not visible from Python,
but the delay the client adds is the time its loop takes to come back to a ready socket, and
a timer measures exactly that: due every `interval_s`, woken `lag` seconds late
(`loop.time()` at the wake-up - the time it was due). An idle loop wakes within ~1 ms (the
selector waits in whole milliseconds); a saturated one as late as one pass over every ready
stream. A wake-up `lag` late by more than one period also stands for the ticks that could
not fire meanwhile (lag - interval, lag - 2 x interval, ... while > 0), so a long stall (a
full garbage collection, a preempted core) weighs in the percentiles by how long it lasted:
the samples are the delay a chunk arriving at a random instant of the run would have met.

    with watch_read_loop(target) as box:
        ... the measured run ...
    box.lag  # ReadLag: p50 / p95 / max of the samples, this process's CPU share; or None

`LoopLagMonitor` takes the loop (anything with `time`, `call_at`, `call_soon_threadsafe`),
the CPU and wall clocks as arguments: tests drive a fake loop and fake clocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

LAG_INTERVAL_S = 0.01  # the timer's period: 100 samples per second of run
MIN_LAG_SAMPLES = 10  # fewer samples (a run under ~0.1 s) are recorded, not judged


@dataclass(frozen=True)
class ReadLag:
    """The read loop over one measured run: timer lag percentiles (seconds; None without
    samples) and this process's CPU-seconds per wall second (1.0 = one core kept busy)."""

    samples: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    cpu_share: float | None  # None: the window had no wall time
    interval_s: float = LAG_INTERVAL_S


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, linear between the nearest ranks (as
    numpy's default)."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(lags_s: Sequence[float], cpu_s: float, wall_s: float,
              interval_s: float = LAG_INTERVAL_S) -> ReadLag:
    """`ReadLag` of raw samples (negative ones, a timer fired early, count as 0)."""
    values = sorted(max(0.0, v) for v in lags_s)
    cpu = cpu_s / wall_s if wall_s > 0 else None
    if not values:
        return ReadLag(0, None, None, None, cpu, interval_s)
    return ReadLag(len(values), percentile(values, 50), percentile(values, 95), values[-1],
                   cpu, interval_s)


class LoopLagMonitor:
    """A timer on `loop` every `interval_s`; `start()` and `stop()` from any thread."""

    def __init__(self, loop: Any, interval_s: float = LAG_INTERVAL_S,
                 cpu_clock: Callable[[], float] = time.process_time,
                 wall_clock: Callable[[], float] = time.perf_counter) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s ({interval_s}) must be > 0 seconds")
        self.loop, self.interval_s = loop, interval_s
        self.cpu_clock, self.wall_clock = cpu_clock, wall_clock
        self.lags: list[float] = []  # seconds late, one per wake-up
        self._running = False
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._cpu0 = self._wall0 = 0.0

    def start(self) -> None:
        self.lags = []
        self._cpu0, self._wall0 = self.cpu_clock(), self.wall_clock()
        self._running = True
        self.loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        if self._running:
            self._due = self.loop.time() + self.interval_s
            self._handle = self.loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        if not self._running:
            return
        now = self.loop.time()
        lag = now - self._due
        self.lags.append(lag)
        # a stall of several periods also delayed the ticks that could not fire meanwhile:
        # count them (due one period apart), so the samples weigh lags by the time they
        # lasted, as the chunks that arrived during a stall do
        while (lag := lag - self.interval_s) > 0:
            self.lags.append(lag)
        self._due = now + self.interval_s
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> ReadLag:
        """Stop the timer; the samples so far and the CPU share since `start()`."""
        self._running = False
        cpu, wall = self.cpu_clock() - self._cpu0, self.wall_clock() - self._wall0
        handle = self._handle
        if handle is not None:
            try:
                self.loop.call_soon_threadsafe(handle.cancel)
            except RuntimeError:  # the loop is closed already: nothing left to cancel
                pass
        return summarize(list(self.lags), cpu, wall, self.interval_s)


@dataclass
class ReadLagBox:
    """Filled when `watch_read_loop` ends: `lag` is None when the target was not watched."""

    lag: ReadLag | None = None


@contextmanager
def watch_read_loop(target: Any, interval_s: float = LAG_INTERVAL_S) -> Iterator[ReadLagBox]:
    """Watch the loop `target` reads on (its `read_loop` attribute) while the block runs."""
    box = ReadLagBox()
    loop = getattr(target, "read_loop", None)
    if loop is None or loop.is_closed():
        yield box
        return
    monitor = LoopLagMonitor(loop, interval_s)
    monitor.start()
    try:
        yield box
    finally:
        box.lag = monitor.stop()
