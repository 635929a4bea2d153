"""vLLM's periodic engine log line, and its preemption warning.

    Engine 000: Avg prompt throughput: 512.3 tokens/s, Avg generation throughput: 88.1 tokens/s,
    Running: 7 reqs, Waiting: 2 reqs, GPU KV cache usage: 41.5%, Prefix cache hit rate: 63.0%

`LoggingStatLogger.observe(stats)` runs after every engine step and logs at most once per
`interval_s` (WORKBENCH_LOG_STATS_INTERVAL, default 10 s, as VLLM_LOG_STATS_INTERVAL):
throughputs are the token counters' growth over the interval, the hit rate is the interval's
prefix-cache hits / queries, running / waiting / KV usage the gauges after the latest step
(on CPU "KV cache usage", as the pool lives in host memory). A line with no traffic is logged
at DEBUG, so an idle engine stays quiet. `LLM` turns it off by default and `workbench serve`
on (`disable_log_stats`, vLLM's names for both).

`preemption_warning` follows vLLM: the first recompute preemption, then every 50th, is a
warning naming the cumulative count and what to change.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from workbench.metrics.stats import EngineStats

logger = logging.getLogger("workbench.engine")
INTERVAL_ENV = "WORKBENCH_LOG_STATS_INTERVAL"
DEFAULT_INTERVAL_S = 10.0
PREEMPTION_WARNING_EVERY = 50


def log_stats_interval_s() -> float:
    """The interval from WORKBENCH_LOG_STATS_INTERVAL (seconds > 0), else 10 s."""
    raw = os.environ.get(INTERVAL_ENV, "")
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{INTERVAL_ENV} ({raw!r}) must be a number of seconds > 0")
    return value


class LoggingStatLogger:
    def __init__(
        self,
        interval_s: float | None = None,
        device: str = "cpu",
        engine_index: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = log_stats_interval_s() if interval_s is None else interval_s
        if not self.interval_s > 0:
            raise ValueError(f"interval_s ({self.interval_s}) must be > 0")
        self.kv_label = "GPU KV cache usage" if device == "cuda" else "KV cache usage"
        self.engine_index = engine_index
        self.clock = clock
        self._last_t = clock()
        self._last: dict[str, float] = {}
        self.lines: int = 0  # lines logged (tests)

    def observe(self, stats: EngineStats) -> str | None:
        """After a step: log when the interval has passed; returns the line (or None)."""
        now = self.clock()
        if now - self._last_t < self.interval_s:
            return None
        return self.log(stats, now)

    def log(self, stats: EngineStats, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self._last_t, 1e-9)
        c, g = stats.counters, stats.gauges
        delta = {k: c[k] - self._last.get(k, 0.0) for k in (
            "vllm:prompt_tokens", "vllm:generation_tokens",
            "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")}
        queries = delta["vllm:prefix_cache_queries"]
        hit_rate = delta["vllm:prefix_cache_hits"] / queries if queries else 0.0
        prompt_tps = delta["vllm:prompt_tokens"] / elapsed
        gen_tps = delta["vllm:generation_tokens"] / elapsed
        line = (
            f"Engine {self.engine_index:03d}: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
            f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
            f"Running: {int(g['vllm:num_requests_running'])} reqs, "
            f"Waiting: {int(g['vllm:num_requests_waiting'])} reqs, "
            f"{self.kv_label}: {100 * g['vllm:kv_cache_usage_perc']:.1f}%, "
            f"Prefix cache hit rate: {100 * hit_rate:.1f}%"
        )
        active = prompt_tps > 0 or gen_tps > 0 or g["vllm:num_requests_running"] > 0
        logger.log(logging.INFO if active else logging.DEBUG, "%s", line)
        self.lines += 1
        self._last_t = now
        self._last = {k: c[k] for k in delta}
        return line


def preemption_warning(preempted_ids: list[str], total: int,
                       mode: str = "recompute") -> str | None:
    """The warning for a step whose preemptions bring the cumulative count to `total`: on
    the first preemption and whenever a multiple of 50 is reached; None otherwise."""
    n = len(preempted_ids)
    if n == 0:
        return None
    before = total - n
    if before > 0 and before // PREEMPTION_WARNING_EVERY == total // PREEMPTION_WARNING_EVERY:
        return None
    msg = (f"request {preempted_ids[0]} was preempted ({mode}): the KV cache ran out of "
           "blocks, which costs end-to-end latency; give the pool more memory "
           "(gpu_memory_utilization, kv_cache_memory_bytes, cpu_memory_budget_bytes or "
           "num_gpu_blocks_override) or lower max_num_seqs / max_num_batched_tokens. "
           f"total_num_cumulative_preemption={total}")
    logger.warning("%s", msg)
    return msg
