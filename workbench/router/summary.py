"""Per-replica and aggregate numbers of a run through the router, from its /metrics.

Place in the flow: the HTTP bench target scrapes the router's /metrics before and after a
run (`prom.parse`), `prom.delta` subtracts them (the bench records that delta as
`server_delta.json`), and `replica_summary(delta)` turns it into one row per replica plus an
"all" row:

    requests            attempts the router sent to the replica (router_requests_total)
    retries, failures   attempts that failed there and went elsewhere; 1 if it died
    finished            requests the replica finished (vllm:e2e_request_latency_seconds_count)
    prompt_tokens, generation_tokens
    prefix_cache_queries, prefix_cache_hits, prefix_hit_rate   (tokens; hits / queries)
    mean_ttft_ms        the replica's own mean arrival -> first token (its TTFT histogram)

Keys look like `vllm:prefix_cache_hits_total{replica="0"}` (per replica) and
`vllm:prefix_cache_hits_total` (the aggregate the router exports).
"""

from __future__ import annotations

import math
import re
from typing import Any

_KEY = re.compile(r'^(?P<name>[^{]+)(?:\{(?P<labels>.*)\})?$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
COLUMNS: dict[str, str] = {  # row field -> metric (without labels)
    "requests": "router_requests_total",
    "retries": "router_retries_total",
    "failures": "router_replica_failures_total",
    "finished": "vllm:e2e_request_latency_seconds_count",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "ttft_sum_s": "vllm:time_to_first_token_seconds_sum",
    "ttft_count": "vllm:time_to_first_token_seconds_count",
}


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """'name{a="1",b="2"}' -> ('name', {'a': '1', 'b': '2'})."""
    m = _KEY.match(key)
    if m is None:
        return key, {}
    return m.group("name"), dict(_LABEL.findall(m.group("labels") or ""))


def replica_summary(flat: dict[str, float]) -> list[dict[str, Any]]:
    """One row per replica (sorted by index) and a last row "all" (the aggregate series for
    vLLM metrics, the sum over replicas for router counters)."""
    by_metric = {v: k for k, v in COLUMNS.items()}
    rows: dict[str, dict[str, float]] = {}
    total: dict[str, float] = {}
    for key, value in flat.items():
        name, labels = split_key(key)
        field = by_metric.get(name)
        if field is None or not isinstance(value, int | float):
            continue
        replica = labels.get("replica")
        if replica is not None and set(labels) == {"replica"}:
            rows.setdefault(replica, {})[field] = float(value)
        elif not labels and name.startswith("vllm:"):
            total[field] = float(value)
    out = [_finish({"replica": r, **rows[r]}) for r in sorted(rows, key=int)]
    for field, metric in COLUMNS.items():
        if not metric.startswith("vllm:"):
            total[field] = sum(r.get(field, 0.0) for r in rows.values())
    return [*out, _finish({"replica": "all", **total})]


def _finish(row: dict[str, Any]) -> dict[str, Any]:
    queries, hits = row.get("prefix_cache_queries", 0.0), row.get("prefix_cache_hits", 0.0)
    row["prefix_hit_rate"] = hits / queries if queries else math.nan
    n = row.pop("ttft_count", 0.0)
    total_s = row.pop("ttft_sum_s", 0.0)
    row["mean_ttft_ms"] = 1000.0 * total_s / n if n else math.nan
    for field in COLUMNS:
        if field not in ("ttft_sum_s", "ttft_count"):
            row.setdefault(field, 0.0)
    return row
