"""`/metrics`: Prometheus exposition with vLLM's metric names, labels and buckets.

Place in the flow: one `ServerMetrics` per app, its own `CollectorRegistry`. Two sources:

- Histograms observed by the server when a sequence finishes, from the engine timestamps of
  its final StreamEvent (arrival, first scheduled, first token, every token, finished):
  vllm:time_to_first_token_seconds (arrival -> first token), vllm:inter_token_latency_seconds
  (each gap between consecutive engine steps that gave the sequence tokens),
  vllm:request_time_per_output_token_seconds, vllm:e2e_request_latency_seconds,
  vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds,
  vllm:request_decode_time_seconds, vllm:request_inference_time_seconds,
  vllm:request_prompt_tokens, vllm:request_generation_tokens; per request vllm:request_params_n
  and vllm:request_params_max_tokens; per engine step vllm:iteration_tokens_total (read from the
  step trace at scrape time); vllm:request_success{finished_reason=stop|length|abort|error},
  counted per sequence ("error": the engine failed it, alone or with its whole step; aborted
  and failed sequences are counted there only, not in the latency histograms).
- The server's start-up warm-up request (see startup.py) is not counted anywhere: the engine's
  counters, step trace and prefix cache are reset after it, before the server reports ready.
- A custom collector reading `AsyncEngine.stats()` at scrape time: every `vllm:*` counter the
  engine keeps (vllm:prompt_tokens, vllm:generation_tokens, vllm:num_preemptions,
  vllm:prefix_cache_queries, vllm:prefix_cache_hits, and the vllm:spec_decode_* counters once
  the engine has them; a list value is exposed per `position` label) and the gauges
  vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc, read live
  from the scheduler between steps (`refresh()`), plus vllm:cache_config_info.

Every series carries labels model_name (the served model name) and engine ("0"). Counters are
exposed as `<name>_total`; `_created` samples are disabled as vLLM does (process-wide).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from workbench.core.request import RequestTimes
from workbench.engine.async_engine import AsyncEngine
from workbench.metrics import registry as metric_registry
from workbench.metrics.stats import FINISHED_REASONS as FINISH_REASONS

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
LABELS = ("model_name", "engine")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


class ServerMetrics:
    def __init__(self, engine: AsyncEngine, model_name: str, max_model_len: int) -> None:
        prometheus_client.disable_created_metrics()
        self.engine = engine
        self.label_values = (model_name, "0")
        self.registry = CollectorRegistry()
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self._live: dict[str, float] = {}
        self._steps_seen = 0
        tokens = build_1_2_5_buckets(max_model_len)
        h = self._histogram  # help text: the metric registry's description
        self.ttft = h("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", ITL_BUCKETS)
        self.tpot = h("vllm:request_time_per_output_token_seconds", ITL_BUCKETS)
        lat = REQUEST_LATENCY_BUCKETS
        self.e2e = h("vllm:e2e_request_latency_seconds", lat)
        self.queue = h("vllm:request_queue_time_seconds", lat)
        self.prefill = h("vllm:request_prefill_time_seconds", lat)
        self.decode = h("vllm:request_decode_time_seconds", lat)
        self.inference = h("vllm:request_inference_time_seconds", lat)
        self.prompt_tokens = h("vllm:request_prompt_tokens", tokens)
        self.generation_tokens = h("vllm:request_generation_tokens", tokens)
        self.params_n = h("vllm:request_params_n", [1, 2, 5, 10, 20])
        self.params_max_tokens = h("vllm:request_params_max_tokens", tokens)
        self.iteration_tokens = h("vllm:iteration_tokens_total", ITERATION_TOKENS_BUCKETS)
        self.registry.register(_EngineCollector(self))

    def _histogram(self, name: str, buckets: list[float] | list[int]) -> Any:
        doc = metric_registry.get(name).description
        hist = Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)
        return hist.labels(*self.label_values)

    # ------------------------------------------------------------------ observations
    def observe_request(self, n: int, max_tokens: int | None) -> None:
        self.params_n.observe(n)
        if max_tokens is not None:
            self.params_max_tokens.observe(max_tokens)

    def observe_finished(
        self, times: RequestTimes | None, num_prompt_tokens: int, num_output_tokens: int,
        finish_reason: str, first_of_request: bool = True,
    ) -> None:
        """One finished sequence; `first_of_request` counts its prompt once for n > 1."""
        self.count_finished(finish_reason)
        if times is None or finish_reason in ("abort", "error"):
            return
        t = times
        if first_of_request:
            self.prompt_tokens.observe(num_prompt_tokens)
        self.generation_tokens.observe(num_output_tokens)
        if t.finished is not None:
            self.e2e.observe(t.finished - t.arrival)
        if t.first_scheduled is not None:
            self.queue.observe(t.first_scheduled - t.arrival)
        if t.first_token is None or t.first_scheduled is None:
            return
        last = t.token_times[-1] if t.token_times else t.first_token
        self.ttft.observe(t.first_token - t.arrival)
        self.prefill.observe(t.first_token - t.first_scheduled)
        self.decode.observe(last - t.first_token)
        self.inference.observe(last - t.first_scheduled)
        if num_output_tokens > 1:
            self.tpot.observe((last - t.first_token) / (num_output_tokens - 1))
        prev = None
        for tt in t.token_times:  # one gap per engine step (tokens of one step share a time)
            if prev is not None and tt != prev:
                self.itl.observe(tt - prev)
            prev = tt

    def count_finished(self, finish_reason: str) -> None:
        key = finish_reason if finish_reason in self.success else "abort"
        self.success[key] += 1

    # ------------------------------------------------------------------ scrape
    async def refresh(self, timeout_s: float = 5.0) -> None:
        """Read the live scheduler gauges between steps, and new step-trace rows."""
        fut = self.engine.live_gauges()
        try:
            self._live = await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)
        except Exception:  # noqa: BLE001 - a timeout or a stopped engine: last-step gauges
            self._live = {}
        total, trace = self.engine.step_records()
        if total < self._steps_seen:
            self._steps_seen = 0
        new = min(total - self._steps_seen, len(trace))  # the trace is bounded
        for rec in trace[len(trace) - new:]:
            self.iteration_tokens.observe(rec.prefill_tokens + rec.decode_tokens)
        self._steps_seen = total

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Counters and gauges from AsyncEngine.stats() at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        m = self.m
        lv = list(m.label_values)
        stats: dict[str, Any] = dict(m.engine.stats())
        stats.update(m._live)
        for name, value in sorted(stats.items()):
            if not name.startswith(("vllm:", "workbench:")) or name == "vllm:request_success":
                continue
            row = metric_registry.get(name)  # help text and type: the registry's engine row
            if row.kind == "gauge":
                g = GaugeMetricFamily(name, row.description, labels=LABELS)
                g.add_metric(lv, float(value))
                yield g
            elif isinstance(value, list | tuple):
                c = CounterMetricFamily(name, row.description, labels=(*LABELS, "position"))
                for pos, v in enumerate(value):
                    c.add_metric([*lv, str(pos)], float(v))
                yield c
            else:
                c = CounterMetricFamily(name, row.description, labels=LABELS)
                c.add_metric(lv, float(value))
                yield c
        c = CounterMetricFamily("vllm:request_success",
                                metric_registry.get("vllm:request_success").description,
                                labels=(*LABELS, "finished_reason"))
        for reason, count in m.success.items():
            c.add_metric([*lv, reason], float(count))
        yield c
        cc = m.engine.config.cache_config
        info = {
            "block_size": str(cc.block_size), "num_gpu_blocks": str(m.engine.num_gpu_blocks),
            "enable_prefix_caching": str(cc.enable_prefix_caching),
            "cache_dtype": cc.kv_cache_dtype, "engine": "0",
        }
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the CacheConfig.",
                              labels=list(info))
        g.add_metric(list(info.values()), 1.0)
        yield g
