"""How four benchmark tools would report ITL and TPOT for the same client timestamps.

Place in the flow: after a run, `peer_definitions(records)` puts vLLM, GuideLLM, AIPerf and
LLMPerf side by side, so a number quoted from one tool can be compared with ours. Only
successful requests are used (each tool's headline statistics exclude errored requests).
N is `RequestRecord.output_tokens`; "first"/"last" are the first/last content-chunk arrivals;
"start" is the send time. A tool without a metric of that name gets NaN; so does an empty
series. Sources read (public code, not copied):

vLLM (vllm-project/vllm `vllm/benchmarks/serve.py::calculate_metrics`,
`vllm/benchmarks/lib/endpoint_request_func.py`):
  ITL  = every gap between consecutive content chunks, pooled over requests; the first token
         (TTFT) is excluded; a multi-token chunk is one gap.
  TPOT = per request (latency - TTFT) / (N - 1), requests with N > 1; unweighted over requests.
         Latency is the last content chunk in vLLM's client (`RequestRecord.e2e_s` here).
  Stats: np.mean / np.median / np.percentile (linear interpolation), population std.

GuideLLM (vllm-project/guidellm `src/guidellm/schemas/request_stats.py`,
`benchmark/schemas/generative/metrics.py`, `schemas/statistics.py`):
  ITL  = per request (last - first) / (N - 1) for N > 1: TTFT excluded, per-request average.
  TPOT = per request (last - start) / N: TTFT *included*, divided by N not N - 1.
  Stats: a token-weighted distribution, not per-request: ITL values weighted by N - 1, TPOT by
         N, so the mean is sum(decode time) / sum(N - 1) (resp. sum(last - start) / sum(N)).
         Median and p95 are inverse-CDF picks (first value whose cumulative weight >= q), no
         interpolation. Uncertain: older GuideLLM releases (<= 0.2) defined TPOT as
         (last - first) / N and weighted nothing; the definitions here are the current ones.

AIPerf (ai-dynamo/aiperf `src/aiperf/metrics/types/inter_token_latency_metric.py`,
`request_latency_metric.py`, `inter_chunk_latency_metric.py`, `metrics/metric_dicts.py`):
  ITL  = per request (request latency - TTFT) / (OSL - 1) for OSL >= 2, where request latency
         ends at the last content response: (last - first) / (N - 1). Numerically vLLM's TPOT.
         With `--per-chunk-usage` the divisor becomes OSL minus the first chunk's tokens; the
         default (used here) subtracts 1. Uncertain: whether OSL equals the server's usage
         count or AIPerf's own token count depends on its configuration; N is used here.
  TPOT = no metric of that name (NaN). Its pooled chunk gaps are "inter chunk latency" (ICL),
         which equals vLLM's ITL.
  Stats: unweighted over requests; linear-interpolation percentiles; population std.

LLMPerf (ray-project/llmperf `token_benchmark_ray.py`,
`src/llmperf/ray_clients/openai_chat_completions_client.py`):
  ITL  = per request sum(time_to_next_token) / N, and that list starts with TTFT, so it is
         (last - start) / N: TTFT *included*, divided by N. N = 0 gives 0.0. LLMPerf counts N
         by re-tokenizing the generated text; N from usage is used here.
  TPOT = no metric of that name (NaN).
  Stats: pandas mean and Series.quantile (linear interpolation), sample std (ddof=1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.harness.metrics import RequestRecord

PEER_TOOLS: tuple[str, ...] = ("vLLM", "GuideLLM", "AIPerf", "LLMPerf")
PEER_COLUMNS: list[str] = [
    "tool",
    "itl_mean_ms",
    "itl_median_ms",
    "itl_p95_ms",
    "tpot_mean_ms",
    "tpot_median_ms",
    "tpot_p95_ms",
    "itl_definition",
    "tpot_definition",
]
_NAN3 = (float("nan"), float("nan"), float("nan"))


def _linear_stats(values_s: Sequence[float]) -> tuple[float, float, float]:
    """(mean, median, p95) in ms, unweighted, linear-interpolation percentiles; NaN if empty."""
    if not values_s:
        return _NAN3
    arr = np.asarray(values_s, dtype=float) * 1000.0
    return float(np.mean(arr)), float(np.median(arr)), float(np.percentile(arr, 95))


def _weighted_stats(
    values_s: Sequence[float], weights: Sequence[float]
) -> tuple[float, float, float]:
    """(mean, median, p95) in ms of a weighted distribution, GuideLLM-style inverse-CDF picks."""
    vals = np.asarray(values_s, dtype=float) * 1000.0
    w = np.asarray(weights, dtype=float)
    keep = w > 0
    vals, w = vals[keep], w[keep]
    if vals.size == 0:
        return _NAN3
    order = np.argsort(vals, kind="stable")
    vals, probs = vals[order], w[order] / w.sum()
    cdf = np.cumsum(probs)

    def pick(q: float) -> float:
        idx = int(np.searchsorted(cdf, q, side="left"))
        return float(vals[min(idx, vals.size - 1)])

    return float(np.sum(vals * probs)), pick(0.5), pick(0.95)


def _first_last(r: RequestRecord) -> tuple[float | None, float | None]:
    """First and last content-chunk arrivals (first falls back to first_token_s)."""
    first = r.chunk_times_s[0] if r.chunk_times_s else r.first_token_s
    last = r.chunk_times_s[-1] if r.chunk_times_s else None
    return first, last


def _decode_avg(r: RequestRecord) -> float | None:
    """(last - first) / (N - 1): GuideLLM's and AIPerf's ITL; None when N <= 1 or no chunks."""
    first, last = _first_last(r)
    if r.output_tokens <= 1 or first is None or last is None:
        return None
    return (last - first) / (r.output_tokens - 1)


def _vllm_row(ok: list[RequestRecord]) -> list[object]:
    itl = _linear_stats([gap for r in ok for gap in r.itls_s])
    tpot = _linear_stats([v for r in ok if (v := r.tpot_s) is not None])
    return [
        "vLLM",
        *itl,
        *tpot,
        "every chunk gap, pooled; TTFT excluded",
        "(E2EL - TTFT) / (N - 1) per request, N > 1",
    ]


def _guidellm_row(ok: list[RequestRecord]) -> list[object]:
    itl_vals, itl_w, tpot_vals, tpot_w = [], [], [], []
    for r in ok:
        if (v := _decode_avg(r)) is not None:
            itl_vals.append(v)
            itl_w.append(r.output_tokens - 1)
        last = _first_last(r)[1]
        last = last if last is not None else r.end_s
        if last is not None and r.output_tokens > 0:
            tpot_vals.append((last - r.start_s) / r.output_tokens)
            tpot_w.append(r.output_tokens)
    return [
        "GuideLLM",
        *_weighted_stats(itl_vals, itl_w),
        *_weighted_stats(tpot_vals, tpot_w),
        "(last - first) / (N - 1) per request, weighted by N - 1",
        "(last - start) / N per request (TTFT included), weighted by N",
    ]


def _aiperf_row(ok: list[RequestRecord]) -> list[object]:
    itl = _linear_stats([v for r in ok if (v := _decode_avg(r)) is not None])
    return [
        "AIPerf",
        *itl,
        *_NAN3,
        "(last - first) / (N - 1) per request, N >= 2",
        "not reported (its pooled chunk gaps are ICL = vLLM ITL)",
    ]


def _llmperf_row(ok: list[RequestRecord]) -> list[object]:
    vals = []
    for r in ok:
        last = _first_last(r)[1]
        if r.output_tokens > 0 and last is not None:
            vals.append((last - r.start_s) / r.output_tokens)
        else:
            vals.append(0.0)  # LLMPerf sets ITL to 0 when it counts no output tokens
    return [
        "LLMPerf",
        *_linear_stats(vals),
        *_NAN3,
        "(last - start) / N per request (TTFT included)",
        "not reported",
    ]


def peer_definitions(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per tool: mean/median/p95 (ms) of its ITL and TPOT from the same timestamps."""
    ok = [r for r in records if r.success]
    rows = [_vllm_row(ok), _guidellm_row(ok), _aiperf_row(ok), _llmperf_row(ok)]
    return pd.DataFrame(rows, columns=PEER_COLUMNS)
