"""The load generator: replay one Workload against one Target under one ArrivalSpec.

    run_benchmark(target, workload, arrival, cache_state=...)
      1. target.start(); bring the cache to `cache_state` (unmeasured)
      2. server_before = target.server_snapshot(); t0 = clock.now(); target.t0 = t0
      3. closed loop: C workers, each sends its next request when the previous finishes
         open loop:   request i sent at t0 + offset_i, at most max_concurrency in flight
         follow-ups:  a request with `follows` (a later chat turn) is sent think_s after the
                      request it follows finished, successfully or not (see below)
      4. server_after, the step trace of the measured run, validity -> RunResult
         (step 3 runs inside a `CpuWatch`: a run during which other processes took more than
         `max_other_cpu_share` of the machine's CPUs is invalid, "disturbed"; and, for a
         target with a `read_loop` (HTTP), inside `loop_lag.watch_read_loop`: a run whose
         client fell behind reading is invalid, see `validity.read_lag_reason`)

Cache states: "cold" = target.restart() (fresh engine, no warm-up); "warm-model" = a few
synthetic prompts (shuffled workload tokens: no workload prefix is warmed) then
reset_prefix_cache(); "warm-prefix" = warm-model, then every workload request replayed once
with max_tokens=1, keeping the prefix cache.

Follow-ups (a workload where some request has `follows`): the requests without one (the
first turns) are the arrival process's: a closed loop sends them at once, an open loop at its
offsets (one per first turn, "trace" = their arrival_s). A follow-up is due think_s after its
predecessor finished on the load generator's clock; a failed predecessor releases it too (so a
failed turn never blocks its session; `RunResult.follow_ups` records which predecessor failed).
Due requests go in (due time, workload order), at most `concurrency` (closed) or
`max_concurrency` (open) in flight. Follow-ups carry no target_arrival_s: the validity check
judges the first turns' schedule only. A workload without `follows` runs exactly as before.

Clock: the load generator reads `clock.now()` and waits with `clock.sleep()` (`RunClock`:
perf_counter and asyncio.sleep); tests inject a virtual clock, and a target's `now_s()` reads
the same one.

Nothing is lost: a failing request becomes a failed record with its error and the run goes on;
an exception in the load generator itself returns RunResult(error=...) with every record so far.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from workbench.harness.arrivals import ArrivalSpec, arrival_offsets
from workbench.harness.follow_ups import FollowUpDispatch, follow_ups_of
from workbench.harness.loop_lag import ReadLagBox, watch_read_loop
from workbench.harness.metrics import SLO, RequestRecord, compute_metrics
from workbench.harness.targets import Target
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    CpuShare,
    CpuWatch,
    Validity,
    check_validity,
    default_cpu_watch,
    default_max_read_lag_s,
    local_server_pids,
)
from workbench.harness.workloads import BenchRequest, Workload

T = TypeVar("T")

logger = logging.getLogger(__name__)

CACHE_STATES = ("cold", "warm-model", "warm-prefix")
WARMUP_MAX_TOKENS = 16  # decode steps per warm-up request, at most
PREFIX_REPLAY_CONCURRENCY = 16  # warm-prefix replay in flight, at most


@dataclass(frozen=True)
class RunClock:
    """Where the load generator reads time (`now()`, monotonic seconds) and how it waits
    (`await sleep(s)`): time.perf_counter and asyncio.sleep unless a test injects another."""

    now: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep


@dataclass
class RunResult:
    """One measured run: per-request rows plus everything needed to judge and repeat it."""

    records: list[RequestRecord]
    duration_s: float
    open_loop: bool
    arrival: dict[str, Any]
    cache_state: str
    workload_checksum: str
    workload_name: str
    validity: Validity
    step_trace: list[dict[str, Any]]  # measured steps only; "time_s" is relative to t0
    server_before: dict[str, Any]
    server_after: dict[str, Any]
    target: dict[str, Any]
    error: str | None = None
    unsent_requests: int = 0  # workload requests never sent (max_duration_s or an error)
    server_delta: dict[str, float] = field(default_factory=dict)  # after - before, numeric
    # one row per follow-up scheduled: request_id, follows, follows_success (did the request
    # it follows succeed), due_s (its finish + think_s) and sent_s (None: never sent)
    follow_ups: list[dict[str, Any]] = field(default_factory=list)

    def metrics(
        self, percentiles: Sequence[float] = (50, 90, 95, 99), slo: SLO | None = None
    ) -> dict[str, float]:
        return compute_metrics(self.records, self.duration_s, percentiles=percentiles, slo=slo)


async def run_benchmark(
    target: Target,
    workload: Workload,
    arrival: ArrivalSpec,
    *,
    warmup_requests: int = 2,
    cache_state: str = "warm-model",
    max_duration_s: float | None = None,
    max_other_cpu_share: float | None = DEFAULT_MAX_OTHER_CPU_SHARE,
    cpu_watch: CpuWatch | None = None,
    progress: bool = False,
    clock: RunClock | None = None,
    warn_invalid: bool = True,
) -> RunResult:
    """Measure `workload` on `target`; the target is started if needed and left running.
    `cpu_watch` (default: `default_cpu_watch()`) measures the other processes' CPU share
    over the measured part; above `max_other_cpu_share` (None: record only) it is invalid.
    `progress`: a tqdm bar of finished requests on stderr (a widget in Jupyter), removed
    when the run ends; off by default (the CLI turns it on). `clock`: the load generator's
    time source (default `RunClock()`); requests with `follows` must name an earlier request.
    `warn_invalid`: log and warn when the run is invalid (off for a caller that reports it
    itself, as the experiment runner does)."""
    if cache_state not in CACHE_STATES:
        raise ValueError(f"cache_state ({cache_state!r}) must be one of {list(CACHE_STATES)}")
    if warmup_requests < 0:
        raise ValueError(f"warmup_requests ({warmup_requests}) must be >= 0")
    if max_duration_s is not None and not max_duration_s > 0:
        raise ValueError(f"max_duration_s ({max_duration_s}) must be > 0 seconds or None")
    if max_other_cpu_share is not None and not 0 <= max_other_cpu_share <= 1:
        raise ValueError(f"max_other_cpu_share ({max_other_cpu_share}) must be a share of the "
                         "machine's CPUs in [0, 1], or None to record without judging")
    max_read_lag_s = default_max_read_lag_s()  # a bad WORKBENCH_MAX_READ_LAG_S: before any work
    clock = clock if clock is not None else RunClock()
    driver = _Driver(target, workload, arrival, clock)
    res = RunResult(
        records=driver.records, duration_s=0.0, open_loop=arrival.is_open_loop,
        arrival=arrival.to_dict(), cache_state=cache_state,
        workload_checksum=workload.checksum, workload_name=workload.name, validity=Validity(),
        step_trace=[], server_before={}, server_after={}, target={},
    )
    trace_start = 0
    watch = cpu_watch if cpu_watch is not None else default_cpu_watch()
    share, lag = CpuShare(), ReadLagBox()
    try:
        await target.start()
        await _prepare_cache(target, workload, arrival, cache_state, warmup_requests)
        res.server_before = target.server_snapshot()
        trace_start = len(target.step_trace())
        server_pids = _server_pids(target)
        if server_pids is None:  # a local server we cannot see: its CPU would count as others'
            logger.warning("the server at %s runs on this machine but no visible process "
                           "listens there: the other processes' CPU share is recorded, not "
                           "judged", getattr(target, "base_url", "?"))
            max_other_cpu_share = None
        if progress:
            driver.bar = _request_bar(len(workload.requests), workload.name)
        with watch.measure(server_pids or ()) as share, watch_read_loop(target) as lag:
            await driver.run(max_duration_s)
    except Exception as e:  # noqa: BLE001 - a failed run keeps its rows
        res.error = f"{type(e).__name__}: {e}"
        logger.exception("benchmark run %r failed; returning %d records gathered so far",
                         workload.name, len(driver.records))
    finally:
        await driver.cancel_all()
        if driver.bar is not None:
            driver.bar.close()
    res.duration_s = (clock.now() - driver.t0) if driver.t0 is not None else 0.0
    res.unsent_requests = len(workload.requests) - len(driver.records)
    res.follow_ups = driver.follow_ups
    _warn_failed_predecessors(res.follow_ups)
    _finish(res, target, driver, trace_start, max_duration_s)
    res.validity.judge_cpu(share.others, max_other_cpu_share)
    res.validity.judge_read_lag(lag.lag, max_read_lag_s)  # HTTP targets: read loop
    if warn_invalid:
        _warn_invalid(res)
    return res


def _server_pids(target: Target) -> list[int] | None:
    """Processes of an HTTP target's server on this machine that this process did not start
    (a server it started is its child, counted as its own); see `local_server_pids`."""
    base_url = getattr(target, "base_url", None)
    if base_url is None or getattr(target, "server", None) is not None:
        return []
    return local_server_pids(str(base_url))


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Await `make()` from synchronous code (in Jupyter, on a worker thread's own loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-run") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def run(target: Target, workload: Workload, arrival: ArrivalSpec, **kw: Any) -> RunResult:
    """`run_benchmark` from synchronous code. The caller stops the target afterwards."""
    return run_sync(lambda: run_benchmark(target, workload, arrival, **kw))


# --------------------------------------------------------------------------- measured run
class _Driver:
    """Sends the workload on schedule and owns the records and in-flight tasks."""

    def __init__(self, target: Target, workload: Workload, arrival: ArrivalSpec,
                 clock: RunClock | None = None) -> None:
        self.target, self.workload, self.arrival = target, workload, arrival
        self.clock = clock if clock is not None else RunClock()
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.t0: float | None = None
        self.timed_out = False
        self.bar: Any = None  # a tqdm bar of finished requests (run_benchmark(progress=True))
        self.follow_ups: list[dict[str, Any]] = []  # RunResult.follow_ups
        self.children = follow_ups_of(workload)  # request id -> its follow-ups; {}: none

    async def run(self, max_duration_s: float | None) -> None:
        reqs = list(self.workload.requests)
        firsts = [r for r in reqs if r.follows is None] if self.children else reqs
        offsets = None
        if self.arrival.is_open_loop:
            trace = [r.arrival_s for r in firsts] if self.arrival.mode == "trace" else None
            offsets = arrival_offsets(self.arrival, len(firsts), trace=trace)
        self.t0 = self.clock.now()
        self.target.t0 = self.t0
        if self.children:
            arrival = self.arrival
            dispatch = FollowUpDispatch(
                reqs, self.children, firsts, offsets,
                cap=arrival.max_concurrency if arrival.is_open_loop else arrival.concurrency,
                now_s=self.now_s, sleep=self.clock.sleep, spawn=self._spawn, send=self._one)
            self.follow_ups = dispatch.follow_ups
            coro = dispatch.run()
        else:
            coro = self._closed(reqs) if offsets is None else self._open(reqs, offsets)
        main = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({main}, timeout=max_duration_s)
        if not done:
            self.timed_out = True
            logger.warning("max_duration_s (%s) reached; cancelling in-flight requests",
                           max_duration_s)
            main.cancel()
            await self.cancel_all()
            await asyncio.gather(main, return_exceptions=True)
        else:
            main.result()

    def now_s(self) -> float:
        """Seconds since the run start on the load generator's clock."""
        assert self.t0 is not None
        return self.clock.now() - self.t0

    async def _closed(self, reqs: list[BenchRequest]) -> None:
        it = iter(reqs)

        async def worker() -> None:
            for req in it:
                await self._one(req, None)

        assert self.arrival.concurrency is not None
        workers = [self._spawn(worker()) for _ in range(self.arrival.concurrency)]
        await asyncio.gather(*workers)

    async def _open(self, reqs: list[BenchRequest], offsets: list[float]) -> None:
        assert self.t0 is not None
        cap = self.arrival.max_concurrency
        sem = asyncio.Semaphore(cap) if cap else None
        for req, off in zip(reqs, offsets, strict=True):
            delay = self.t0 + off - self.clock.now()
            if delay > 0:
                await self.clock.sleep(delay)
            if sem is not None:
                await sem.acquire()  # late sends show up as lateness in the validity check
            task = self._spawn(self._one(req, off))
            if sem is not None:
                task.add_done_callback(lambda _t: sem.release())
        await asyncio.gather(*list(self.tasks))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _one(self, req: BenchRequest, target_arrival_s: float | None) -> RequestRecord:
        rec = _new_record(req, target_arrival_s)
        self.records.append(rec)  # before sending: a cancelled request keeps its row
        await _send(self.target, req, rec)
        if self.bar is not None:
            self.bar.update(1)
        return rec

    async def cancel_all(self) -> None:
        pending = [t for t in self.tasks if not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def live_output() -> bool:
    """Can a progress bar redraw in place here: a terminal on stderr, or a Jupyter kernel
    (tqdm.auto draws a widget)? A log file or a pipe gets no bars."""
    import sys

    return sys.stderr.isatty() or "ipykernel" in sys.modules


def _request_bar(total: int, name: str) -> Any:
    """The per-request bar: tqdm.auto (a widget in Jupyter), on stderr, gone when closed;
    None without tqdm. tqdm throttles its redraws, so an update costs ~1 µs."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    import sys

    if not live_output():  # a log file or a pipe: the run lines say enough
        return None
    return tqdm(total=total, desc=f"requests ({name})", unit="req", leave=False,
                file=sys.stderr, dynamic_ncols=True)


def _new_record(req: BenchRequest, target_arrival_s: float | None) -> RequestRecord:
    return RequestRecord(
        request_id=req.request_id, prompt_tokens=len(req.prompt_token_ids or ()),
        output_tokens=0, success=False, target_arrival_s=target_arrival_s,
    )


async def _send(target: Target, req: BenchRequest, rec: RequestRecord) -> None:
    """Stream one request into `rec`; a failure is written into the record, not raised."""
    rec.start_s = target.now_s()
    try:
        await target.generate(req, rec)
    except asyncio.CancelledError:
        rec.success, rec.error = False, "cancelled before completion (max_duration_s or stop)"
        if rec.end_s is None:
            rec.end_s = target.now_s()
        raise
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        rec.success, rec.error = False, f"{type(e).__name__}: {e}"
    if rec.end_s is None:
        rec.end_s = target.now_s()


# --------------------------------------------------------------------------- cache states
async def _prepare_cache(
    target: Target, workload: Workload, arrival: ArrivalSpec, cache_state: str,
    warmup_requests: int,
) -> None:
    target.t0 = time.perf_counter()
    if cache_state == "cold":
        await target.restart()
        return
    warm = _warmup_requests(workload, warmup_requests)
    await _replay(target, warm, len(warm) or 1, "warm-up")
    if not await target.reset_prefix_cache():
        logger.warning("reset_prefix_cache() after the warm-up returned False: the measured "
                       "run may hit blocks cached by the warm-up")
    if cache_state == "warm-prefix":
        replay = [
            replace(r, request_id=f"warm-prefix:{r.request_id}", max_tokens=1)
            for r in workload.requests
        ]
        cap = arrival.concurrency or arrival.max_concurrency or PREFIX_REPLAY_CONCURRENCY
        await _replay(target, replay, min(cap, PREFIX_REPLAY_CONCURRENCY), "warm-prefix replay")


async def _replay(target: Target, reqs: list[BenchRequest], concurrency: int, what: str) -> None:
    """Send `reqs` unmeasured, `concurrency` at a time; failures are logged, not raised."""
    it = iter(reqs)
    failed: list[str] = []

    async def worker() -> None:
        for req in it:
            rec = _new_record(req, None)
            await _send(target, req, rec)
            if not rec.success:
                failed.append(f"{req.request_id}: {rec.error}")

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    if failed:
        logger.warning("%d of %d %s requests failed, e.g. %s", len(failed), len(reqs), what,
                       failed[0])


def _warmup_requests(workload: Workload, k: int) -> list[BenchRequest]:
    """k synthetic prompts: the workload's own token ids (and, separately, its words)
    shuffled, so no prefix of the workload is warmed; prompt lengths as the first k requests,
    at most WARMUP_MAX_TOKENS output tokens."""
    src = list(workload.requests)
    if not src:
        return []
    rng = random.Random(f"warmup:{workload.name}:{workload.seed}")
    out = []
    for i in range(k):
        r = src[i % len(src)]
        ids = list(r.prompt_token_ids or ())
        rng.shuffle(ids)
        words = (r.prompt or "").split()
        rng.shuffle(words)
        out.append(replace(
            r, request_id=f"warm-up:{i}", prompt_token_ids=ids,
            prompt=" ".join(words) if r.prompt is not None else None,
            max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS), arrival_s=None,
        ))
    return out


# --------------------------------------------------------------------------- results
def _finish(
    res: RunResult, target: Target, driver: _Driver, trace_start: int,
    max_duration_s: float | None,
) -> None:
    """Fill the after-run fields best-effort (a failing getter never loses the records)."""
    t0 = driver.t0 or 0.0
    try:
        res.server_after = target.server_snapshot()
        res.step_trace = [
            {**row, "time_s": row["wall_time_s"] - t0} if "wall_time_s" in row else dict(row)
            for row in target.step_trace()[trace_start:]
        ]
    except Exception as e:  # noqa: BLE001
        logger.exception("reading the target after the run failed")
        res.error = res.error or f"{type(e).__name__}: {e}"
    res.server_delta = {
        k: v - res.server_before[k] for k, v in res.server_after.items()
        if isinstance(v, int | float) and isinstance(res.server_before.get(k), int | float)
    }
    try:
        res.target = target.describe()
    except Exception as e:  # noqa: BLE001
        res.target = {"describe_error": f"{type(e).__name__}: {e}"}
    if res.duration_s > 0:
        res.validity = check_validity(res.records, driver.arrival, res.duration_s)
    if driver.timed_out:
        res.validity.invalidate(
            f"max_duration_s ({max_duration_s} s) cut the run: {res.unsent_requests} of "
            f"{res.unsent_requests + len(res.records)} requests were never sent and in-flight "
            "ones were cancelled"
        )
    if res.error is not None:
        res.validity.invalidate(f"the run failed: {res.error}")


def _warn_failed_predecessors(follow_ups: list[dict[str, Any]]) -> None:
    failed = [row for row in follow_ups if not row["follows_success"]]
    if failed:
        logger.warning("%d follow-up requests were released by a failed request (e.g. %s "
                       "after %s): sessions went on; see RunResult.follow_ups", len(failed),
                       failed[0]["request_id"], failed[0]["follows"])


def _warn_invalid(res: RunResult) -> None:
    if not res.validity.valid:
        msg = (f"INVALID benchmark run ({res.workload_name}, {res.cache_state}): "
               + "; ".join(res.validity.reasons))
        logger.error(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
