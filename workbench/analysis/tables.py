"""Tables and headline metrics the notebooks show: plain pandas over results already in hand.

Nothing here runs an engine or a benchmark (see `measure` for that); every function turns
outputs, readouts or result frames into one DataFrame or one flat {name: float} dict, so a
notebook cell stays one call.

    generation_frame(outputs)               LLM.generate outputs -> one row per request
    memory_check(budget, readout)           calc.memory_budget vs engine.memory_readout
    budget_parts(budget, label)             the weights / KV / activations / headroom split
    capacity_grid(...)                      calc.memory_budget over block sizes x max_model_len
    row_metrics(frame, key, columns)        {"<key value>_<column>": value} per row, NaN skipped
    group_medians(frame, by, columns)       {"<group>_<column>": median} per group
    layout_metrics(layouts, latency, comm)  09's headline numbers (replicas vs TP=2)
    skipped_note(skipped)                   markdown list of the configs an engine refused
    variant_configs(names, int4_group_size) the engine configs of studies.quantization's variants
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from workbench.planning import memory_budget

MiB = 1 << 20
CAPACITY_COLUMNS = ("kv_num_blocks", "kv_token_capacity", "max_concurrency")


def generation_frame(outputs: Iterable[Any], text_chars: int = 50) -> pd.DataFrame:
    """One row per `RequestOutput`: prompt and output lengths, finish reason, cached prompt
    tokens, TTFT and the first `text_chars` characters of the text."""
    return pd.DataFrame([{
        "prompt_tokens": len(o.prompt_token_ids),
        "output_tokens": len(o.outputs[0].token_ids),
        "finish_reason": o.outputs[0].finish_reason,
        "cached_tokens": o.metrics.num_cached_tokens,
        "ttft_s": o.metrics.time_to_first_token_s,
        "text": o.outputs[0].text[:text_chars],
    } for o in outputs])


def memory_check(budget: Mapping[str, Any], readout: Mapping[str, Any]) -> pd.DataFrame:
    """calc.memory_budget's arithmetic beside the engine's readout, one row per quantity."""
    rows = {"weight_bytes": ("weight_bytes", "weight_bytes"),
            "kv blocks": ("kv_num_blocks", "num_blocks"),
            "kv_token_capacity": ("kv_token_capacity", "kv_token_capacity"),
            "max_concurrency": ("max_concurrency", "max_concurrency")}
    return pd.DataFrame({
        "calc.memory_budget": [budget[calc] for calc, _ in rows.values()],
        "engine.memory_readout": [readout[engine] for _, engine in rows.values()],
    }, index=list(rows))


def budget_parts(budget: Mapping[str, Any], label: str) -> pd.DataFrame:
    """One row (`label`) of the byte split `memory_split` draws."""
    return pd.DataFrame({
        "weights": [budget["weight_bytes"]], "KV cache": [budget["kv_cache_bytes"]],
        "activations": [budget["activation_bytes"]], "headroom": [budget["headroom_bytes"]],
    }, index=[label])


def capacity_grid(available_bytes: int, weight_bytes: int, kv_bytes_per_token: int,
                  block_sizes: Sequence[int], max_model_lens: Sequence[int], *,
                  activation_bytes: int = 0, headroom_bytes: int = 0) -> pd.DataFrame:
    """calc.memory_budget for every (block_size, max_model_len): KV blocks, KV token capacity
    and max concurrency at max_model_len, one row each."""
    rows = []
    for bs in block_sizes:
        for mml in max_model_lens:
            b = memory_budget(available_bytes, weight_bytes, kv_bytes_per_token, bs,
                              activation_bytes=activation_bytes, headroom_bytes=headroom_bytes,
                              max_model_len=mml)
            rows.append({"block_size": bs, "max_model_len": mml,
                         **{k: b[k] for k in CAPACITY_COLUMNS}})
    return pd.DataFrame(rows)


def row_metrics(frame: pd.DataFrame, key: str, columns: Iterable[str], sep: str = "_"
                ) -> dict[str, float]:
    """{f"{row[key]}{sep}{column}": float} for every row and every column it has, skipping
    missing columns and NaN values (a metric MLflow can log)."""
    columns = list(columns)
    out: dict[str, float] = {}
    for _, row in frame.iterrows():
        for col in columns:
            value = row.get(col)
            if value is not None and pd.notna(value):
                out[f"{row[key]}{sep}{col}"] = float(value)
    return out


def group_medians(frame: pd.DataFrame, by: str, columns: Iterable[str],
                  names: Mapping[Any, str] | None = None) -> dict[str, float]:
    """{f"{group}_{column}": median of the column in the group}; `names` renames groups
    (groups it does not name keep their value)."""
    names = names or {}
    return {f"{names.get(g, g)}_{col}": float(rows[col].median())
            for g, rows in frame.groupby(by, sort=False) for col in columns}


def layout_metrics(layouts: pd.DataFrame, latency: pd.DataFrame, comm: pd.DataFrame,
                   throughput_1: float, names: Mapping[str, str]) -> dict[str, float]:
    """09's headline numbers: one worker's throughput, and per named layout (`names`: layout
    -> metric prefix, e.g. {"1 replica, TP=2": "tp2"}) the median throughput, p95 TTFT / TPOT
    and scaling efficiency, the concurrency-1 median TPOT when `latency` has rows, and the
    1-token all-reduce median (and whether its CPU watch found it undisturbed) when `comm`
    has rows."""
    metrics = {"throughput_1": float(throughput_1)}
    named = layouts[layouts["layout"].isin(list(names))]
    metrics.update(group_medians(named, "layout", ("output_throughput", "p95_ttft_ms",
                                                   "p95_tpot_ms", "scaling_efficiency"), names))
    if len(latency):
        c1 = latency[latency["layout"].isin(list(names))]
        metrics.update({f"{names[lay]}_c1_median_tpot_ms": float(t)
                        for lay, t in zip(c1["layout"], c1["median_tpot_ms"], strict=True)})
    if len(comm):
        metrics["allreduce_median_us_1_token"] = float(comm["median_us"].iloc[0])
        if "valid" in comm:  # judged as a run is (harness.watched): 1.0 valid, 0.0 disturbed
            metrics["allreduce_valid"] = float(bool(comm["valid"].all()))
    return metrics


def skipped_note(skipped: Mapping[str, str]) -> str:
    """Markdown: the configs the engine refused and why ("" when none)."""
    if not skipped:
        return ""
    return "**Skipped** (the engine refused the config):\n\n" + "\n".join(
        f"- `{k}`: {v}" for k, v in skipped.items())


def variant_configs(names: Iterable[str], int4_group_size: int | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Copies of `studies.quantization.VARIANTS[name]` for each name, int4's
    quantization_group_size set to `int4_group_size` when given."""
    from workbench.experiments.studies.quantization import VARIANTS

    names = list(names)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"variants {unknown} must be among {sorted(VARIANTS)}")
    chosen = {n: dict(VARIANTS[n]) for n in names}
    if int4_group_size is not None and "int4" in chosen:
        chosen["int4"]["quantization_group_size"] = int4_group_size
    return chosen
