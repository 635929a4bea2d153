"""A tiered KV cache on session traffic (notebook 11) read back: one row per run, one row per
request, and their tables per config and per chat turn.

    run_rows(result, labels)            one row per finished run of the tier experiment
                                        (TIER_COLUMNS from its metrics, completed, engine
                                        time, duration, validity)
    request_rows(result, labels, workload, uri)   one row per measured request (requests.csv):
                                        session, turn, TTFT, prompt tokens, the tokens it
                                        reused at its first schedule and whether it waited
                                        for a load from a tier
    tier_table(runs)                    one row per config: medians over its repeats
    turn_table(requests)                one row per (config, turn): TTFT and reused tokens
    tier_metrics(table, turns)          both as flat MLflow metrics
    by_turn(requests, y)                a figure: median y per turn, one bar per config

The runs are the experiment of `workbench.experiments.studies.kv_tiers` (the host tier off
vs on, repeats interleaved, a fresh engine per run). Per request, `cached_tokens` is the
engine's `num_cached_tokens`: the prompt tokens it did not compute when first scheduled
(device prefix cache + tokens loaded from the tiers; the harness records it per request),
and `kv_loaded` says the request waited for the KV connector to load blocks into the device
cache (its `server_kv_wait_s`). The run-level read-out (`workbench.harness.cache_metrics.
kv_cache_metrics` on the engine counters' delta) also counts reloads after preemptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from workbench.analysis.plots import bar_compare
from workbench.experiments.labels import metric_label
from workbench.harness.workloads import Workload

MB = 1e6
TIER_COLUMNS = ("p50_ttft_ms", "p95_ttft_ms", "prefix_cache_hit_rate",
                "external_prefix_cache_hit_rate", "kv_host_hit_tokens", "kv_load_mb",
                "kv_store_mb", "kv_transfer_time_share", "num_preemptions")


def _label(labels: Mapping[str, Any], value: Any) -> str:
    """The config label of a run's variable value (None: the baseline's)."""
    return next(k for k, v in labels.items() if (v is None and value is None) or v == value)


def run_rows(result: Any, labels: Mapping[str, Any]) -> pd.DataFrame:
    """One row per finished run of `result` (an ExperimentResult of the tier experiment),
    labelled by `labels` ({config label: kv_transfer_config}, None for the baseline)."""
    rows = []
    for r in result.runs:
        if r.error is not None:
            continue
        m = r.metrics
        rows.append({"config": _label(labels, r.value), "repeat": r.repeat,
                     "p50_ttft_ms": m["median_ttft_ms"], "p95_ttft_ms": m["p95_ttft_ms"],
                     "prefix_cache_hit_rate": m.get("prefix_cache_hit_rate", 0.0),
                     "external_prefix_cache_hit_rate":
                         m.get("external_prefix_cache_hit_rate", 0.0),
                     "kv_host_hit_tokens": m.get("kv_host_hit_tokens", 0.0),
                     "kv_load_mb": m.get("kv_load_bytes", 0.0) / MB,
                     "kv_store_mb": m.get("kv_store_bytes", 0.0) / MB,
                     "kv_transfer_time_share": m.get("kv_transfer_time_share", 0.0),
                     "num_preemptions": m.get("num_preemptions", 0.0),
                     "completed": m["completed"], "engine_time_s": m.get("engine_time_s", 0.0),
                     "duration_s": m["duration"], "valid": r.valid})
    return pd.DataFrame(rows)


def request_rows(result: Any, labels: Mapping[str, Any], workload: Workload, uri: str
                 ) -> pd.DataFrame:
    """One row per measured request of every finished run (its requests.csv): config,
    repeat, request_id, session, turn, success, prompt_tokens, ttft_ms, cached_tokens (the
    engine's num_cached_tokens; 0 when not reported) and kv_loaded."""
    from workbench.analysis.frames import run_artifact_frame

    turns = {r.request_id: r for r in workload.requests}
    frames = []
    for r in result.runs:
        if r.error is not None:
            continue
        frame = run_artifact_frame(r.run_id, "requests.csv", uri)
        frame = frame[frame["request_id"].isin(turns)].reset_index(drop=True)
        req = [turns[rid] for rid in frame["request_id"]]
        frames.append(pd.DataFrame({
            "config": _label(labels, r.value), "repeat": r.repeat,
            "request_id": frame["request_id"], "session": [q.group for q in req],
            "turn": [q.turn for q in req], "success": frame["success"].astype(bool),
            "prompt_tokens": frame["prompt_tokens"], "ttft_ms": frame["ttft_ms"],
            "cached_tokens": frame["num_cached_tokens"].fillna(0).astype(int),
            "kv_loaded": frame["server_kv_wait_s"].notna(),
        }))
    return pd.concat(frames, ignore_index=True)


def tier_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per config (in the order measured): the number of repeats and of valid ones
    (the CPUs undisturbed), then the median of each TIER_COLUMNS number over the repeats."""
    g = runs.groupby("config", sort=False)
    table = g[list(TIER_COLUMNS)].median()
    table.insert(0, "valid_repeats", g["valid"].sum().astype(int))
    table.insert(0, "repeats", g.size())
    return table.reset_index()


def turn_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (config, turn) over every repeat's successful requests: how many, median
    and p95 TTFT, mean prompt tokens, the mean tokens reused per request (cached: device
    prefix cache + tiers at first schedule) and the share that loaded KV from a tier."""
    ok = requests[requests["success"].astype(bool)]
    g = ok.groupby(["config", "turn"], sort=False)
    table = g.agg(requests=("ttft_ms", "size"), median_ttft_ms=("ttft_ms", "median"),
                  p95_ttft_ms=("ttft_ms", lambda s: s.quantile(0.95)),
                  prompt_tokens=("prompt_tokens", "mean"),
                  cached_tokens=("cached_tokens", "mean"),
                  loaded_share=("kv_loaded", "mean"))
    order = {c: i for i, c in enumerate(dict.fromkeys(requests["config"]))}
    table = table.reset_index()
    rank = table["config"].map(order)
    return table.assign(_rank=rank).sort_values(["_rank", "turn"]).drop(columns="_rank") \
        .reset_index(drop=True)


def tier_metrics(table: pd.DataFrame, turns: pd.DataFrame) -> dict[str, float]:
    """MLflow metrics, keyed by the config's label: each TIER_COLUMNS number of `tier_table`
    (`host_tier.p95_ttft_ms`) and the median TTFT per turn of `turn_table`
    (`host_tier.turn2.median_ttft_ms`)."""
    out = {}
    for _, row in table.iterrows():
        key = metric_label(str(row["config"]))
        out.update({f"{key}.{c}": float(row[c]) for c in TIER_COLUMNS})
    for _, row in turns.iterrows():
        key = metric_label(str(row["config"]))
        out[f"{key}.turn{int(row['turn'])}.median_ttft_ms"] = float(row["median_ttft_ms"])
    return out


TOKEN_COLUMNS = {"cached_tokens": "reused prompt (tokens)",
                 "prompt_tokens": "prompt (tokens)"}


def by_turn(requests: pd.DataFrame, y: str = "ttft_ms", *, title: str | None = None
            ) -> Figure | None:
    """Median `y` over the successful requests of each turn (every repeat), one bar per
    config (`plots.bar_compare`); token columns get a label with their unit. None when no
    request succeeded."""
    ok = requests[requests["success"].astype(bool)] if len(requests) else requests
    fig = bar_compare(ok, x="turn", y=y, hue="config", title=title)
    if fig is not None and y in TOKEN_COLUMNS:
        fig.axes[0].set_ylabel(TOKEN_COLUMNS[y])
    return fig
