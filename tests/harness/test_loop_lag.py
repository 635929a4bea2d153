"""The client's read-loop lag and its validity check: a fake loop and fake clocks drive the
monitor (no wall clock anywhere), injected lags drive the judgement and the runner's hook."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.harness.fakes import QuietTarget
from workbench.harness import replay as runner
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.loop_lag import (
    LoopLagMonitor,
    ReadLag,
    ReadLagBox,
    percentile,
    summarize,
    watch_read_loop,
)
from workbench.harness.metrics import RequestRecord
from workbench.harness.validity import (
    MAX_P95_READ_LAG_S,
    MAX_READ_LAG_ENV,
    FixedCpuWatch,
    Validity,
    default_max_read_lag_s,
    lateness_table,
    read_lag_reason,
)
from workbench.harness.workloads import BenchRequest, Workload


class FakeHandle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """`time`, `call_at`, `call_soon_threadsafe`, `is_closed`; time moves by `advance_to`."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.timers: list[FakeHandle] = []
        self.soon: list[Callable[[], None]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle(when, callback)
        self.timers.append(handle)
        return handle

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def is_closed(self) -> bool:
        return False

    def run_soon(self) -> None:
        while self.soon:
            self.soon.pop(0)()

    def advance_to(self, t: float) -> None:
        """The loop wakes at `t` and runs every timer due by then."""
        self.now = t
        due = [h for h in self.timers if h.when <= t]
        self.timers = [h for h in self.timers if h.when > t]
        for h in due:
            if not h.cancelled:
                h.callback()


def _clock(*values: float) -> Callable[[], float]:
    it = iter(values)
    return lambda: next(it)


def test_monitor_measures_how_late_the_timer_wakes() -> None:
    loop = FakeLoop(100.0)
    mon = LoopLagMonitor(loop, interval_s=0.25, cpu_clock=_clock(1.0, 1.5),
                         wall_clock=_clock(10.0, 12.0))
    mon.start()
    assert loop.timers == [] and len(loop.soon) == 1  # armed on the loop's own thread
    loop.run_soon()
    assert [h.when for h in loop.timers] == [100.25]
    loop.advance_to(100.25)  # on time: due 100.25
    loop.advance_to(101.0)  # due 100.5: 0.5 s late, and the tick due at 100.75 0.25 s
    loop.advance_to(101.375)  # due 101.25: 0.125 s late
    assert mon.lags == [0.0, 0.5, 0.25, 0.125]
    lag = mon.stop()
    assert (lag.samples, lag.p50_s, lag.max_s, lag.cpu_share) == (4, 0.1875, 0.5, 0.25)
    assert lag.p95_s == pytest.approx(0.25 + 0.85 * 0.25, abs=1e-12)
    loop.run_soon()  # stop() cancels the pending timer on the loop
    loop.advance_to(200.0)
    assert mon.lags == [0.0, 0.5, 0.25, 0.125] and loop.timers == []
    with pytest.raises(ValueError, match=r"interval_s \(0\) must be > 0 seconds"):
        LoopLagMonitor(loop, interval_s=0)


def test_summary_percentiles_and_empty_windows() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 75) == 4.0
    assert percentile([7.0], 95) == 7.0
    lag = summarize([0.004, -0.001, 0.002], cpu_s=0.3, wall_s=0.6, interval_s=0.01)
    assert lag == ReadLag(3, 0.002, lag.p95_s, 0.004, 0.5, 0.01)  # early wake-ups count as 0
    assert lag.p95_s == pytest.approx(0.0038, abs=1e-12)
    assert summarize([], cpu_s=0.0, wall_s=0.0) == ReadLag(0, None, None, None, None)


def test_watch_read_loop_only_watches_a_target_with_a_read_loop() -> None:
    with watch_read_loop(object()) as box:
        pass
    assert box.lag is None

    class Reader:
        read_loop = FakeLoop(5.0)

    with watch_read_loop(Reader(), interval_s=0.5) as box:
        Reader.read_loop.run_soon()
        for t in (5.5, 6.25, 6.75):  # due 5.5, 6.0, 6.75
            Reader.read_loop.advance_to(t)
    assert box.lag is not None and (box.lag.samples, box.lag.max_s) == (3, 0.25)
    assert box.lag.p50_s == 0.0


READ_LAG = ReadLag(samples=400, p50_s=0.0015, p95_s=0.0325, max_s=0.125, cpu_share=0.97)
REASON = ("the client's read loop woke 32.5 ms late at p95 (median 1.5 ms, max 125.0 ms; the "
          "client process used 97% of a core), above 20.0 ms: it fell behind reading the "
          "streams, so TTFT and ITL include its own delay (lower the rate or give the client a "
          "core of its own)")


def test_judge_read_lag() -> None:
    assert MAX_P95_READ_LAG_S == 0.02
    v = Validity()
    v.judge_read_lag(READ_LAG, MAX_P95_READ_LAG_S)
    assert not v.valid and v.reasons == [REASON]
    assert (v.read_lag_samples, v.read_lag_p50_s, v.read_lag_p95_s, v.read_lag_max_s,
            v.client_cpu_share, v.max_read_lag_s) == (400, 0.0015, 0.0325, 0.125, 0.97, 0.02)
    assert v.read_lag() == READ_LAG
    v = Validity()
    v.judge_read_lag(READ_LAG, 0.0325)  # at the threshold: kept up
    assert v.valid and v.reasons == []
    v = Validity()
    v.judge_read_lag(READ_LAG, None)  # recorded, not judged
    assert v.valid and v.read_lag_p95_s == 0.0325 and v.max_read_lag_s is None
    few = ReadLag(9, 0.5, 0.5, 0.5, 1.0)  # under MIN_LAG_SAMPLES: not judged
    assert read_lag_reason(few, 0.02) is None
    v = Validity()
    v.judge_read_lag(None, 0.02)  # not watched: nothing recorded
    assert v == Validity() and v.read_lag() is None
    with pytest.raises(ValueError, match=r"max_read_lag_s \(0.0\) must be > 0 seconds or None"):
        Validity().judge_read_lag(READ_LAG, 0.0)
    assert read_lag_reason(ReadLag(400, 0.001, 0.03, 0.05, None), 0.02) == (
        "the client's read loop woke 30.0 ms late at p95 (median 1.0 ms, max 50.0 ms), above "
        "20.0 ms: it fell behind reading the streams, so TTFT and ITL include its own delay "
        "(lower the rate or give the client a core of its own)")


