"""One client-capacity step through the workbench's own HTTP path: `OpenAITarget` +
`runner.run`, what `workbench bench` and experiments use, against the mock server.

Place in the flow: `client_capacity.measure` calls `run_ours` per rate (through
`steps.sweep`); `step_from_run` judges the `RunResult`:

    send side   the harness's own `validity.check_validity` (lateness, send rate): "late"
    read side   "slow-read" when the shared read-loop check says so (`validity.read_lag_reason`
                on the lag the runner recorded, judged here at MAX_P95_READ_LAG_S even where
                the runner only recorded it), or when the chunks/s received fell under
                MIN_RATE_FRACTION of those offered (N x output_len over the schedule's span
                plus one request's token delays: a cross-check only this bench can make, as it
                knows every request's length)
    CPU         `StepWatch`: this process (runner loop + the target's I/O thread) and the mock
                over the runner's measured window; the other processes' share as the runner's
                `CpuWatch` (above the threshold: "disturbed")
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from workbench.bench.client_capacity.config import MODEL, ClientCapacityConfig
from workbench.bench.client_capacity.steps import StepResult, process_cpu_s, step_status
from workbench.harness.validity import (
    MAX_P95_READ_LAG_S,
    MIN_RATE_FRACTION,
    CpuShare,
    CpuWatch,
    read_lag_reason,
)


class StepWatch(CpuWatch):
    """The runner's watch, wrapped: over the same window it also reads this process's CPU
    (the client: runner loop + the target's I/O thread) and the mock server's."""

    def __init__(self, inner: CpuWatch, server_pid: int | None) -> None:
        super().__init__()
        self.inner, self.server_pid = inner, server_pid
        self.wall_s = self.client_cpu_s = self.server_cpu_s = 0.0

    @contextmanager
    def measure(self, extra_pids: Sequence[int] = ()) -> Iterator[CpuShare]:
        t0, c0, s0 = time.perf_counter(), time.process_time(), process_cpu_s(self.server_pid)
        try:
            with self.inner.measure(extra_pids) as share:
                yield share
        finally:
            self.wall_s = time.perf_counter() - t0
            self.client_cpu_s = time.process_time() - c0
            self.server_cpu_s = process_cpu_s(self.server_pid) - s0


def workload(config: ClientCapacityConfig, rate: float) -> Any:
    from workbench.harness.workloads import BenchRequest, Workload

    rng = random.Random(f"client-capacity:{config.seed}:{rate}")
    reqs = tuple(BenchRequest(f"cc-{i}", [rng.randrange(10, 4000) for _ in
                                          range(config.input_len)], config.output_len)
                 for i in range(config.num_requests(rate)))
    params = {"rate": rate, "input_len": config.input_len, "output_len": config.output_len}
    return Workload("client-capacity", config.seed, params, reqs)


def run_ours(config: ClientCapacityConfig, base_url: str, server: Any, rate: float,
             watch: CpuWatch) -> StepResult:
    """One step through OpenAITarget + runner.run against the mock at `base_url`."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.http_target import OpenAITarget
    from workbench.harness.replay import run, run_sync

    arrival = ArrivalSpec(mode=config.arrival, rate=rate, seed=config.seed,
                          max_concurrency=config.max_concurrency)
    target = OpenAITarget(base_url, MODEL, poll_interval_s=None, timeout_s=60.0, server=server)
    step_watch = StepWatch(watch, getattr(server, "pid", None))
    try:
        res = run(target, workload(config, rate), arrival, warmup_requests=2,
                  max_duration_s=4 * config.duration_s + 60,
                  max_other_cpu_share=config.max_other_cpu_share, cpu_watch=step_watch,
                  warn_invalid=False)
    finally:
        run_sync(target.stop)
    wall = step_watch.wall_s
    return step_from_run(config, rate, res,
                         step_watch.client_cpu_s / wall if wall > 0 else None,
                         step_watch.server_cpu_s / wall if wall > 0 else None)


def step_from_run(config: ClientCapacityConfig, rate: float, res: Any,
                  client_cpu: float | None, server_cpu: float | None) -> StepResult:
    """Judge one `RunResult` (see the module docstring): the send side without the CPU
    judgement, the read side by the shared read-loop check and the chunks received."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.validity import check_validity

    v, records = res.validity, res.records
    schedule = check_validity(records, ArrivalSpec.from_dict(res.arrival), res.duration_s)
    failed = sum(not r.success for r in records) + res.unsent_requests
    chunks = sum(len(r.chunk_times_s) for r in records)
    received = chunks / res.duration_s if res.duration_s > 0 else 0.0
    span = max((r.target_arrival_s or 0.0 for r in records), default=0.0)
    window = span + config.output_len * config.token_delay_s
    ratio = received / (len(records) * config.output_len / window) if window > 0 else None
    reasons = list(v.reasons)
    lag = v.read_lag()
    lag_reason = None if lag is None else read_lag_reason(lag, MAX_P95_READ_LAG_S)
    if lag_reason is not None and lag_reason not in reasons:
        reasons.append(lag_reason)  # the runner records the lag but judges it only unstated
    kept_chunks = ratio is None or ratio >= MIN_RATE_FRACTION
    if not kept_chunks:
        reasons.append(f"received {received:.0f} chunks/s, {ratio:.0%} of those offered: the "
                       "client fell behind reading the streams")
    return StepResult(
        client="workbench", rate=rate, requests=len(records), achieved_rate=v.achieved_rate,
        scheduled_rate=v.target_rate, chunks_per_s=received, read_ratio=ratio,
        median_lateness_ms=_ms(v.median_lateness_s), p95_lateness_ms=_ms(v.p95_lateness_s),
        client_cpu=client_cpu, server_cpu=server_cpu, others_cpu=v.other_cpu_share,
        failed=failed, reasons=reasons, read_lag_p50_ms=_ms(v.read_lag_p50_s),
        read_lag_p95_ms=_ms(v.read_lag_p95_s),
        status=step_status(v.disturbed, failed or bool(res.error), schedule.valid,
                           kept_chunks and lag_reason is None))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
