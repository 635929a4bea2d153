"""The simulator's loop on the real scheduler with a fixed linear cost (1 ms + 0.1 ms per
token): exact timelines, routing, closed loops, follow-ups, prefix hits, preemption-free
failure of an impossible request, speculative acceptance, determinism."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.config import CacheConfig, SchedulerConfig
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.batch import BatchComposition
from workbench.sim.instance import SimInstance, SpecDecodeModel
from workbench.sim.simulator import simulate


class LinearCost:
    def __init__(self, fixed_s: float = 1e-3, per_token_s: float = 1e-4) -> None:
        self.fixed_s, self.per_token_s = fixed_s, per_token_s
        self.batches: list[BatchComposition] = []

    def step_time_s(self, batch: BatchComposition) -> float:
        self.batches.append(batch)
        return self.fixed_s + self.per_token_s * batch.num_tokens

    def describe(self) -> dict[str, Any]:
        return {"source": "test", "profile": "linear"}


def _inst(name: str = "i0", cost: LinearCost | None = None, budget: int = 16,
          num_blocks: int = 16, spec: SpecDecodeModel | None = None,
          caching: bool = True) -> SimInstance:
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=128)
    cc = CacheConfig(block_size=16, enable_prefix_caching=caching)
    return SimInstance(name, sc, cc, num_blocks, cost or LinearCost(), spec)


def _wl(*reqs: BenchRequest) -> Workload:
    return Workload("test", 0, {}, tuple(reqs))


def _req(rid: str, prompt: int, out: int, base: int = 100, **kw: Any) -> BenchRequest:
    return BenchRequest(rid, list(range(base, base + prompt)), out, **kw)


BURST = ArrivalSpec(mode="poisson", rate=float("inf"))


def test_one_request_chunked_prefill_then_decode_has_the_exact_timeline() -> None:
    cost = LinearCost()
    res = simulate(_wl(_req("a", 32, 4)), BURST, [_inst(cost=cost)])
    (rec,) = res.records
    # two 16-token prefill chunks (2.6 ms each, the second samples), then 3 decodes of 1.1 ms
    assert rec.chunk_times_s == pytest.approx([0.0052, 0.0063, 0.0074, 0.0085])
    assert rec.chunk_tokens == [1, 1, 1, 1]
    assert rec.success and rec.output_tokens == 4 and rec.end_s == pytest.approx(0.0085)
    assert rec.ttft_s == pytest.approx(0.0052) and res.duration_s == pytest.approx(0.0085)
    assert cost.batches[:2] == [
        BatchComposition(prefill_tokens=16, prefill_attn_pairs=136, num_seqs=1,
                         prefill_seqs=1),
        BatchComposition(prefill_tokens=16, prefill_attn_pairs=16 * 16 + 136, num_seqs=1,
                         sampled_rows=1, prefill_seqs=1)]
    assert cost.batches[2] == BatchComposition(decode_tokens=1, decode_context_tokens=33,
                                               num_seqs=1, sampled_rows=1)
    assert [row["prefill_tokens"] for row in res.step_trace] == [16, 16, 0, 0, 0]
    assert res.metrics()["completed"] == 1


def test_round_robin_spreads_a_burst_and_least_outstanding_fills_the_idle_one() -> None:
    wl = _wl(_req("a", 16, 2), _req("b", 16, 2, base=300), _req("c", 16, 2, base=500))
    rr = simulate(wl, BURST, [_inst("i0", budget=64), _inst("i1", budget=64)], "round_robin")
    assert [s["steps"] for s in rr.instances.values()] == [2.0, 2.0]  # a+c batched on i0
    lo = simulate(wl, BURST, [_inst("i0", budget=64), _inst("i1", budget=64)],
                  "least_outstanding")  # a -> i0, b -> i1 (fewer), c -> i0 (first on ties)
    assert [s["steps"] for s in lo.instances.values()] == [2.0, 2.0]
    # one 16-token prefill alone: 2.6 ms; a and c together on i0: 1 + 0.1 * 32 = 4.2 ms
    first = {r.request_id: r.chunk_times_s[0] for r in rr.records}
    assert first == pytest.approx({"a": 0.0042, "b": 0.0026, "c": 0.0042})


def test_a_closed_loop_sends_the_next_request_when_one_finishes() -> None:
    wl = _wl(_req("a", 16, 2), _req("b", 16, 2, base=300))
    res = simulate(wl, ArrivalSpec(mode="closed", concurrency=1), [_inst()])
    a, b = res.records
    assert a.start_s == 0.0 and b.start_s == pytest.approx(a.end_s)
    assert b.end_s - b.start_s == pytest.approx(a.end_s - a.start_s)


def test_a_follow_up_turn_is_sent_think_s_after_the_turn_it_follows() -> None:
    first = _req("t0", 16, 2)
    second = BenchRequest("t1", list(range(100, 116)) + list(range(900, 916)), 2,
                          follows="t0", think_s=0.5, turn=1)
    res = simulate(_wl(first, second), BURST, [_inst()])
    a, b = res.records
    assert b.start_s == pytest.approx(a.end_s + 0.5)
    assert b.num_cached_tokens == 16  # the first turn's prompt block is a prefix hit


def test_an_identical_prompt_hits_the_prefix_cache_but_not_with_caching_off() -> None:
    wl = _wl(_req("a", 48, 2), _req("b", 48, 2))
    closed = ArrivalSpec(mode="closed", concurrency=1)
    on = simulate(wl, closed, [_inst()])
    off = simulate(wl, closed, [_inst(caching=False)])
    # vLLM's rule: a full hit still recomputes the last token, so 2 of 3 blocks are reused
    assert [r.num_cached_tokens for r in on.records] == [0, 32]
    assert [r.num_cached_tokens for r in off.records] == [0, 0]
    assert on.counters["vllm:prefix_cache_queries"] == 96.0
    assert on.counters["vllm:prefix_cache_hits"] == 32.0
    assert on.counters["vllm:generation_tokens"] == 4.0
    assert on.records[1].ttft_s < off.records[1].ttft_s


def test_a_request_the_pool_can_never_hold_fails_and_the_rest_complete() -> None:
    wl = _wl(_req("big", 100, 2), _req("ok", 16, 2, base=300))
    res = simulate(wl, ArrivalSpec(mode="closed", concurrency=1), [_inst(num_blocks=4)])
    big, ok = res.records
    assert not big.success and "can never schedule it" in (big.error or "")
    assert "pool of 4" in (big.error or "")
    assert ok.success and ok.output_tokens == 2


def test_speculative_decoding_with_every_draft_accepted_emits_k_plus_one_per_step() -> None:
    spec = SpecDecodeModel(num_speculative_tokens=2, acceptance_rate=1.0)
    cost = LinearCost()
    res = simulate(_wl(_req("a", 16, 7)), BURST, [_inst(cost=cost, spec=spec)])
    (rec,) = res.records
    # the prefill samples 1, then each verification accepts 2 drafts + the bonus token
    assert rec.chunk_tokens == [1, 3, 3] and rec.output_tokens == 7
    # the first verification: 1 + 2 tokens over a context of 16 computed + 3
    assert cost.batches[1] == BatchComposition(decode_tokens=3, decode_context_tokens=19,
                                               num_seqs=1, sampled_rows=3, draft_tokens=2)


def test_speculative_acceptance_draws_are_seeded() -> None:
    def run(seed: int) -> list[int]:
        spec = SpecDecodeModel(num_speculative_tokens=3, acceptance_rate=0.5, seed=seed)
        (rec,) = simulate(_wl(_req("a", 16, 40)), BURST, [_inst(spec=spec)]).records
        assert sum(rec.chunk_tokens) == 40
        return rec.chunk_tokens

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_the_same_inputs_give_the_same_records() -> None:
    wl = _wl(*[_req(f"r{i}", 20 + i, 3 + i % 4, base=1000 * i) for i in range(12)])
    arrival = ArrivalSpec(mode="poisson", rate=500.0, seed=3)

    def run() -> list[tuple[float, ...]]:
        res = simulate(wl, arrival, [_inst("i0"), _inst("i1")], "least_outstanding")
        return [(r.start_s, r.end_s or 0.0, *r.chunk_times_s) for r in res.records]

    assert run() == run()


def test_without_the_step_trace_the_records_are_the_same() -> None:
    wl = _wl(*[_req(f"r{i}", 20 + i, 3 + i % 4, base=1000 * i) for i in range(12)])
    arrival = ArrivalSpec(mode="poisson", rate=500.0, seed=3)
    kept = simulate(wl, arrival, [_inst("i0"), _inst("i1")], "least_outstanding")
    insts = [_inst("i0"), _inst("i1")]
    dropped = simulate(wl, arrival, insts, "least_outstanding", keep_step_trace=False)
    assert dropped.step_trace == [] and len(kept.step_trace) == sum(i.steps for i in insts)
    assert [(r.start_s, r.end_s, r.chunk_times_s) for r in dropped.records] == \
        [(r.start_s, r.end_s, r.chunk_times_s) for r in kept.records]


def test_bad_policy_and_bad_instances_are_refused() -> None:
    with pytest.raises(ValueError, match=r"policy \('random'\) must be one of"):
        simulate(_wl(_req("a", 16, 2)), BURST, [_inst()], policy="random")
    with pytest.raises(ValueError, match="at least one SimInstance"):
        simulate(_wl(_req("a", 16, 2)), BURST, [])
    with pytest.raises(ValueError, match=r"num_blocks \(1\) must be an integer >= 2"):
        _inst(num_blocks=1)
    with pytest.raises(ValueError, match=r"acceptance_rate \(1.5\) must be in \[0, 1\]"):
        SpecDecodeModel(num_speculative_tokens=2, acceptance_rate=1.5)
