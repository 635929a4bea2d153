"""Runs through `workbench router` read back: per replica, per layout, per routing policy.

Place in the flow: the HTTP bench target scrapes the router's /metrics before and after a
run (`prom.parse`), `prom.delta` subtracts them (the runner logs that delta as
`server_delta.json`), and `replica_summary(delta)` turns it into one row per replica plus an
"all" row:

    requests            attempts the router sent to the replica (router_requests_total)
    retries, failures   attempts that failed there and went elsewhere; 1 if it died
    finished            requests the replica finished (vllm:e2e_request_latency_seconds_count)
    prompt_tokens, generation_tokens
    prefix_cache_queries, prefix_cache_hits, prefix_hit_rate   (tokens; hits / queries)
    mean_ttft_ms        the replica's own mean arrival -> first token (its TTFT histogram)

Keys look like `vllm:prefix_cache_hits_total{replica="0"}` (per replica) and
`vllm:prefix_cache_hits_total` (the aggregate the router exports). Over logged experiments
(notebooks 09 and 10; the experiments themselves: `workbench.experiments.studies.layouts`):

    run_replica_summary(run_id, uri)     replica_summary of one logged run
    layout_names(w)                      {tp: "w replicas (TP=1)" | "1 replica, TP=w"}
    layout_row(name, metrics, valid, w, throughput_1)
                                         a run's throughput, TTFT/TPOT tails and scaling
                                         efficiency against one worker
    policy_tables(result, baseline_policy, uri)   per run and per replica: TTFT, hit rate
    scaling_row(result, n)               1 replica vs n of a num_replicas experiment:
                                         throughputs, p95 TTFT, validity, scaling efficiency
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench.analysis.artifacts import run_delta
from workbench.planning import scaling_efficiency

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


def run_replica_summary(run_id: str, uri: str) -> list[dict[str, Any]]:
    """`replica_summary` of the /metrics delta an HTTP run logged (server_delta.json)."""
    return replica_summary(run_delta(run_id, uri))


LAYOUT_METRICS = ("output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
                  "median_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "completed")


def layout_names(num_workers: int) -> dict[int, str]:
    """The layouts of `num_workers` workers by tensor_parallel_size: all replicas (TP=1) or
    one replica of every worker (TP=num_workers)."""
    return {1: f"{num_workers} replicas (TP=1)", num_workers: f"1 replica, TP={num_workers}"}


def layout_row(layout: str, metrics: Mapping[str, float], valid: bool, num_workers: int,
               throughput_1: float | None = None) -> dict[str, Any]:
    """A table row: LAYOUT_METRICS of one run's metrics (`RunResult.metrics()`, or a logged
    experiment run's), its validity, and scaling_efficiency against `throughput_1` (one
    worker's output throughput on the same traffic; NaN when not given)."""
    missing = [k for k in LAYOUT_METRICS if k not in metrics]
    if missing:
        raise ValueError(f"metrics lack {', '.join(missing)}; measure percentiles 50, 95, 99")
    row: dict[str, Any] = {"layout": layout, "num_workers": num_workers}
    row.update({k: float(metrics[k]) for k in LAYOUT_METRICS})
    row["valid"] = bool(valid)
    row["scaling_efficiency"] = (
        scaling_efficiency(row["output_throughput"], throughput_1, num_workers)
        if throughput_1 else float("nan"))
    return row


def _finished(result: Any) -> list[Any]:
    """The runs of an ExperimentResult that finished; a failed one is printed and left out."""
    runs = []
    for r in result.runs:
        if r.error:
            print(f"{r.label} repeat {r.repeat} failed: {r.error}")
            continue
        runs.append(r)
    return runs


def policy_tables(result: Any, baseline_policy: str, uri: str
                  ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame]]:
    """Per logged run of a routing-policy experiment: client TTFT and throughput with the
    aggregate prefix-cache hit rate and server TTFT its replicas reported; per replica, the
    `replica_summary` rows; and each run's per-request frame keyed "<policy>, repeat <i>".
    Failed runs are printed and left out."""
    from workbench.analysis.frames import run_artifact_frame

    rows, replica_rows, requests = [], [], {}
    for r in _finished(result):
        policy = baseline_policy if r.value is None else r.value
        summary = run_replica_summary(r.run_id, uri)
        total = summary[-1]
        rows.append({"policy": policy, "repeat": r.repeat,
                     **{k: r.metrics[k] for k in ("median_ttft_ms", "p95_ttft_ms",
                                                  "output_throughput")},
                     "prefix_hit_rate": total["prefix_hit_rate"],
                     "server_mean_ttft_ms": total["mean_ttft_ms"], "valid": r.valid})
        replica_rows += [{"policy": policy, "repeat": r.repeat, **row} for row in summary]
        requests[f"{policy}, repeat {r.repeat}"] = run_artifact_frame(r.run_id, "requests.csv",
                                                                      uri)
    return pd.DataFrame(rows), pd.DataFrame(replica_rows), requests


def scaling_row(result: Any, num_replicas: int) -> dict[str, Any]:
    """1 replica (the baseline) against `num_replicas` (the variant) of a num_replicas
    experiment: the median output throughput and p95 TTFT of each side's finished runs, each
    side's validity (every run valid) and scaling_efficiency(throughput_n, throughput_1, n)."""
    if num_replicas < 2:
        raise ValueError(f"num_replicas ({num_replicas}) must be >= 2 to compare with 1")
    out: dict[str, Any] = {"num_replicas": num_replicas}
    runs = _finished(result)
    for n, key, side in ((1, "throughput_1", None), (num_replicas, "throughput_n", "variant")):
        mine = [r for r in runs if (r.value is None) == (side is None)]
        if not mine:
            raise RuntimeError(f"every {n}-replica run failed: no scaling figure")
        out[key] = statistics.median(r.metrics["output_throughput"] for r in mine)
        out[f"p95_ttft_ms_{n}"] = statistics.median(r.metrics["p95_ttft_ms"] for r in mine)
        out[f"valid_{n}"] = all(r.valid for r in mine)
    out["scaling_efficiency"] = scaling_efficiency(out["throughput_n"], out["throughput_1"],
                                                   num_replicas)
    return out
