"""Engine statistics under vLLM's metric names, and the per-step trace.

Counters only grow; gauges are the value after the latest step. `snapshot()` is what
`LLM.stats()` returns. The step trace is one row per engine step (the newest
MAX_STEP_TRACE_ROWS are kept; `LLM.step_trace()` gives dicts ready for `pandas.DataFrame`).

Every row carries the step's overhead account: `duration_s` split into STEP_PHASES,

    duration_s = schedule_s + prepare_inputs_s + forward_s + sample_s + update_s
                 + spec_propose_s + other_s

(`docs/step_account.md`); the counters `workbench:step_<phase>_time_seconds` sum them and
`overhead_account(rows)` summarizes any rows (ms per step, share of step time).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.harness import metric_registry

# A long-running server steps forever: keep the newest rows only (about 20 MB at most).
MAX_STEP_TRACE_ROWS = 100_000

PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# The metric registry's engine rows (vLLM's names): kept as counters and gauges here.
COUNTERS = tuple(n for n in metric_registry.engine_names("counter") if n != PER_POS)
FINISHED_REASONS = ("stop", "length", "abort", "error")
GAUGES = metric_registry.engine_names("gauge")
# The overhead account's phases, in step order; each is a StepRecord field "<phase>_s".
STEP_PHASES = ("schedule", "prepare_inputs", "forward", "sample", "update", "spec_propose",
               "other")
STEP_TIME = "workbench:step_time_seconds"
OVERHEAD_SHARE = "workbench:step_overhead_share"


def phase_counter(phase: str) -> str:
    """The counter summing one phase's seconds: workbench:step_<phase>_time_seconds."""
    return f"workbench:step_{phase}_time_seconds"


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

    def record_spec(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: num_draft_tokens drafts, the first num_accepted kept."""
        c = self.counters
        c["vllm:spec_decode_num_drafts"] += 1
        c["vllm:spec_decode_num_draft_tokens"] += num_draft_tokens
        c["vllm:spec_decode_num_accepted_tokens"] += num_accepted
        per_pos = self.spec_accepted_per_pos
        if len(per_pos) < num_draft_tokens:
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted):
            per_pos[i] += 1

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
    from workbench.calc import accepted_length_distribution, mean_acceptance_length

    return {
        PER_POS: list(per_pos),
        "spec_decode_acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else 0.0,
        "spec_decode_mean_acceptance_length": mean_acceptance_length(num_drafts, num_accepted),
        "spec_decode_accepted_length_distribution": (
            accepted_length_distribution(num_drafts, per_pos) if per_pos else [1.0]
        ),
    }


def overhead_account(rows: Iterable[Mapping[str, Any] | StepRecord]) -> dict[str, float]:
    """The overhead account of step-trace rows (`LLM.step_trace()`, `RunResult.step_trace`,
    StepRecords): over the rows that carry it (older rows without `forward_s` are left out),

        num_steps                   rows summed
        step_ms                     mean step duration, ms
        <phase>_ms                  mean seconds per step of each of STEP_PHASES, in ms
        <phase>_share               the phase's seconds / the steps' seconds
        overhead_share              (step - forward) / step: everything but the model forward

    Shares are 0.0 when the rows hold no time; every value is a float except num_steps.
    Phases sum to the step: sum(<phase>_ms) == step_ms (up to float rounding)."""
    n = 0
    step = 0.0
    sums = dict.fromkeys(STEP_PHASES, 0.0)
    for row in rows:
        r = row.as_dict() if isinstance(row, StepRecord) else row
        if "forward_s" not in r:
            continue
        n += 1
        step += float(r["duration_s"])
        for phase in STEP_PHASES:
            sums[phase] += float(r.get(phase + "_s", 0.0))
    out: dict[str, float] = {"num_steps": n, "step_ms": 1e3 * step / n if n else 0.0}
    for phase in STEP_PHASES:
        out[phase + "_ms"] = 1e3 * sums[phase] / n if n else 0.0
    for phase in STEP_PHASES:
        out[phase + "_share"] = sums[phase] / step if step > 0 else 0.0
    out["overhead_share"] = (step - sums["forward"]) / step if step > 0 else 0.0
    return out
