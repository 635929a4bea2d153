"""The scheduler with KV compression (streaming_llm, and a scripted score-based policy):
exact kept blocks and block ids step by step, the step message (whole table + offset after
an eviction), chunked-prefill eviction, the prefix cache after compression, preemption,
the score plumbing, and a budget at the full length changing nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.core.test_scheduler import EOS, fake_step, make_request, worker_tables
from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.kv_cache.compression import policy as policy_mod
from workbench.core.kv_cache.compression.policy import (
    EvictionDecision,
    KVCompressionPolicy,
    RequestKVView,
)
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request
from workbench.core.sched.scheduler import Scheduler
from workbench.sampling_params import SamplingParams

BS = 4


def make_scheduler(kv: dict[str, Any] | None, budget: int = 64, num_blocks: int = 100,
                   num_layers: int = 1) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=budget,
                         enable_chunked_prefill=True, max_model_len=256)
    cc = CacheConfig(block_size=BS, enable_prefix_caching=True, kv_compression_config=kv)
    return Scheduler(sc, cc, num_blocks, num_layers=num_layers)


STREAM = {"method": "streaming_llm", "budget_tokens": 16, "sink_tokens": 4}


def test_decode_eviction_keeps_sink_and_window_exact_blocks_and_message() -> None:
    s = make_scheduler(STREAM)
    r = make_request("r", 10, max_tokens=15)
    s.add_request(r)
    kv = s.kv_cache_manager
    kept: list[list[int]] = []
    ids: list[list[int]] = []
    for _ in range(14):
        step = fake_step(s)
        kept.append(kv.kept_logical_blocks("r"))
        ids.append(kv.get_block_ids("r"))
        nc = r.num_computed_tokens - step.out.num_scheduled_tokens["r"]
        if nc in (16, 20):  # the steps that evict: the whole table and the offset travel
            cached = step.out.scheduled_cached_reqs
            assert cached.resumed_from_preemption == [True]
            assert cached.new_block_ids == [ids[-1]]
            assert step.out.num_evicted_tokens == {"r": nc - 12}
        elif step.out.scheduled_cached_reqs.num_reqs:
            assert step.out.scheduled_cached_reqs.resumed_from_preemption == [False]
            assert step.out.num_evicted_tokens == {}
    # prefill 10 tokens (logical blocks 0..2), decodes at 10..22: one block out (the oldest
    # non-sink) whenever a fifth would be needed, at positions 16 and 20
    assert kept == [[0, 1, 2]] * 3 + [[0, 1, 2, 3]] * 4 + [[0, 2, 3, 4]] * 4 \
        + [[0, 3, 4, 5]] * 3
    # the evicted block goes to the free queue's tail; the next new block is its head's
    assert ids[0] == [1, 2, 3] and ids[3] == [1, 2, 3, 4]
    assert ids[7] == [1, 3, 4, 5] and ids[11] == [1, 4, 5, 6]
    assert kv.num_evicted_tokens("r") == 8 and kv.num_evicted_blocks == 2
    assert r.num_computed_tokens == 23
    assert max(len(i) for i in ids) == 4


def test_chunked_prefill_evicts_between_chunks_never_the_block_being_written() -> None:
    s = make_scheduler(STREAM, budget=8)
    r = make_request("r", 40, max_tokens=3)
    s.add_request(r)
    kept = []
    for _ in range(6):
        fake_step(s)
        kept.append(s.kv_cache_manager.kept_logical_blocks("r"))
    assert kept == [[0, 1], [0, 1, 2, 3], [0, 3, 4, 5], [0, 5, 6, 7], [0, 7, 8, 9],
                    [0, 8, 9, 10]]


def test_a_chunk_longer_than_the_window_exceeds_the_budget_by_the_chunk_only() -> None:
    s = make_scheduler({"method": "streaming_llm", "budget_tokens": 12}, budget=16)
    r = make_request("r", 40, max_tokens=3)
    s.add_request(r)
    kept = []
    for _ in range(4):
        fake_step(s)
        kept.append(s.kv_cache_manager.kept_logical_blocks("r"))
    # the first chunk is uncompressed; each later one first drops every written non-sink
    # block but keeps its own until the next step
    assert kept == [[0, 1, 2, 3], [0, 4, 5, 6, 7], [0, 8, 9], [0, 9, 10]]


def test_budget_at_the_full_length_changes_no_message() -> None:
    def run(kv: dict[str, Any] | None) -> list[Any]:
        s = make_scheduler(kv, budget=16)
        for i in range(4):
            s.add_request(make_request(f"r{i}", 9 + 7 * i, max_tokens=10, start=10 + 50 * i))
        outs = []
        while s.has_unfinished_requests():
            outs.append(fake_step(s).out)
        return outs

    full = run({"method": "streaming_llm", "budget_tokens": 40 + 10})
    ratio = run({"method": "streaming_llm", "budget_ratio": 1.0, "sink_tokens": 0})
    plain = run(None)
    assert full == plain
    assert ratio != plain  # a ratio of the prompt: the outputs grow past it and are evicted


def test_prefix_cache_after_a_compressed_request() -> None:
    s = make_scheduler(STREAM)
    r = make_request("r", 16, max_tokens=10)
    s.add_request(r)
    while s.has_unfinished_requests():
        fake_step(s)
    assert s.kv_cache_manager.num_evicted_blocks > 0
    # the prompt's logical blocks 1.. were evicted (keys dropped): a new request with the
    # same prompt hits the sink block only
    again = make_request("again", 16, max_tokens=1)
    s.add_request(again)
    fake_step(s)
    assert again.num_cached_tokens == 4


def test_preempted_compressed_request_restarts_uncompressed_and_evicts_again() -> None:
    s = make_scheduler(STREAM)
    r = make_request("r", 10, max_tokens=20)
    s.add_request(r)
    for _ in range(8):
        fake_step(s)
    kv = s.kv_cache_manager
    assert kv.num_evicted_tokens("r") == 4 and r.num_computed_tokens == 17
    s.running.remove(r)
    s._preempt(r)  # what the running loop does to a victim
    assert kv.get_block_ids("r") == [] and kv.num_evicted_tokens("r") == 0
    step = fake_step(s)  # recompute: prompt + outputs in one chunk, uncompressed
    assert step.out.num_scheduled_tokens == {"r": 14}  # block 0 (the sink) is a hit
    assert step.out.scheduled_cached_reqs.resumed_from_preemption == [True]
    assert step.out.num_evicted_tokens == {}
    assert kv.kept_logical_blocks("r") == [0, 1, 2, 3, 4]  # a hit on block 0 + 4 new
    assert r.num_cached_tokens == 0  # (the first schedule's count stands)
    fake_step(s)  # decode at 18: five blocks held, over the budget -> the oldest out
    assert kv.kept_logical_blocks("r") == [0, 2, 3, 4]
    assert kv.num_evicted_tokens("r") == 4


class ScriptedScores(KVCompressionPolicy):
    """A score-based policy for the plumbing test: scores every step's last query; evicts
    the lowest-scored evictable block once it has scores; layer 1 drops block 0."""

    method = "h2o"
    needs_scores = True
    score_when = "decode"
    seen: list[tuple[str, tuple[int, ...], int, list[list[float]]]] = []

    def __init__(self, config: Any, block_size: int, num_layers: int) -> None:
        super().__init__(config, block_size, num_layers)
        self.scores: dict[str, dict[int, float]] = {}

    def score_queries(self, view: RequestKVView) -> tuple[int, int] | None:
        end = view.num_computed_tokens + view.num_new_tokens
        return (end - 1, end)

    def observe(self, request_id: str, view: RequestKVView, scores: np.ndarray) -> None:
        ScriptedScores.seen.append((request_id, view.kept_blocks, view.num_computed_tokens,
                                    scores.tolist()))
        acc = self.scores.setdefault(request_id, {})
        for k, li in enumerate(view.kept_blocks):
            acc[li] = acc.get(li, 0.0) + float(scores[:, k].sum())

    def select(self, view: RequestKVView) -> EvictionDecision | None:
        acc = self.scores.get(view.request_id)
        candidates = [b for b in view.evictable if acc and b in acc]
        if not candidates or view.num_blocks_after_step <= 3:
            return None
        worst = min(candidates, key=lambda b: (acc[b], b))  # type: ignore[index]
        return EvictionDecision(evict=[worst], layer_drop=[[], [0]])

    def forget(self, request_id: str) -> None:
        self.scores.pop(request_id, None)


def test_score_plumbing_queries_scores_layer_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    policy_mod.registered_methods()  # the shipped ones first: ours replaces "h2o" for now
    monkeypatch.setitem(policy_mod._REGISTRY, "h2o", ScriptedScores)
    ScriptedScores.seen = []
    s = make_scheduler({"method": "h2o", "budget_tokens": 12}, num_layers=2)
    r = make_request("r", 12, max_tokens=6)
    s.add_request(r)
    kv = s.kv_cache_manager
    for i in range(3):
        out = s.schedule()
        worker_tables(s, out)
        assert out.kv_score_queries == {"r": (11 + i, 12 + i) if i else (11, 12)}
        n = len(kv.get_block_ids("r"))
        scores = np.asarray([[1.0 + k for k in range(n)], [0.5] * n], dtype=np.float32)
        scores[0, 1] = 0.0  # logical block 1 gets the least attention
        sampled = {"r": [7]}
        s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled,
                                                    kv_block_scores={"r": scores}))
        kv.check_integrity()
        if i == 0:
            assert ScriptedScores.seen[0][:3] == ("r", (0, 1, 2), 0)
            assert out.kv_layer_drops == {}
        if i == 1:  # decode at 12: a 4th block needed -> block 1 (lowest) out, layer 1 drops 0
            assert kv.kept_logical_blocks("r") == [0, 2, 3]
            assert out.num_evicted_tokens == {"r": 4}
            assert out.kv_layer_drops == {"r": [[], [0]]}
            assert ScriptedScores.seen[1][:3] == ("r", (0, 2, 3), 12)
    # finishing drops the policy's state
    while s.has_unfinished_requests():
        fake_step(s)
    assert r.is_finished() and s.kv_policy is not None
    assert s.kv_policy.scores == {}  # type: ignore[attr-defined]


def test_eos_finishes_a_compressed_request_and_frees_everything() -> None:
    s = make_scheduler(STREAM)
    r = Request("r", list(range(10, 30)), SamplingParams(temperature=0.0, max_tokens=50),
                eos_token_id=EOS)
    s.add_request(r)
    for _ in range(12):
        fake_step(s)
    fake_step(s, token=EOS)
    assert r.is_finished() and s.kv_cache_manager.num_free_blocks == 99
