"""The load generator (harness/replay.py): closed/open loops on the in-process engine,
validity, cache states, failures."""

from __future__ import annotations

import asyncio
import random
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest

from workbench import LLM, SamplingParams
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import RequestRecord
from workbench.harness.replay import RunResult, run
from workbench.harness.targets import InProcessTarget
from workbench.harness.validity import check_validity
from workbench.harness.workloads import BenchRequest, Workload
from workbench.testing import tiny_checkpoint

KW: dict[str, Any] = dict(dtype="float32", max_model_len=256, block_size=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("runner") / "llama", arch="llama")


@pytest.fixture(scope="module")
def target(ckpt: Path) -> Any:
    t = InProcessTarget(str(ckpt), KW)
    yield t
    asyncio.run(t.stop())


def _workload(n: int, seed: int = 0, max_tokens: int | None = None) -> Workload:
    """n unique random prompts of 20..40 tokens (>= 1 full block each), 3..8 output tokens."""
    rng = random.Random(seed)
    reqs = tuple(
        BenchRequest(
            request_id=f"r{i}",
            prompt_token_ids=[rng.randrange(10, 1000) for _ in range(rng.randrange(20, 41))],
            max_tokens=max_tokens or 3 + i % 6,
        )
        for i in range(n)
    )
    return Workload(name=f"test-{seed}", seed=seed, params={"n": n}, requests=reqs)


