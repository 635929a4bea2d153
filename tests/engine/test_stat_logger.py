"""vLLM's periodic engine log line and preemption warning (injected clock, exact lines)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from workbench import LLM, SamplingParams
from workbench.metrics import loggers as sl
from workbench.metrics.stats import EngineStats, StepRecord


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _step(stats: EngineStats, running: int, waiting: int, usage: float) -> None:
    stats.record_step(StepRecord(step=stats.num_steps, wall_time_s=0.0, duration_s=0.01,
                                 prefill_tokens=0, decode_tokens=0, running=running,
                                 waiting=waiting, kv_cache_usage_perc=usage, preemptions=0))


def test_one_line_per_interval_with_interval_rates(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logger = sl.LoggingStatLogger(interval_s=10.0, clock=clock)
    stats = EngineStats()
    c = stats.counters
    c["vllm:prompt_tokens"], c["vllm:generation_tokens"] = 1000, 200
    c["vllm:prefix_cache_queries"], c["vllm:prefix_cache_hits"] = 800, 600
    _step(stats, running=7, waiting=2, usage=0.415)
    clock.t += 9.9
    assert logger.observe(stats) is None  # not yet
    clock.t += 0.1
    with caplog.at_level(logging.DEBUG, logger="workbench.engine"):
        line = logger.observe(stats)
    assert line == ("Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg generation "
                    "throughput: 20.0 tokens/s, Running: 7 reqs, Waiting: 2 reqs, KV cache "
                    "usage: 41.5%, Prefix cache hit rate: 75.0%")
    assert caplog.records[-1].levelno == logging.INFO
    # the next interval counts only what happened in it; an idle line is DEBUG
    c["vllm:generation_tokens"] += 50
    _step(stats, running=1, waiting=0, usage=0.05)
    clock.t += 25.0
    assert logger.observe(stats) == (
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 2.0 "
        "tokens/s, Running: 1 reqs, Waiting: 0 reqs, KV cache usage: 5.0%, Prefix cache hit "
        "rate: 0.0%")
    _step(stats, running=0, waiting=0, usage=0.0)
    clock.t += 10.0
    with caplog.at_level(logging.DEBUG, logger="workbench.engine"):
        logger.observe(stats)
    assert caplog.records[-1].levelno == logging.DEBUG
    assert logger.lines == 3
    assert sl.LoggingStatLogger(interval_s=1.0, device="cuda").kv_label == "GPU KV cache usage"


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sl.INTERVAL_ENV, "2.5")
    assert sl.LoggingStatLogger().interval_s == 2.5
    monkeypatch.setenv(sl.INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match=r"WORKBENCH_LOG_STATS_INTERVAL \('soon'\) must be a "
                                         r"number of seconds > 0"):
        sl.log_stats_interval_s()


@pytest.mark.parametrize(("n", "total", "warned"), [
    (1, 1, True), (2, 2, True), (1, 2, False), (3, 49, False), (3, 51, True), (1, 50, True),
    (1, 51, False), (0, 7, False),
])
def test_preemption_warning_on_the_first_and_every_50th(n: int, total: int, warned: bool) -> None:
    msg = sl.preemption_warning([f"r{i}" for i in range(n)], total)
    assert (msg is not None) == warned
    if warned:
        assert msg is not None and msg.startswith("request r0 was preempted (recompute)")
        assert msg.endswith(f"total_num_cumulative_preemption={total}")


def test_engine_logs_preemptions_and_lines_only_when_asked(
    checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    quiet = LLM(checkpoints["llama"], dtype="float32", max_model_len=64, block_size=4,
                num_gpu_blocks_override=20)
    assert quiet.engine.stat_logger is None  # LLM: off by default, as vLLM's
    llm = LLM(checkpoints["llama"], dtype="float32", max_model_len=64, block_size=4,
              num_gpu_blocks_override=20, disable_log_stats=False)
    assert llm.engine.stat_logger is not None
    clock = FakeClock()
    llm.engine.stat_logger = sl.LoggingStatLogger(interval_s=1.0, clock=clock)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    with caplog.at_level(logging.INFO, logger="workbench.engine"):
        llm.generate([[11 + i] * 20 for i in range(4)], params)  # 4 x 50 tokens > 19 blocks
    preempted = llm.stats()["vllm:num_preemptions"]
    assert preempted >= 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and warnings[0].endswith("total_num_cumulative_preemption=1")
    assert llm.engine.stat_logger.lines == 0  # the fake clock never moved
    clock.t += 1.0
    line = llm.engine.stat_logger.observe(llm.engine.stats)
    assert line is not None and line.startswith("Engine 000: Avg prompt throughput: 80.0 tokens/s")
