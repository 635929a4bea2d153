"""EngineStats: counters, gauges and a bounded step trace."""

from __future__ import annotations

import pytest

from workbench.metrics import stats as stats_mod
from workbench.metrics.stats import EngineStats, StepRecord


def _row(i: int, preemptions: int = 0) -> StepRecord:
    return StepRecord(step=i, wall_time_s=float(i), duration_s=0.5, prefill_tokens=3,
                      decode_tokens=2, running=4, waiting=1, kv_cache_usage_perc=0.25,
                      preemptions=preemptions)


def test_step_trace_keeps_the_newest_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_mod, "MAX_STEP_TRACE_ROWS", 4)
    s = EngineStats()
    for i in range(10):
        s.record_step(_row(i, preemptions=1 if i == 7 else 0))
    assert [r.step for r in s.step_trace] == [6, 7, 8, 9]
    snap = s.snapshot()
    assert snap["num_steps"] == 10 and snap["engine_time_s"] == 5.0
    assert snap["vllm:num_preemptions"] == 1
    assert (snap["vllm:num_requests_running"], snap["vllm:num_requests_waiting"]) == (4, 1)
    assert snap["vllm:kv_cache_usage_perc"] == 0.25
    assert snap["prefix_cache_hit_rate"] == 0.0
