"""Notebook 08's quantized variants side by side, measured through the runner: speed per
concurrency, the memory readout, and the quality gate against full precision.

    VARIANTS                          label -> the engine knob it sets ("full" sets none)
    quant_groups(variants)            the experiments the chosen variants need: each one
                                      variable against its baseline (see below)
    compare_variants(model, variants, concurrencies, base_config, ..., uri=)
                                      -> QuantComparison
    QuantComparison.side_by_side()    one row per variant: memory, quality, tok/s and TPOT
                                      per concurrency (and the ratio to the first variant's)
    QuantComparison.layer_table()     microseconds per forward of one linear layer

A template changes one knob against its baseline, so the variants form groups, each one
experiment per concurrency (experiments/quantization.yaml and kv_cache_dtype.yaml scaled
down): the weight formats (variable `quantization`, baseline full precision), an FP8 KV
cache (variable `kv_cache_dtype`, baseline full precision) and, when int4's group size is
not the default 128, int4 at that size (variable `quantization_group_size`, baseline int4 at
128: its quality row is judged against that int4, as `quality_reference` says). At each
concurrency C every run replays the same seeded workload closed-loop (C=1: `min_requests`
requests, else `rounds` x C) on a fresh engine (max_num_seqs = the largest concurrency)
after `warmup_requests` unmeasured ones; `repeats` runs per config, interleaved. The runner's
quality gate (the template's `quality_gate`: perplexity on held-out text, KL and top-1
agreement, greedy agreement, scored by `workbench.harness.scoring`) runs once per group, at
the first concurrency. The memory readout (`LLM.memory_readout()`: weights, KV bytes, bytes
per block, KV token capacity under the same budget) is each config's first run's
(summary.json), and `harness.layer_timing` times one forward of its first MLP projection at
1 and 32 tokens, the cost dequantization adds (a micro-measurement beside the runs).

A config whose every run failed (a knob the engine refuses) is in `skipped` with its error,
and the others still count. Each run's validity and other processes' CPU share are in `perf`;
`side_by_side` leaves an invalid run's tok/s and TPOT out (NaN).
"""

from __future__ import annotations

import copy
from typing import Any

from workbench.experiments.studies.measure import measure
from workbench.experiments.studies.quant_readout import (
    MEMORY_COLUMNS,
    PERF_COLUMNS,
    Measured,
    QuantComparison,
    QuantGroup,
    readout,
)

VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},  # the model dtype (float32 on CPU): the reference
    "int8": {"quantization": "int8"},  # W8A16, per-output-channel scales
    "int4": {"quantization": "int4"},  # W4A16, groups of 128 (quantization_group_size)
    "fp8": {"quantization": "fp8"},  # W8A8 e4m3, dynamic per-token activation scales
    "fp8-kv": {"kv_cache_dtype": "fp8"},  # full-precision weights, e4m3 KV cache
}
DEFAULT_INT4_GROUP_SIZE = 128


def quant_groups(variants: dict[str, dict[str, Any]]) -> list[QuantGroup]:
    """The experiments `variants` ({label: engine knobs}, `analysis.tables.variant_configs`)
    need: every label that sets one knob joins the group of that knob (baseline full
    precision); int4 with a quantization_group_size other than 128 is a group of its own
    (baseline int4 at 128). ValueError for a config no group can hold."""
    groups: dict[str, dict[str, Any]] = {}
    own: list[QuantGroup] = []
    for label, knobs in variants.items():
        if not knobs:
            continue  # full precision: every group's baseline
        size = knobs.get("quantization_group_size")
        if knobs.get("quantization") == "int4" and set(knobs) == {"quantization",
                                                                   "quantization_group_size"}:
            if size == DEFAULT_INT4_GROUP_SIZE:
                groups.setdefault("quantization", {})[label] = "int4"
            else:
                own.append(QuantGroup(f"int4-g{size}", "quantization_group_size",
                                      {label: size}, {"quantization": "int4"},
                                      f"int4 (group {DEFAULT_INT4_GROUP_SIZE})"))
            continue
        if len(knobs) != 1:
            raise ValueError(f"variant {label!r} sets {sorted(knobs)}: a variant changes one "
                             "knob against full precision")
        (knob, value), = knobs.items()
        groups.setdefault(knob, {})[label] = value
    names = {"quantization": "weights", "kv_cache_dtype": "kv-cache"}
    out = [QuantGroup(names.get(k, k), k, v) for k, v in groups.items()] + own
    if not out:
        raise ValueError(f"variants ({list(variants)}) must name at least one besides 'full'")
    return out