def test_lateness_table_shows_the_read_lag() -> None:
    v = Validity(target_rate=10.0, achieved_rate=9.5, median_lateness_s=0.0012,
                 p95_lateness_s=0.0105)
    v.judge_read_lag(ReadLag(100, 0.0005, 0.0025, 0.011, 0.42), 0.02)
    assert lateness_table(v) == "\n".join([
        "| Client schedule (open loop) | |", "|---|---:|",
        "| Median lateness, send - scheduled (ms) | 1.20 |", "| P95 lateness (ms) | 10.50 |",
        "| Send rate achieved / scheduled (req/s) | 9.50 / 10.00 |",
        "| Invalid above a median lateness of (ms) | 50.0 |",
        "| Read-loop lag p50 / p95 / max (ms) | 0.50 / 2.50 / 11.00 |",
        "| Client process CPU (share of one core) | 42% |",
        "| Invalid above a p95 read-loop lag of (ms) | 20.0 |"])
    closed = Validity()
    closed.judge_read_lag(ReadLag(100, 0.0005, 0.0025, 0.011, None), None)
    assert lateness_table(closed) == "\n".join([
        "| Client | |", "|---|---:|",
        "| Read-loop lag p50 / p95 / max (ms) | 0.50 / 2.50 / 11.00 |"])


def test_default_threshold_comes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert os.environ[MAX_READ_LAG_ENV] == "off"  # the suite's setting (tests/conftest.py)
    assert default_max_read_lag_s() is None
    monkeypatch.delenv(MAX_READ_LAG_ENV)
    assert default_max_read_lag_s() == MAX_P95_READ_LAG_S
    monkeypatch.setenv(MAX_READ_LAG_ENV, "0.05")
    assert default_max_read_lag_s() == 0.05
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv(MAX_READ_LAG_ENV, bad)
        with pytest.raises(ValueError, match=rf"WORKBENCH_MAX_READ_LAG_S \('{bad}'\) must be "
                                             "a number of seconds > 0 or off"):
            default_max_read_lag_s()


class InstantTarget(QuietTarget):
    """Answers every request with two chunks at once (no I/O, no clock dependence)."""

    async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
        now = self.now_s()
        record.first_token_s, record.chunk_times_s, record.chunk_tokens = now, [now, now], [1, 1]
        record.output_tokens, record.success, record.end_s = 2, True, now


def test_the_runner_judges_the_read_lag_it_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextmanager
    def fake_watch(target: Any) -> Iterator[ReadLagBox]:
        yield ReadLagBox(READ_LAG)

    monkeypatch.setattr(runner, "watch_read_loop", fake_watch)
    work = Workload("lag", 0, {}, tuple(BenchRequest(f"r{i}", [1, 2], 2) for i in range(3)))
    closed = ArrivalSpec(mode="closed", concurrency=1)
    monkeypatch.delenv(MAX_READ_LAG_ENV)
    res = runner.run(InstantTarget(), work, closed, warmup_requests=0,
                     cpu_watch=FixedCpuWatch(0.0), warn_invalid=False)
    assert res.error is None and all(r.success for r in res.records)
    assert not res.validity.valid and res.validity.reasons == [REASON]
    assert res.validity.read_lag_p95_s == 0.0325 and res.validity.max_read_lag_s == 0.02
    monkeypatch.setenv(MAX_READ_LAG_ENV, "off")  # the suite's setting: recorded only
    res = runner.run(InstantTarget(), work, closed, warmup_requests=0,
                     cpu_watch=FixedCpuWatch(0.0), warn_invalid=False)
    assert res.validity.valid and res.validity.read_lag_p95_s == 0.0325
    assert res.validity.max_read_lag_s is None


def test_a_bad_threshold_is_refused_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []

    class Recording(InstantTarget):
        async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
            sent.append(req.request_id)
            await super().generate(req, record)

    work = Workload("lag", 0, {}, (BenchRequest("r0", [1, 2], 2),))
    monkeypatch.setenv(MAX_READ_LAG_ENV, "soon")
    with pytest.raises(ValueError, match=r"WORKBENCH_MAX_READ_LAG_S \('soon'\) must be"):
        runner.run(Recording(), work, ArrivalSpec(mode="closed", concurrency=1),
                   warmup_requests=0, cpu_watch=FixedCpuWatch(0.0), warn_invalid=False)
    assert sent == []


def test_a_stall_weighs_by_how_long_it_lasted() -> None:
    loop = FakeLoop(0.0)
    mon = LoopLagMonitor(loop, interval_s=0.25, cpu_clock=_clock(0.0, 1.0),
                         wall_clock=_clock(0.0, 2.0))
    mon.start()
    loop.run_soon()
    loop.advance_to(1.25)  # due 0.25: a 1 s stall, and the ticks due 0.5, 0.75, 1.0 after it
    assert mon.lags == [1.0, 0.75, 0.5, 0.25]
    assert mon.stop().samples == 4
