"""Engine statistics under vLLM's metric names, and the per-step trace.

Counters only grow; gauges are the value after the latest step. `snapshot()` is what
`LLM.stats()` returns. The step trace is one row per engine step (the newest
MAX_STEP_TRACE_ROWS are kept; `LLM.step_trace()` gives dicts ready for `pandas.DataFrame`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

# A long-running server steps forever: keep the newest rows only (about 20 MB at most).
MAX_STEP_TRACE_ROWS = 100_000

COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
)
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
)


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

    def record_step(self, record: StepRecord) -> None:
        self.num_steps += 1
        self.engine_time_s += record.duration_s
        self.counters["vllm:num_preemptions"] += record.preemptions
        self.gauges["vllm:num_requests_running"] = record.running
        self.gauges["vllm:num_requests_waiting"] = record.waiting
        self.gauges["vllm:kv_cache_usage_perc"] = record.kv_cache_usage_perc
        self.step_trace.append(record)

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = {}
        out.update(self.counters)
        out.update(self.gauges)
        q = self.counters["vllm:prefix_cache_queries"]
        out["prefix_cache_hit_rate"] = self.counters["vllm:prefix_cache_hits"] / q if q else 0.0
        out["num_steps"] = self.num_steps
        out["engine_time_s"] = self.engine_time_s
        return out
