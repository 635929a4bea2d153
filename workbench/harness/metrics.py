"""Serving-benchmark metrics with vLLM's names, units and definitions.

Place in the flow: a load generator fills one `RequestRecord` per request (client timestamps on
one `time.perf_counter` clock, relative to the run start); `compute_metrics` turns a run into
the flat dict vLLM's `vllm bench serve` saves; `records_frame` is the per-request artifact;
`summary_table` prints the dict in the order of vLLM's "Serving Benchmark Result". Every key
has a row (unit, direction, label) in `workbench.metrics.registry`; docs/metrics.md.

Definitions (checked against vllm-project/vllm `vllm/benchmarks/serve.py::calculate_metrics`
and `vllm/benchmarks/lib/endpoint_request_func.py`):

- TTFT: first streamed chunk with content minus send time, per successful request.
- TPOT: (E2EL - TTFT) / (output_tokens - 1), only for successful requests with more than one
  output token; output_tokens is the engine's count (usage), not the number of chunks.
- ITL: every gap between consecutive streamed chunks, pooled over all successful requests.
  A chunk carrying several tokens is still one gap (vLLM does not divide by chunk size).
- E2EL: end_s - start_s. vLLM's client stamps the end at the last content chunk, so set
  end_s to that arrival for exact parity; when end_s is None the last chunk is used.
- Failed requests are left out of every latency statistic and token total.
- mean / median / std (population, ddof=0) / np.percentile (linear), each scaled to ms; an
  empty list gives 0.0, as vLLM's `np.mean(x or 0)` does.
- Goodput: a successful request is good when every bound given holds with `value <= bound`;
  a request with <= 1 output token counts TPOT as 0. `request_goodput` = good / duration_s.
- Throughputs divide completed-request totals by `duration_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pandas as pd

from workbench.metrics import registry
from workbench.metrics.registry import DEFAULT_PERCENTILES, percentile_key

__all__ = ["DEFAULT_PERCENTILES", "SLO", "RequestRecord", "compute_metrics", "percentile_key",
           "records_frame", "summary_table"]

# Names, units, directions and labels live in the metric registry (workbench/metrics/registry.py).
_LATENCY_METRICS = tuple(f.name for f in registry.families("client"))
_SERVER_METRICS = tuple(f.name.removeprefix("server_") for f in registry.families("server"))


@dataclass
class RequestRecord:
    """One request as the client saw it.

    Times are seconds on one monotonic clock (time.perf_counter), relative to the run start.
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int  # from usage / the engine
    success: bool
    error: str | None = None
    target_arrival_s: float | None = None  # when the arrival process wanted it sent (relative)
    start_s: float = 0.0  # when it was actually sent (relative to run start)
    first_token_s: float | None = None  # arrival of the first streamed chunk with content
    chunk_times_s: list[float] = field(default_factory=list)  # every content chunk, first included
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each chunk
    end_s: float | None = None  # last byte / finish (relative)
    # server-side, from engine timestamps when the target exposes them (seconds), else None:
    server_queue_s: float | None = None  # arrival -> first scheduled
    server_prefill_s: float | None = None  # first scheduled -> first token
    server_decode_s: float | None = None  # first token -> finished
    server_ttft_s: float | None = None
    server_e2e_s: float | None = None
    # disaggregated decode (a decode instance that read the prompt's KV), else None
    server_kv_transfer_s: float | None = None  # the read: wire + copy into the cache
    server_kv_wait_s: float | None = None  # first scheduled -> KV in place
    server_kv_transfer_bytes: float | None = None
    # prompt tokens not computed at the first schedule (device prefix cache + a KV connector's
    # tiers): vLLM's RequestOutput.num_cached_tokens, usage.prompt_tokens_details.cached_tokens;
    # None when the target does not say
    num_cached_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        """First content chunk minus send time; None when nothing was streamed."""
        first = self.first_token_s
        if first is None and self.chunk_times_s:
            first = self.chunk_times_s[0]
        return None if first is None else first - self.start_s

    @property
    def e2e_s(self) -> float | None:
        """end_s - start_s (falls back to the last chunk's arrival when end_s is None)."""
        end = self.end_s
        if end is None and self.chunk_times_s:
            end = self.chunk_times_s[-1]
        return None if end is None else end - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output_tokens - 1); None when output_tokens <= 1 or times are missing."""
        ttft, e2e = self.ttft_s, self.e2e_s
        if self.output_tokens <= 1 or ttft is None or e2e is None:
            return None
        return (e2e - ttft) / (self.output_tokens - 1)

    @property
    def itls_s(self) -> list[float]:
        """Gaps between consecutive content chunks (one per chunk after the first)."""
        times = self.chunk_times_s
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def lateness_s(self) -> float | None:
        """How late the request was sent versus its target arrival; None without a target."""
        if self.target_arrival_s is None:
            return None
        return self.start_s - self.target_arrival_s


@dataclass
class SLO:
    """Per-request bounds in ms for vLLM's goodput.

    A request is good when every given bound holds; None means no bound on that metric.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"SLO {name} ({value}) must be >= 0 ms or None (no bound)")

    def is_set(self) -> bool:
        """True when at least one bound is given (vLLM reports goodput only then)."""
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def is_good(self, record: RequestRecord) -> bool:
        """Every given bound holds (inclusive), TPOT counted as 0 for <= 1 output token."""
        tpot = record.tpot_s if record.output_tokens > 1 else 0.0
        checks = ((self.ttft_ms, record.ttft_s), (self.tpot_ms, tpot), (self.e2el_ms, record.e2e_s))
        for bound_ms, value_s in checks:
            if bound_ms is None:
                continue
            # Compared in seconds, as vLLM does (bound / 1000 >= value), so ties match exactly.
            if value_s is None or bound_ms / 1000.0 < value_s:
                return False
        return True


