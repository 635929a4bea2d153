"""The runner's follow-ups: a request with `follows` is sent think_s after the request it
follows finished (failed or not), under the runner's clock.

Most tests run on a virtual clock: `VirtualClock.sleep` parks the caller until the clock is
advanced, and `run_virtual` advances it to the next sleeper only once every task is waiting,
so send times are exact numbers, independent of the machine. Two tests run the real thing:
multi_turn_chat on the in-process engine (prefix hits across turns) and over HTTP.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.harness.fakes import QuietTarget
from workbench.harness.arrivals import ArrivalSpec, arrival_offsets
from workbench.harness.metrics import RequestRecord
from workbench.harness.replay import RunClock, RunResult, run, run_benchmark
from workbench.harness.targets import InProcessTarget
from workbench.harness.validity import FixedCpuWatch
from workbench.harness.workloads import BenchRequest, Workload, make_workload


class VirtualClock:
    """Seconds that pass only when `advance()` says so (starts at 100, not 0, so a missing
    `- t0` shows)."""

    def __init__(self) -> None:
        self.t = 100.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def now(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + max(0.0, s), self._seq, fut))
        self._seq += 1
        await fut

    def advance(self) -> bool:
        """Wake the earliest live sleeper at its time; False when none is left."""
        while self._sleepers:
            t, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                self.t = max(self.t, t)
                fut.set_result(None)
                return True
        return False


def run_virtual(clock: VirtualClock, make: Callable[[], Awaitable[RunResult]]) -> RunResult:
    async def go() -> RunResult:
        main = asyncio.ensure_future(make())
        for _ in range(10_000):  # a livelock fails instead of hanging
            if main.done():
                break
            for _ in range(100):  # let every task run until it waits on the clock
                await asyncio.sleep(0)
                if main.done():
                    break
            if not main.done() and not clock.advance():
                main.cancel()
                raise AssertionError("deadlock: the run waits but nothing sleeps")
        if not main.done():
            main.cancel()
            raise AssertionError("livelock: 10,000 clock advances and the run goes on")
        return main.result()

    return asyncio.run(go())


class FakeTarget(QuietTarget):
    """Each request takes `service_s` (per id, default 1 s) of virtual time; ids in `fail`
    raise after it."""

    def __init__(self, clock: VirtualClock, service_s: dict[str, float] | None = None,
                 fail: tuple[str, ...] = ()) -> None:
        self.clock, self.service_s, self.fail = clock, service_s or {}, set(fail)

    def now_s(self) -> float:
        return self.clock.now() - self.t0

    async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
        await self.clock.sleep(self.service_s.get(req.request_id, 1.0))
        if req.request_id in self.fail:
            raise RuntimeError("engine exploded")
        now = self.now_s()
        record.first_token_s, record.end_s = now, now
        record.chunk_times_s, record.chunk_tokens = [now], [req.max_tokens]
        record.output_tokens, record.success = req.max_tokens, True



def _chat() -> Workload:
    """Session a: a0, a1 (0.5 s after a0), a2 (2 s after a1); session b: b0, b1 (0.25 s)."""
    def req(rid: str, follows: str | None = None, think: float = 0.0,
            arrival: float | None = None) -> BenchRequest:
        return BenchRequest(rid, [1, 2, 3], 4, arrival_s=arrival, group=rid[0],
                            follows=follows, think_s=think, turn=int(rid[1]))

    return Workload("chat", 0, {}, (req("a0", arrival=0.0), req("a1", "a0", 0.5),
                                    req("a2", "a1", 2.0), req("b0", arrival=3.0),
                                    req("b1", "b0", 0.25)))


def _run(target: FakeTarget, clock: VirtualClock, wl: Workload, arrival: ArrivalSpec
         ) -> RunResult:
    return run_virtual(clock, lambda: run_benchmark(
        target, wl, arrival, warmup_requests=0, cpu_watch=FixedCpuWatch(0.0),
        clock=RunClock(now=clock.now, sleep=clock.sleep)))


def _starts(res: RunResult) -> dict[str, float]:
    return {r.request_id: r.start_s for r in res.records}


def test_closed_loop_sends_each_turn_think_s_after_the_last() -> None:
    clock = VirtualClock()
    res = _run(FakeTarget(clock), clock, _chat(), ArrivalSpec("closed", concurrency=2))
    assert res.error is None and res.validity.valid and res.unsent_requests == 0
    # a0, b0 at 0 (closed: first turns at once); both end at 1; b1 due 1.25, a1 due 1.5;
    # a1 ends 2.5 -> a2 due 4.5, ends 5.5
    assert _starts(res) == {"a0": 0.0, "b0": 0.0, "b1": 1.25, "a1": 1.5, "a2": 4.5}
    assert [r.request_id for r in res.records] == ["a0", "b0", "b1", "a1", "a2"]
    assert res.duration_s == 5.5 and all(r.success for r in res.records)
    assert res.follow_ups == [
        {"request_id": "a1", "follows": "a0", "follows_success": True, "due_s": 1.5,
         "sent_s": 1.5},
        {"request_id": "b1", "follows": "b0", "follows_success": True, "due_s": 1.25,
         "sent_s": 1.25},
        {"request_id": "a2", "follows": "a1", "follows_success": True, "due_s": 4.5,
         "sent_s": 4.5},
    ]
    assert all(r.target_arrival_s is None for r in res.records)


def test_concurrency_caps_sends_in_due_order() -> None:
    """One slot: a0 (workload order breaks the tie at 0), then b0 at 1 (due since 0), a1 at 2
    (due 1.5), b1 at 3 (due 2.25), a2 at 5 (3 + 2)."""
    clock = VirtualClock()
    res = _run(FakeTarget(clock), clock, _chat(), ArrivalSpec("closed", concurrency=1))
    assert _starts(res) == {"a0": 0.0, "b0": 1.0, "a1": 2.0, "b1": 3.0, "a2": 5.0}
    rows = {row["request_id"]: (row["due_s"], row["sent_s"]) for row in res.follow_ups}
    assert rows == {"a1": (1.5, 2.0), "b1": (2.25, 3.0), "a2": (5.0, 5.0)}
    assert res.duration_s == 6.0


def test_a_failed_turn_releases_its_session(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    target = FakeTarget(clock, service_s={"a0": 2.0}, fail=("a0",))
    with caplog.at_level(logging.WARNING, logger="workbench.harness.replay"):
        res = _run(target, clock, _chat(), ArrivalSpec("closed", concurrency=4))
    by_id = {r.request_id: r for r in res.records}
    assert not by_id["a0"].success and "engine exploded" in by_id["a0"].error  # type: ignore
    assert by_id["a0"].end_s == 2.0
    assert _starts(res) == {"a0": 0.0, "b0": 0.0, "b1": 1.25, "a1": 2.5, "a2": 5.5}
    assert res.follow_ups[1] == {"request_id": "a1", "follows": "a0", "follows_success": False,
                                 "due_s": 2.5, "sent_s": 2.5}
    assert res.error is None and by_id["a1"].success and by_id["a2"].success
    assert "1 follow-up requests were released by a failed request (e.g. a1 after a0)" in (
        caplog.text)


def test_trace_starts_sessions_at_arrival_s_and_judges_only_first_turns() -> None:
    clock = VirtualClock()
    res = _run(FakeTarget(clock), clock, _chat(), ArrivalSpec("trace"))
    assert _starts(res) == {"a0": 0.0, "a1": 1.5, "a2": 4.5, "b0": 3.0, "b1": 4.25}
    targets = {r.request_id: r.target_arrival_s for r in res.records}
    assert targets == {"a0": 0.0, "b0": 3.0, "a1": None, "a2": None, "b1": None}
    assert res.validity.valid and res.validity.median_lateness_s == 0.0
    assert res.validity.target_rate == pytest.approx(1 / 3)


def test_open_loop_offsets_are_drawn_for_first_turns_only() -> None:
    wl = Workload("chat", 0, {}, tuple(
        r for u in range(4) for r in (
            BenchRequest(f"u{u}t0", [1], 2),
            BenchRequest(f"u{u}t1", [1, 5], 2, follows=f"u{u}t0", think_s=0.125))))
    spec = ArrivalSpec("poisson", rate=2.0, seed=5, max_concurrency=8)
    offsets = arrival_offsets(spec, 4)
    assert offsets is not None
    clock = VirtualClock()
    res = _run(FakeTarget(clock), clock, wl, spec)
    starts = _starts(res)
    # (the virtual clock counts from 100 s: not dyadic offsets round in the last bits)
    assert [starts[f"u{u}t0"] for u in range(4)] == pytest.approx(offsets, abs=1e-12)
    assert [starts[f"u{u}t1"] for u in range(4)] == pytest.approx(
        [o + 1.125 for o in offsets], abs=1e-12)


def test_without_follows_the_schedule_is_unchanged() -> None:
    """No request follows another: the old open and closed loops, on the injected clock."""
    wl = Workload("flat", 0, {}, tuple(BenchRequest(f"r{i}", [1], 2) for i in range(5)))
    clock = VirtualClock()
    res = _run(FakeTarget(clock), clock, wl, ArrivalSpec("constant", rate=4.0))
    assert [r.start_s for r in res.records] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert res.follow_ups == [] and res.duration_s == 2.0
    clock = VirtualClock()
    res = _run(FakeTarget(clock), clock, wl, ArrivalSpec("closed", concurrency=2))
    assert [r.start_s for r in res.records] == [0.0, 0.0, 1.0, 1.0, 2.0]


@pytest.mark.parametrize(("reqs", "msg"), [
    ((BenchRequest("a", [1], 2, follows="b"), BenchRequest("b", [1], 2)),
     "workload 'bad': request 'a' follows 'b', which is not an earlier request"),
    ((BenchRequest("a", [1], 2), BenchRequest("a", [1], 2, follows="x")),
     "workload 'bad': request_id 'a' is a duplicate"),
])
def test_bad_dependencies_are_refused_before_the_run(reqs: tuple[BenchRequest, ...],
                                                     msg: str) -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError) as e:
        _run(FakeTarget(clock), clock, Workload("bad", 0, {}, reqs),
             ArrivalSpec("closed", concurrency=1))
    assert msg in str(e.value)


# ---- the real engine and HTTP ------------------------------------------------------------


def test_multi_turn_chat_on_the_engine_hits_the_previous_turns(tmp_path: Path) -> None:
    from workbench.models.tokenizer import load_tokenizer
    from workbench.testing import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "llama", arch="llama")
    wl = make_workload("multi_turn_chat", 0, load_tokenizer(ckpt), num_users=2, num_turns=3,
                       system_prompt_len=16, first_message_len=24, message_len=8,
                       answer_len=4, think_time_s=0.02, max_model_len=256)
    target = InProcessTarget(str(ckpt), dict(dtype="float32", max_model_len=256,
                                             block_size=16))
    try:
        res = run(target, wl, ArrivalSpec("closed", concurrency=2), warmup_requests=0)
    finally:
        asyncio.run(target.stop())
    assert res.error is None and len(res.records) == 6 and all(r.success for r in res.records)
    by_id = {r.request_id: r for r in res.records}
    for req in wl.requests:
        if req.follows is not None:  # sent no earlier than think_s after the last turn ended
            prev = by_id[req.follows]
            assert by_id[req.request_id].start_s >= prev.end_s + req.think_s - 1e-3  # type: ignore
    assert [row["follows_success"] for row in res.follow_ups] == [True] * 4
    # each later turn finds at least the full blocks of the turn before it in the cache
    lower = sum(len(r.prompt_token_ids) // 16 * 16 for r in wl.requests if r.turn in (0, 1))
    assert res.server_delta["vllm:prefix_cache_hits"] >= lower


def test_follow_ups_over_http_after_a_failed_turn() -> None:
    from tests.harness.test_http_target import MODEL, FakeOpenAI, serve
    from workbench.harness.http_target import OpenAITarget
    from workbench.harness.replay import run_sync

    wl = Workload("http-chat", 0, {}, (
        BenchRequest("fail-a0", [1, 2, 3], 3, turn=0),
        BenchRequest("a1", [1, 2, 3, 4], 3, follows="fail-a0", think_s=0.05, turn=1),
        BenchRequest("a2", [1, 2, 3, 4, 5], 3, follows="a1", think_s=0.05, turn=2)))
    fake = FakeOpenAI(ttft_s=0.01, itl_s=0.002)
    with serve(fake.app) as url:
        target = OpenAITarget(url + "/v1", MODEL, poll_interval_s=None, timeout_s=5.0)
        try:
            res = run(target, wl, ArrivalSpec("closed", concurrency=1), warmup_requests=0)
        finally:
            run_sync(target.stop)
    by_id = {r.request_id: r for r in res.records}
    assert not by_id["fail-a0"].success and "HTTP 500" in by_id["fail-a0"].error  # type: ignore
    assert by_id["a1"].success and by_id["a2"].success
    assert by_id["a1"].start_s >= by_id["fail-a0"].end_s + 0.05 - 1e-3  # type: ignore
    assert by_id["a2"].start_s >= by_id["a1"].end_s + 0.05 - 1e-3  # type: ignore
    assert [(r["request_id"], r["follows_success"]) for r in res.follow_ups] == [
        ("a1", False), ("a2", True)]
    sent = [r["headers"]["x-request-id"] for r in fake.received]
    assert sent == ["fail-a0", "a1", "a2"]