def _max_in_flight(records: list[RequestRecord]) -> int:
    events = sorted([(r.start_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    level = peak = 0
    for _, d in events:  # ties: -1 sorts before +1 (a finished slot is reused)
        level += d
        peak = max(peak, level)
    return peak


def test_closed_loop_matches_reference(ckpt: Path, target: InProcessTarget) -> None:
    wl = _workload(12)
    res = run(target, wl, ArrivalSpec("closed", concurrency=4))
    assert isinstance(res, RunResult) and res.error is None and res.validity.valid
    assert not res.open_loop and res.workload_checksum == wl.checksum
    assert len(res.records) == 12 and res.unsent_requests == 0
    for rec in res.records:
        req = next(r for r in wl.requests if r.request_id == rec.request_id)
        assert rec.success and rec.error is None
        assert rec.output_tokens == req.max_tokens == sum(rec.chunk_tokens)
        assert len(rec.chunk_times_s) == rec.output_tokens  # one token per step, no spec
        assert rec.start_s <= rec.first_token_s <= rec.end_s  # type: ignore[operator]
        assert rec.server_ttft_s is not None and rec.server_e2e_s is not None
        assert rec.server_queue_s >= 0 and rec.server_decode_s >= 0  # type: ignore[operator]
    assert _max_in_flight(res.records) == 4
    llm = LLM(ckpt, **KW)
    outs = llm.generate(
        [r.prompt_token_ids for r in wl.requests],
        [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
         for r in wl.requests],
    )
    for req, out in zip(wl.requests, outs, strict=True):
        assert target.outputs[req.request_id] == out.outputs[0].token_ids
    assert res.step_trace and all(row["time_s"] >= 0 for row in res.step_trace)
    assert res.server_delta["vllm:request_success"] == 12
    m = res.metrics()
    assert m["completed"] == 12 and m["total_output_tokens"] == sum(r.max_tokens for r in
                                                                     wl.requests)


def test_open_loop_constant_rate_follows_offsets(target: InProcessTarget) -> None:
    wl = _workload(8, seed=1, max_tokens=3)
    res = run(target, wl, ArrivalSpec("constant", rate=25.0))
    assert res.error is None and res.open_loop and len(res.records) == 8
    by_id = {r.request_id: r for r in res.records}
    for i in range(8):
        rec = by_id[f"r{i}"]
        assert rec.success
        assert rec.target_arrival_s == pytest.approx(i / 25.0)
        assert rec.start_s >= rec.target_arrival_s - 1e-3  # never early
    lateness = [r.start_s - r.target_arrival_s for r in res.records]  # type: ignore[operator]
    assert statistics.median(lateness) < 0.05
    assert res.validity.valid, res.validity.reasons
    assert res.validity.target_rate == pytest.approx(25.0)


def test_validity_flags_a_late_client() -> None:
    spec = ArrivalSpec("constant", rate=10.0)

    def rec(i: int, start: float) -> RequestRecord:
        return RequestRecord(f"r{i}", 10, 5, True, target_arrival_s=i / 10, start_s=start)

    on_time = [rec(i, i / 10 + 0.002) for i in range(10)]
    ok = check_validity(on_time, spec, duration_s=1.0)
    assert ok.valid and ok.reasons == [] and ok.achieved_rate == pytest.approx(10, rel=0.01)
    late = [rec(i, i / 10 * 2 + 0.01) for i in range(10)]  # sends at half the rate
    bad = check_validity(late, spec, duration_s=2.0)
    assert not bad.valid and bad.target_rate == pytest.approx(10.0)
    assert bad.achieved_rate == pytest.approx(9 / 1.81)
    assert any("achieved send rate 4.97 req/s" in r for r in bad.reasons)
    assert any("median lateness" in r for r in bad.reasons)
    assert bad.median_lateness_s == pytest.approx(0.46, abs=0.01)
    closed = check_validity(late, ArrivalSpec("closed", concurrency=2), duration_s=2.0)
    assert closed.valid


def test_cache_states(target: InProcessTarget) -> None:
    wl = _workload(6, seed=2)
    closed = ArrivalSpec("closed", concurrency=2)

    def hits(res: RunResult) -> float:
        assert res.error is None and all(r.success for r in res.records)
        return res.server_delta["vllm:prefix_cache_hits"]

    prefix = run(target, wl, closed, cache_state="warm-prefix")
    assert hits(prefix) > 0 and prefix.cache_state == "warm-prefix"
    model = run(target, wl, closed, cache_state="warm-model")  # the same prompts again
    assert hits(model) == 0
    starts = target.num_starts
    cold = run(target, wl, closed, cache_state="cold")
    assert target.num_starts == starts + 1
    assert cold.server_before["num_steps"] == 0 and cold.server_before["vllm:prompt_tokens"] == 0
    assert hits(cold) == 0 and len(cold.step_trace) == cold.server_after["num_steps"]


class _FlakyTarget(InProcessTarget):
    async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
        if req.request_id == "r3":
            raise RuntimeError("boom for r3")
        await super().generate(req, record)


def test_failing_request_and_failing_runner(ckpt: Path) -> None:
    flaky = _FlakyTarget(str(ckpt), KW)
    wl = _workload(6, seed=3)
    res = run(flaky, wl, ArrivalSpec("closed", concurrency=3), warmup_requests=0)
    by_id = {r.request_id: r for r in res.records}
    assert res.error is None and len(by_id) == 6
    assert not by_id["r3"].success and by_id["r3"].error == "RuntimeError: boom for r3"
    assert all(r.success for k, r in by_id.items() if k != "r3")
    assert res.metrics()["completed"] == 5

    async def in_a_running_loop() -> RunResult:  # like Jupyter: run() uses a worker thread
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = run(flaky, wl, ArrivalSpec("trace"))  # no arrival_s in the workload
        assert any("INVALID" in str(w.message) for w in caught)
        return out

    broken = asyncio.run(in_a_running_loop())
    assert broken.error is not None and "arrival_s" in broken.error
    assert not broken.validity.valid and broken.records == []
    asyncio.run(flaky.stop())


def test_max_duration_cuts_the_run(target: InProcessTarget) -> None:
    # 64 x 200 tokens one at a time: far more than any machine decodes in 0.3 s (4 requests
    # were once all done in 0.26 s), so the cut always leaves requests unsent.
    wl = _workload(64, seed=4, max_tokens=200)
    with pytest.warns(RuntimeWarning, match="max_duration_s"):
        res = run(target, wl, ArrivalSpec("closed", concurrency=1), warmup_requests=0,
                  max_duration_s=0.3)
    assert res.error is None and not res.validity.valid
    assert res.unsent_requests >= 1 and res.records
    last = res.records[-1]
    assert not last.success and "cancelled" in (last.error or "")
    assert target.engine is not None
    target.engine.submit(lambda e: None).result(5)  # the loop applied the queued abort
    assert target.engine.num_in_flight() == 0
    assert not target.engine.submit(lambda e: e.has_unfinished_requests()).result(5)
