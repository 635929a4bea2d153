"""Engine statistics under vLLM's metric names, the scheduler's per-step report, and the
per-step trace (vLLM's `v1/metrics/stats.py`).

`SchedulerStats` is what `Scheduler.make_stats()` reports after each step (vLLM's name):
running / waiting counts, KV usage, the prefix cache's queries and hits, preemptions, the
step's tokens, speculative verifications and the KV connector's counters. `EngineStats` turns
those reports, the engine's finished requests and the worker's KV transfer counters into
vLLM's counters and gauges: counters only grow; gauges are the value after the latest step.
`snapshot()` is what `LLM.stats()` returns. The step trace is one row per engine step (the
newest MAX_STEP_TRACE_ROWS are kept; `LLM.step_trace()` gives dicts ready for
`pandas.DataFrame`).

Every row carries the step's overhead account (`step_account.py`, docs/step_account.md); the
counters `workbench:step_<phase>_time_seconds` sum its phases.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.metrics import registry
from workbench.metrics.spec_decode import (
    SpecDecodingStats,
    accepted_length_distribution,
    mean_acceptance_length,
)
from workbench.metrics.step_account import OVERHEAD_SHARE, STEP_PHASES, STEP_TIME, phase_counter

# A long-running server steps forever: keep the newest rows only (about 20 MB at most).
MAX_STEP_TRACE_ROWS = 100_000

PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# The metric registry's engine rows (vLLM's names): kept as counters and gauges here.
COUNTERS = tuple(n for n in registry.engine_names("counter") if n != PER_POS)
FINISHED_REASONS = ("stop", "length", "abort", "error")
GAUGES = registry.engine_names("gauge")
# The worker-side KV connector's per-step counters (KVConnectorStats fields) -> counters.
KV_TRANSFER_COUNTERS: tuple[tuple[str, str], ...] = (
    ("vllm:kv_offload_load_bytes", "load_bytes"),
    ("vllm:kv_offload_load_time", "load_time_s"),
    ("vllm:kv_offload_store_bytes", "store_bytes"),
    ("vllm:kv_offload_store_time", "store_time_s"),
    ("vllm:kv_offload_tiering_read_bytes", "disk_read_bytes"),
    ("vllm:kv_offload_tiering_read_time", "disk_read_time_s"),
    ("workbench:kv_offload_tiering_write_bytes", "disk_write_bytes"),
    ("workbench:kv_offload_tiering_failed_writes", "failed_disk_writes"),
    ("workbench:kv_offload_tiering_bad_files", "disk_bad_files"),
    ("workbench:kv_offload_tiering_pruned_files", "disk_pruned_files"),
    ("workbench:kv_swap_out_bytes", "swap_out_bytes"),
    ("workbench:kv_swap_out_time", "swap_out_time_s"),
    ("workbench:kv_transfer_recv_bytes", "recv_bytes"),
    ("workbench:kv_transfer_recv_time", "recv_time_s"),
    ("workbench:kv_transfer_send_bytes", "send_bytes"),
    ("workbench:kv_transfer_send_time", "send_time_s"),
    ("workbench:kv_transfer_expired_sends", "expired_sends"),
    ("workbench:kv_transfer_sends", "sends"),
    ("workbench:kv_transfer_send_wait_time", "send_wait_s"),
    ("workbench:kv_transfer_stage_bytes", "stage_bytes"),
    ("workbench:kv_transfer_stage_time", "stage_time_s"),
    ("workbench:kv_transfer_push_bytes", "push_bytes"),
    ("workbench:kv_transfer_push_time", "push_time_s"),
    ("workbench:kv_transfer_push_drops", "push_drops"),
    ("workbench:kv_transfer_pushed_loads", "pushed_loads"),
)


@dataclass
class PrefixCacheStats:
    """Prompt tokens looked up in the prefix cache and tokens hit, since the last report."""

    queries: int = 0
    hits: int = 0


@dataclass
class SchedulerStats:
    """The scheduler's report after one step (vLLM's SchedulerStats, `make_stats()`)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # 1 - free / (num_blocks - 1)
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    num_preemptions: int = 0  # preempted in this step's schedule()
    # set by this step's update: tokens appended (stops truncate a verification's tokens),
    # and the prompt tokens of requests that got their first token (n > 1 children excluded)
    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0
    spec_decoding_stats: SpecDecodingStats | None = None  # None: nothing verified
    # KV connector (kv_transfer_config); None without one: its scheduler-side counters
    # (metric name -> increment), WAITING_FOR_REMOTE_KVS requests, the host tier's usage
    kv_connector_stats: dict[str, float] | None = None
    num_waiting_for_remote_kvs: int = 0
    kv_offload_cpu_usage: float = 0.0
    # KV blocks held by requests after the step; blocks the eviction policy released in it
    kv_blocks_in_use: int = 0
    num_evicted_blocks: int = 0