def quant_template(group: QuantGroup, model: str, base: dict[str, Any], concurrency: int,
                   num_requests: int, *, workload: str, workload_params: dict[str, Any],
                   seed: int, repeats: int, warmup_requests: int,
                   quality_gate: dict[str, Any] | None) -> dict[str, Any]:
    """The raw template of one group at one concurrency (see the module docstring)."""
    from workbench.analysis.notebook import raw_template

    raw = raw_template("", "quantization.yaml")
    labels = ", ".join(group.values)
    return {
        "name": f"quant-{group.name}-c{concurrency}",
        "question": (f"On {model} at concurrency {concurrency}, under one memory budget, how "
                     f"do {labels} compare with {group.reference} in output throughput and "
                     "TPOT (and, once per group, in the quality gate)?"),
        "objective": copy.deepcopy(raw["objective"]), "slo": copy.deepcopy(raw["slo"]),
        "workload": {"fixture": workload, "seed": seed,
                     "params": {**copy.deepcopy(workload_params),
                                "num_requests": num_requests}},
        "arrivals": {"mode": "closed", "concurrency": concurrency},
        "target": {"kind": "in-process", "model": model},
        "baseline": {**base, **group.baseline_extra},
        "variable": {"name": group.variable, "values": list(group.values.values())},
        "repeats": repeats, "warmup_requests": warmup_requests,
        "cache_state": raw.get("cache_state", "warm-model"),
        **({"quality_gate": quality_gate} if quality_gate else {}),
    }


def compare_variants(
    model: str, variants: dict[str, dict[str, Any]], concurrencies: list[int] | tuple[int, ...],
    base_config: dict[str, Any] | None = None, *, uri: str, workload: str = "balanced-chat",
    workload_params: dict[str, Any] | None = None, rounds: int = 2, min_requests: int = 4,
    warmup_requests: int = 2, repeats: int = 1, seed: int = 0,
    gate: dict[str, Any] | None = None, quality_prompts: int = 8,
    quality_max_tokens: int = 32, ppl_tokens: int = 4096, ppl_context: int = 512,
    progress: bool = True, layer_tokens: tuple[int, ...] = (1, 32),
) -> QuantComparison:
    """Measure every variant (see the module docstring) into the MLflow store `uri`; the
    first variant is the speed reference of `side_by_side`."""
    base = {"dtype": "float32", **(base_config or {})}
    cs = sorted({int(c) for c in concurrencies})
    base["max_num_seqs"] = max(cs)
    gate_block = {**(gate or {}), "num_prompts": quality_prompts,
                  "max_tokens": quality_max_tokens, "ppl_tokens": ppl_tokens,
                  "ppl_context": ppl_context}
    measured: list[Measured] = []
    for group in quant_groups(variants):
        for c in cs:
            n = max(min_requests, rounds * c)
            raw = quant_template(group, model, base, c, n, workload=workload,
                                 workload_params=workload_params or {}, seed=seed,
                                 repeats=repeats, warmup_requests=warmup_requests,
                                 quality_gate=gate_block if c == cs[0] else None)
            measured.append(Measured(group, c, n, measure(raw, uri, progress=progress)))
    return readout(measured, variants, base, model, uri, layer_tokens)


__all__ = ["MEMORY_COLUMNS", "PERF_COLUMNS", "VARIANTS", "QuantComparison", "QuantGroup",
           "compare_variants", "quant_groups", "quant_template"]
