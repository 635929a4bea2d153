"""A tiered KV cache on session traffic (notebook 11): the same workload on one engine config
per KV tier setup, repeats interleaved, read out per run and per chat turn.

    host_tier(cpu_bytes_to_use)         the OffloadingConnector's kv_transfer_config
    measure_tiers(model, kwargs, workload, arrival, configs, repeats)
                                        -> (one row per run, one row per request)
    tier_table(runs)                    one row per config: medians over its repeats
    turn_table(requests)                one row per (config, turn): TTFT and reused tokens
    tier_metrics(table, turns)          both as flat MLflow metrics
    by_turn(requests, y)                a figure: median y per turn, one bar per config

Per request, besides the client's TTFT, a `TierProbe` (an InProcessTarget) records what the
engine reused for it when it was first scheduled: `cached_tokens`, the prompt tokens it did
not compute (the engine's `num_cached_tokens`: device prefix cache + tokens loaded from the
tiers), and of those `external_tokens`, the tokens the KV connector loaded. A reload after a
preemption is not a request's reuse of earlier turns and is left out here; the run-level
read-out (`workbench.harness.cache_metrics.kv_cache_metrics` on the engine counters' delta)
counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from workbench.analysis.plots import bar_compare
from workbench.experiments.labels import metric_label
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.cache_metrics import kv_cache_metrics
from workbench.harness.metrics import records_frame
from workbench.harness.runner import RunResult, run, run_sync
from workbench.harness.targets import InProcessTarget
from workbench.harness.workloads import Workload

MB = 1e6
TIER_COLUMNS = ("p50_ttft_ms", "p95_ttft_ms", "prefix_cache_hit_rate",
                "external_prefix_cache_hit_rate", "kv_host_hit_tokens", "kv_load_mb",
                "kv_store_mb", "kv_transfer_time_share", "num_preemptions")


def host_tier(cpu_bytes_to_use: int) -> dict[str, Any]:
    """kv_transfer_config for a host-memory tier of `cpu_bytes_to_use` bytes (vLLM 0.32's
    OffloadingConnector, CPUOffloadingSpec; docs/kv_offload.md)."""
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": int(cpu_bytes_to_use)}}


class TierProbe(InProcessTarget):
    """The in-process engine, plus what it reused per request at its first schedule (see the
    module docstring): after a run, `reuse()` maps request id -> {"cached_tokens",
    "external_tokens"}. It wraps the engine's `make_request` and the connector's
    `update_state_after_alloc` (called at each allocation with the tokens to load; the first
    call is the first schedule) on the engine it builds; nothing else changes."""

    def __init__(self, model: str, engine_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(model, dict(engine_kwargs or {}))
        self._requests: dict[str, Any] = {}
        self._loaded: dict[str, int] = {}

    def _build(self) -> Any:
        ae = super()._build()
        engine = ae.engine
        make = engine.make_request

        def make_request(*args: Any, **kwargs: Any) -> Any:
            request = make(*args, **kwargs)
            self._requests[request.request_id] = request
            return request

        engine.make_request = make_request
        connector = engine.scheduler.connector
        if connector is not None:
            update = connector.update_state_after_alloc

            def update_state_after_alloc(request: Any, block_ids: Any, num_external: int) -> Any:
                self._loaded.setdefault(request.request_id, max(int(num_external), 0))
                return update(request, block_ids, num_external)

            connector.update_state_after_alloc = update_state_after_alloc
        return ae

    def reuse(self) -> dict[str, dict[str, int]]:
        return {rid: {"cached_tokens": max(r.num_cached_tokens, 0),
                      "external_tokens": self._loaded.get(rid, 0)}
                for rid, r in self._requests.items()}


def _run_row(res: RunResult, config: str, repeat: int) -> dict[str, Any]:
    engine_time_s = sum(r["duration_s"] for r in res.step_trace) or None
    kv = kv_cache_metrics(res.server_delta, engine_time_s)
    m = res.metrics()
    return {"config": config, "repeat": repeat,
            "p50_ttft_ms": m["median_ttft_ms"], "p95_ttft_ms": m["p95_ttft_ms"],
            "prefix_cache_hit_rate": kv.get("prefix_cache_hit_rate", 0.0),
            "external_prefix_cache_hit_rate": kv.get("external_prefix_cache_hit_rate", 0.0),
            "kv_host_hit_tokens": kv.get("kv_host_hit_tokens", 0.0),
            "kv_load_mb": kv.get("kv_load_bytes", 0.0) / MB,
            "kv_store_mb": kv.get("kv_store_bytes", 0.0) / MB,
            "kv_transfer_time_share": kv.get("kv_transfer_time_share", 0.0),
            "num_preemptions": kv.get("num_preemptions", 0.0),
            "completed": m["completed"], "engine_time_s": engine_time_s or 0.0,
            "duration_s": res.duration_s, "valid": res.validity.valid}


def _request_rows(res: RunResult, workload: Workload, reuse: Mapping[str, Mapping[str, int]],
                  config: str, repeat: int) -> pd.DataFrame:
    turns = {r.request_id: r for r in workload.requests}
    frame = records_frame(res.records)
    frame = frame[frame["request_id"].isin(turns)].reset_index(drop=True)
    req = [turns[rid] for rid in frame["request_id"]]
    none = {"cached_tokens": 0, "external_tokens": 0}
    return pd.DataFrame({
        "config": config, "repeat": repeat, "request_id": frame["request_id"],
        "session": [r.group for r in req], "turn": [r.turn for r in req],
        "success": frame["success"], "prompt_tokens": frame["prompt_tokens"],
        "ttft_ms": frame["ttft_ms"],
        "cached_tokens": [reuse.get(rid, none)["cached_tokens"] for rid in frame["request_id"]],
        "external_tokens": [reuse.get(rid, none)["external_tokens"]
                            for rid in frame["request_id"]],
    })


def measure_tiers(model: str | Path, engine_kwargs: Mapping[str, Any], workload: Workload,
                  arrival: ArrivalSpec, configs: Mapping[str, Mapping[str, Any] | None],
                  repeats: int = 1, **run_kw: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`workload` under each named kv_transfer_config (None: no connector), on a fresh
    engine per run, stopped after it; repeats interleaved (config A, B, A, B, ...). Returns
    one row per run (TIER_COLUMNS, completed, engine_time_s, valid) and one row per request
    (config, repeat, session, turn, ttft_ms, cached_tokens, external_tokens; the reuse at
    first schedule, see the module docstring)."""
    if repeats < 1:
        raise ValueError(f"repeats ({repeats}) must be >= 1")
    runs, requests = [], []
    for repeat in range(repeats):
        for name, kv_transfer_config in configs.items():
            target = TierProbe(str(model), {**engine_kwargs,
                                            "kv_transfer_config": kv_transfer_config})
            try:
                res = run(target, workload, arrival, **run_kw)
            finally:
                run_sync(target.stop)
            if res.error:
                raise RuntimeError(f"config {name!r}, repeat {repeat}: {res.error}")
            runs.append(_run_row(res, name, repeat))
            requests.append(_request_rows(res, workload, target.reuse(), name, repeat))
    return pd.DataFrame(runs), pd.concat(requests, ignore_index=True)


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
    and p95 TTFT, mean prompt tokens, and the mean tokens reused per request (cached: device
    prefix cache + tiers at first schedule; external: of those, loaded from the tiers)."""
    ok = requests[requests["success"].astype(bool)]
    g = ok.groupby(["config", "turn"], sort=False)
    table = g.agg(requests=("ttft_ms", "size"), median_ttft_ms=("ttft_ms", "median"),
                  p95_ttft_ms=("ttft_ms", lambda s: s.quantile(0.95)),
                  prompt_tokens=("prompt_tokens", "mean"),
                  cached_tokens=("cached_tokens", "mean"),
                  external_tokens=("external_tokens", "mean"))
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
                 "external_tokens": "loaded from the tiers (tokens)",
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