@dataclass
class StepRecord:
    step: int
    wall_time_s: float  # time.perf_counter() at the end of the step
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    running: int
    waiting: int
    kv_cache_usage_perc: float
    preemptions: int  # preemptions that happened in this step
    spec_draft_tokens: int = 0  # draft tokens verified in this step
    spec_accepted_tokens: int = 0  # of which accepted
    # KV connector (kv_transfer_config): requests in WAITING_FOR_REMOTE_KVS after the step,
    # and the bytes its worker side moved during the step (loads finished, stores, swap-outs)
    waiting_for_kv: int = 0
    kv_load_bytes: int = 0
    kv_store_bytes: int = 0
    # The overhead account (seconds; STEP_PHASES): scheduler.schedule(); the runner's input
    # preparation (block copies + flat batch); the model forward only; logits + sampling
    # (+ prompt logprobs); update_from_output + output bookkeeping; the speculative
    # proposer (0 without speculation); the rest of duration_s (runner and KV connector
    # glue, the TP broadcast, a failed batch's re-runs). On CUDA without
    # WORKBENCH_SYNC_STEP_TIMING=1 the runner's phases are host (launch) times.
    schedule_s: float = 0.0
    prepare_inputs_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0
    spec_propose_s: float = 0.0
    other_s: float = 0.0
    # The step's BatchComposition beyond the token counts (workbench/core/batch_composition
    # .py): what a cost model is fitted on (`workbench calibrate --serving` reads these rows)
    prefill_attn_pairs: int = 0
    decode_context_tokens: int = 0
    num_seqs: int = 0
    sampled_rows: int = 0
    prefill_seqs: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class EngineStats:
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    gauges: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GAUGES, 0.0))
    step_trace: deque[StepRecord] = field(
        default_factory=lambda: deque(maxlen=MAX_STEP_TRACE_ROWS)
    )
    num_steps: int = 0
    engine_time_s: float = 0.0  # summed step durations
    # vLLM's per-position acceptance counter: [i] = drafts whose position i was accepted.
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    # vLLM's vllm:request_success{finished_reason=...}: finished sequences by reason.
    finished_reasons: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0)
    )

    def record_finished(self, finish_reason: str | None) -> None:
        key = finish_reason if finish_reason in self.finished_reasons else "abort"
        self.finished_reasons[key] += 1

    def record_finished_requests(self, finish_reasons: Iterable[str | None]) -> None:
        """The requests a step's update finished (vllm:request_success, by reason)."""
        n = 0
        for reason in finish_reasons:
            self.record_finished(reason)
            n += 1
        self.counters["vllm:request_success"] += n

    def record_spec(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: num_draft_tokens drafts, the first num_accepted kept."""
        one = SpecDecodingStats()
        one.observe_draft(num_draft_tokens, num_accepted)
        self.record_spec_decoding(one)

    def record_spec_decoding(self, spec: SpecDecodingStats) -> None:
        c = self.counters
        c["vllm:spec_decode_num_drafts"] += spec.num_drafts
        c["vllm:spec_decode_num_draft_tokens"] += spec.num_draft_tokens
        c["vllm:spec_decode_num_accepted_tokens"] += spec.num_accepted_tokens
        per_pos, step = self.spec_accepted_per_pos, spec.num_accepted_tokens_per_pos
        if len(per_pos) < len(step):
            per_pos.extend([0] * (len(step) - len(per_pos)))
        for i, n in enumerate(step):
            per_pos[i] += n

    def record_scheduler_stats(self, s: SchedulerStats) -> None:
        """One step's scheduler report into the counters (the running / waiting / usage
        gauges come with the step's row, `record_step`)."""
        if s.spec_decoding_stats is not None:
            self.record_spec_decoding(s.spec_decoding_stats)
        c = self.counters
        c["vllm:generation_tokens"] += s.num_generation_tokens
        c["vllm:prompt_tokens"] += s.num_prompt_tokens
        c["vllm:prefix_cache_queries"] += s.prefix_cache_stats.queries
        c["vllm:prefix_cache_hits"] += s.prefix_cache_stats.hits
        c["workbench:kv_evicted_blocks"] += s.num_evicted_blocks
        self.gauges["workbench:kv_blocks_in_use"] = s.kv_blocks_in_use
        if s.kv_connector_stats is not None:
            for name, value in s.kv_connector_stats.items():
                c[name] = c.get(name, 0) + value
            self.gauges["workbench:num_requests_waiting_for_kv"] = s.num_waiting_for_remote_kvs
            self.gauges["workbench:kv_offload_cpu_usage_perc"] = s.kv_offload_cpu_usage

    def record_kv_transfer(self, transfer_stats: object, num_held_requests: int) -> None:
        """The worker-side KV connector's counters of one report (`KVConnectorStats`,
        KV_TRANSFER_COUNTERS) and the requests whose blocks it holds for another instance."""
        self.gauges["workbench:kv_transfer_held_requests"] = num_held_requests
        c = self.counters
        for name, attr in KV_TRANSFER_COUNTERS:
            c[name] += getattr(transfer_stats, attr)

    @property
    def num_preemptions(self) -> int:
        return int(self.counters["vllm:num_preemptions"])

    def record_step(self, record: StepRecord) -> None:
        self.num_steps += 1
        self.engine_time_s += record.duration_s
        c = self.counters
        c["vllm:num_preemptions"] += record.preemptions
        c[STEP_TIME] += record.duration_s
        for phase in STEP_PHASES:
            c[phase_counter(phase)] += getattr(record, phase + "_s")
        step = c[STEP_TIME]
        self.gauges[OVERHEAD_SHARE] = (
            (step - c[phase_counter("forward")]) / step if step > 0 else 0.0)
        self.gauges["vllm:num_requests_running"] = record.running
        self.gauges["vllm:num_requests_waiting"] = record.waiting
        self.gauges["vllm:kv_cache_usage_perc"] = record.kv_cache_usage_perc
        self.step_trace.append(record)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out.update(self.counters)
        out.update(self.gauges)
        q = self.counters["vllm:prefix_cache_queries"]
        out["prefix_cache_hit_rate"] = self.counters["vllm:prefix_cache_hits"] / q if q else 0.0
        out["num_steps"] = self.num_steps
        if self.counters["vllm:spec_decode_num_drafts"]:
            out.update(spec_summary(
                int(self.counters["vllm:spec_decode_num_drafts"]),
                int(self.counters["vllm:spec_decode_num_draft_tokens"]),
                int(self.counters["vllm:spec_decode_num_accepted_tokens"]),
                self.spec_accepted_per_pos,
            ))
        out["engine_time_s"] = self.engine_time_s
        # Not a "vllm:" key: the /metrics collector exports it with a finished_reason label.
        out["request_success_by_reason"] = dict(self.finished_reasons)
        out["num_failed_requests"] = self.finished_reasons["error"]
        return out


def spec_summary(
    num_drafts: int, num_draft_tokens: int, num_accepted: int, per_pos: list[int]
) -> dict[str, Any]:
    """Seed 002's read-out of the spec-decode counters: acceptance rate, mean acceptance
    length (1 + accepted / drafts) and the accepted-length distribution (P(len = i), i = 0..k)
    reconstructed from the per-position counters."""
    return {
        PER_POS: list(per_pos),
        "spec_decode_acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else 0.0,
        "spec_decode_mean_acceptance_length": mean_acceptance_length(num_drafts, num_accepted),
        "spec_decode_accepted_length_distribution": (
            accepted_length_distribution(num_drafts, per_pos) if per_pos else [1.0]
        ),
    }


