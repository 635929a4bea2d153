"""Scheduler.make_stats() -> SchedulerStats: exact counts after scripted steps (no model: a
fake step samples fixed tokens), and EngineStats reading the reports into vLLM's counters."""

from __future__ import annotations

from typing import Any

from tests.core.test_scheduler import runner_output
from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole
from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata, KVConnectorOutput
from workbench.metrics.spec_decode import SpecDecodingStats
from workbench.metrics.stats import EngineStats, PrefixCacheStats, SchedulerStats
from workbench.sampling_params import SamplingParams


def _scheduler(num_blocks: int = 7, connector: KVConnectorBase_V1 | None = None) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=32)
    return Scheduler(sc, CacheConfig(block_size=4, enable_prefix_caching=True), num_blocks,
                     connector=connector)


def _request(rid: str, num_tokens: int, start: int) -> Request:
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return Request(rid, list(range(start, start + num_tokens)), sp, eos_token_id=2)


def _step(s: Scheduler, tokens: dict[str, list[int]] | None = None) -> SchedulerOutput:
    """schedule + update; a request whose computed tokens reach its end gets `tokens[id]`
    (default one token, 7)."""
    out = s.schedule()
    reqs = s.requests
    sampled = {
        rid: (tokens or {}).get(rid, [7]) for rid, n in out.num_scheduled_tokens.items()
        if reqs[rid].num_computed_tokens + n >= reqs[rid].num_tokens
    }
    s.update_from_output(out, runner_output(sampled))
    return out


def test_counts_after_prefills_a_preemption_and_a_prefix_hit() -> None:
    # 6 usable blocks of 4 tokens; three 8-token prompts take two blocks each
    s = _scheduler()
    for i in range(3):
        s.add_request(_request(f"r{i}", 8, start=10 + 10 * i))
    _step(s)
    assert s.make_stats() == SchedulerStats(
        num_running_reqs=3, num_waiting_reqs=0, kv_cache_usage=1.0,
        prefix_cache_stats=PrefixCacheStats(queries=24, hits=0), num_preemptions=0,
        num_generation_tokens=3, num_prompt_tokens=24, kv_blocks_in_use=6,
    )
    # each needs a third block for its 9th token: r2 (the last running) is preempted
    s.add_request(_request("late", 4, start=90))
    out = _step(s)
    assert out.preempted_request_ids == ["r2"]
    assert s.make_stats() == SchedulerStats(
        num_running_reqs=2, num_waiting_reqs=2, kv_cache_usage=1.0,
        num_preemptions=1, num_generation_tokens=2, num_prompt_tokens=0, kv_blocks_in_use=6,
    )
    # a report takes the step's counters: a second one without a step has none of them
    again = s.make_stats()
    assert (again.num_generation_tokens, again.num_prompt_tokens) == (0, 0)
    assert again.prefix_cache_stats == PrefixCacheStats(0, 0)


def test_a_prefix_hit_counts_queries_and_hits() -> None:
    s = _scheduler(num_blocks=20)
    s.add_request(_request("a", 9, start=10))
    _step(s)
    s.make_stats()
    s.add_request(_request("b", 9, start=10))  # same prompt: two full blocks hit
    _step(s)
    stats = s.make_stats()
    assert stats.prefix_cache_stats == PrefixCacheStats(queries=9, hits=8)
    assert (stats.num_running_reqs, stats.num_generation_tokens, stats.num_prompt_tokens) == (
        2, 2, 9)


def test_spec_decoding_counts_each_verification_with_tokens() -> None:
    s = _scheduler(num_blocks=30)
    for rid, start in (("a", 10), ("b", 40), ("c", 70)):
        s.add_request(_request(rid, 4, start=start))
    _step(s)
    s.make_stats()
    s.update_draft_token_ids({"a": [1, 2, 3], "b": [4, 5], "c": [6]})
    out = s.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [1, 2, 3], "b": [4, 5], "c": [6]}
    # a: two drafts accepted + the bonus token; b: none accepted; c: its sampling failed
    failed = {"c": "injected"}
    s.update_from_output(out, runner_output({"a": [1, 2, 9], "b": [8]}), failed)
    stats = s.make_stats()
    assert stats.spec_decoding_stats == SpecDecodingStats(
        num_drafts=2, num_draft_tokens=5, num_accepted_tokens=2,
        num_accepted_tokens_per_pos=[1, 1, 0])
    assert stats.num_generation_tokens == 4
    assert s.make_stats().spec_decoding_stats is None  # reported once


class _CountingConnector(KVConnectorBase_V1):
    """Scheduler side only (the worker side moves nothing): no external hits, a fixed
    counter per report."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def make_stats(self) -> dict[str, float]:
        return {"workbench:kv_offload_host_hits": 8.0}

    @property
    def host_usage(self) -> float:
        return 0.25

    def start_load_kv(self) -> None:
        pass

    def save_kv_layer(self, layer: int, kv_layer: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: set[str], wait: bool = False) -> KVConnectorOutput:
        return KVConnectorOutput()


def test_connector_counters_and_gauges_ride_along() -> None:
    s = _scheduler(connector=_CountingConnector(KVConnectorRole.SCHEDULER))
    s.add_request(_request("a", 4, start=10))
    _step(s)
    stats = s.make_stats()
    assert stats.kv_connector_stats == {"workbench:kv_offload_host_hits": 8.0}
    assert (stats.num_waiting_for_remote_kvs, stats.kv_offload_cpu_usage) == (0, 0.25)
    assert _scheduler().make_stats().kv_connector_stats is None


def test_engine_stats_read_scheduler_reports_into_vllm_counters() -> None:
    e = EngineStats()
    spec = SpecDecodingStats()
    spec.observe_draft(3, 2)
    spec.observe_draft(2, 0)
    report = SchedulerStats(
        prefix_cache_stats=PrefixCacheStats(queries=24, hits=8), num_generation_tokens=5,
        num_prompt_tokens=24, spec_decoding_stats=spec,
        kv_connector_stats={"workbench:kv_offload_host_hits": 8.0},
        num_waiting_for_remote_kvs=1, kv_offload_cpu_usage=0.25,
    )
    e.record_scheduler_stats(report)
    e.record_scheduler_stats(report)
    e.record_finished_requests(["stop", "length", None])
    snap = e.snapshot()
    assert (snap["vllm:prefix_cache_queries"], snap["vllm:prefix_cache_hits"]) == (48, 16)
    assert (snap["vllm:generation_tokens"], snap["vllm:prompt_tokens"]) == (10, 48)
    assert (snap["vllm:spec_decode_num_drafts"], snap["vllm:spec_decode_num_draft_tokens"],
            snap["vllm:spec_decode_num_accepted_tokens"]) == (4, 10, 4)
    assert snap["vllm:spec_decode_num_accepted_tokens_per_pos"] == [2, 2, 0]
    assert snap["workbench:kv_offload_host_hits"] == 16.0
    assert snap["workbench:num_requests_waiting_for_kv"] == 1
    assert snap["workbench:kv_offload_cpu_usage_perc"] == 0.25
    assert snap["vllm:request_success"] == 3
    assert snap["request_success_by_reason"] == {"stop": 1, "length": 1, "abort": 1,
                                                 "error": 0}