def _stats_ms(
    name: str, values_s: Sequence[float], percentiles: Sequence[float]
) -> dict[str, float]:
    """mean/median/std/p<q> in ms for one metric, 0.0 for an empty list (as vLLM)."""
    arr = np.asarray(values_s, dtype=float) if len(values_s) else np.zeros(1)
    out = {
        f"mean_{name}_ms": float(np.mean(arr)) * 1000.0,
        f"median_{name}_ms": float(np.median(arr)) * 1000.0,
        f"std_{name}_ms": float(np.std(arr)) * 1000.0,
    }
    for q in percentiles:
        out[f"p{percentile_key(q)}_{name}_ms"] = float(np.percentile(arr, q)) * 1000.0
    return out


def compute_metrics(
    records: list[RequestRecord],
    duration_s: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slo: SLO | None = None,
) -> dict[str, float]:
    """The flat dict of vLLM's benchmark result for one run (latencies in ms)."""
    if duration_s <= 0:
        raise ValueError(f"duration_s ({duration_s}) must be > 0; pass the run's wall time")
    for q in percentiles:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q} must be in [0, 100]")
    ok = [r for r in records if r.success]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    metrics: dict[str, float] = {
        "duration": float(duration_s),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "error_rate": (len(records) - len(ok)) / len(records) if records else 0.0,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s,
    }
    if slo is not None and slo.is_set():
        metrics["request_goodput"] = sum(slo.is_good(r) for r in ok) / duration_s
    metrics["output_throughput"] = total_output / duration_s
    metrics["total_token_throughput"] = (total_input + total_output) / duration_s

    series: dict[str, list[float]] = {
        "ttft": [v for r in ok if (v := r.ttft_s) is not None],
        "tpot": [v for r in ok if (v := r.tpot_s) is not None],
        "itl": [gap for r in ok for gap in r.itls_s],
        "e2el": [v for r in ok if (v := r.e2e_s) is not None],
    }
    for name in _LATENCY_METRICS:
        metrics.update(_stats_ms(name, series[name], percentiles))

    for name in _SERVER_METRICS:
        values = [v for r in ok if (v := getattr(r, f"server_{name}_s")) is not None]
        if values:
            family = registry.get_family(f"server_{name}")
            stats = _stats_ms(family.name, values, registry.family_percentiles(family,
                                                                               percentiles))
            metrics.update({k: stats[k] for k in registry.expand(family, percentiles)})
    return metrics


_FRAME_COLUMNS = [f.name for f in fields(RequestRecord)] + [
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "mean_itl_ms",
    "lateness_ms",
    "num_chunks",
]


_OPTIONAL_FLOAT_FIELDS = (
    "target_arrival_s",
    "first_token_s",
    "end_s",
    *(f"server_{name}_s" for name in _SERVER_METRICS),
    "server_kv_transfer_bytes",
    "num_cached_tokens",
)


def _ms(value_s: float | None) -> float:
    return float("nan") if value_s is None else value_s * 1000.0


def records_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per request: every RequestRecord field plus derived ms columns (NaN if absent)."""
    rows = []
    for r in records:
        row = asdict(r)
        itls = r.itls_s
        row.update(
            ttft_ms=_ms(r.ttft_s),
            tpot_ms=_ms(r.tpot_s),
            e2e_ms=_ms(r.e2e_s),
            mean_itl_ms=float(np.mean(itls)) * 1000.0 if itls else float("nan"),
            lateness_ms=_ms(r.lateness_s),
            num_chunks=len(r.chunk_times_s),
        )
        rows.append(row)
    frame = pd.DataFrame(rows, columns=_FRAME_COLUMNS)
    return frame.astype({name: "float64" for name in _OPTIONAL_FLOAT_FIELDS})


def _format(name: str, value: float) -> str:
    """vLLM's formats: counts as integers, the error rate to 4 places, the rest to 2."""
    unit = registry.get(name).unit
    if unit in ("requests", "tokens"):
        return f"{int(value):d}"
    return f"{value:.4f}" if unit == "fraction" else f"{value:.2f}"


def summary_table(metrics: dict[str, float]) -> str:
    """Markdown table in the order vLLM prints "Serving Benchmark Result" (missing keys skipped)."""
    lines = ["| Serving Benchmark Result | |", "|---|---:|"]
    for row in registry.METRICS:
        if row.source == "client" and not row.is_family and row.name in metrics:
            lines.append(f"| {row.shown_label} | {_format(row.name, metrics[row.name])} |")
    for family in registry.families():
        name, short = family.name, family.abbrev
        if f"mean_{name}_ms" not in metrics:
            continue
        lines.append(f"| **{family.label}** | |")
        lines.append(f"| Mean {short} (ms) | {metrics[f'mean_{name}_ms']:.2f} |")
        lines.append(f"| Median {short} (ms) | {metrics[f'median_{name}_ms']:.2f} |")
        pct_keys = [k for k in metrics if k.startswith("p") and k.endswith(f"_{name}_ms")]
        pct_keys = [k for k in pct_keys if k[1 : -len(f"_{name}_ms")].replace(".", "").isdigit()]
        for key in sorted(pct_keys, key=lambda k: float(k[1 : -len(f"_{name}_ms")])):
            word = key[1 : -len(f"_{name}_ms")]
            lines.append(f"| P{word} {short} (ms) | {metrics[key]:.2f} |")
    return "\n".join(lines) + "\n"
