"""Quantized variants side by side: memory readout, speed and the quality gate.

    from workbench.experiments.quality import judge_variants
    cmp = compare_variants("demo", VARIANTS, concurrencies=(1, 32),
                           base_config={"dtype": "float32", "cpu_memory_budget_bytes": 96 << 20},
                           judge=judge_variants)
    cmp.side_by_side()        one row per variant: memory, quality, tok/s and TPOT per C

For each variant (engine kwargs added to `base_config`): one in-process engine (max_num_seqs =
the largest concurrency) replays the SAME seeded workload closed-loop at each concurrency
(C=1: `min_requests` requests, else `rounds` x C), after `warmup_requests` unmeasured ones;
its `memory_readout()` (weights, KV bytes, bytes per block, KV token capacity under the same
budget) is read from the running engine, and `layer_timing` times one forward of its first
MLP projection (`gate_up_proj`) at 1 and 32 tokens, the cost that dequantization adds. Then
`judge` (the quality gate's `workbench.experiments.quality.judge_variants`, passed in: a
benchmark sits below the experiments layer) judges every variant against the first one (the
reference, normally full precision): perplexity on held-out text, greedy agreement, KL and
top-1 agreement (scored by `workbench.harness.scoring`). Without a judge the quality table is
empty.

A variant the engine refuses (a knob it does not accept yet) is skipped with its error in
`skipped`, and the others still run. Each run's `valid` and `other_cpu_share` (the share of
the CPUs other processes used during it, `validity.CpuWatch`) are in `perf`; an invalid run is
logged with its reasons, and `side_by_side` leaves its tok/s and TPOT out (NaN).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch

VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},  # the model dtype (float32 on CPU): the reference
    "int8": {"quantization": "int8"},  # W8A16, per-output-channel scales
    "int4": {"quantization": "int4"},  # W4A16, groups of 128 (quantization_group_size)
    "fp8": {"quantization": "fp8"},  # W8A8 e4m3, dynamic per-token activation scales
    "fp8-kv": {"kv_cache_dtype": "fp8"},  # full-precision weights, e4m3 KV cache
}
MEMORY_COLUMNS = ("weight_bytes", "kv_bytes", "bytes_per_block", "kv_bytes_per_token",
                  "num_blocks", "kv_token_capacity", "max_concurrency",
                  "activation_peak_bytes", "reserve_bytes", "budget_bytes")
# (model folder, {label: engine config}, gate=, num_prompts=, max_tokens=, ppl_tokens=,
# context=) -> (one table row per label, {label: QualityReport}); the first config is the
# reference
QualityJudge = Callable[..., tuple[list[dict[str, Any]], dict[str, Any]]]
PERF_COLUMNS = ("output_throughput", "median_tpot_ms", "p95_tpot_ms", "median_ttft_ms",
                "mean_decode_step_ms")


@dataclass
class QuantComparison:
    perf: pd.DataFrame  # one row per (variant, concurrency)
    memory: pd.DataFrame  # one row per variant
    quality: pd.DataFrame  # one row per variant (the reference included)
    layer: pd.DataFrame  # one row per (variant, tokens): microseconds per forward
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it did not run
    reports: dict[str, Any] = field(default_factory=dict)  # variant -> QualityReport

    def side_by_side(self) -> pd.DataFrame:
        """One row per variant: weights and KV capacity, the gate's figures, and output tok/s
        and median TPOT at each concurrency (with the ratio to the reference's)."""
        out = self.memory[["variant", "weight_bytes", "kv_bytes_per_token",
                           "kv_token_capacity"]].copy()
        if not self.quality.empty:
            q = self.quality[["variant", "perplexity", "ppl_increase_pct", "mean_kl",
                              "top1_agreement", "token_agreement", "gate"]]
            out = out.merge(q, on="variant", how="left")
        ref = self.memory["variant"].iloc[0] if len(self.memory) else None
        perf = self.perf
        if "valid" in perf:  # an invalid run's speed is not reported
            perf = perf.assign(**{k: perf[k].where(perf["valid"].astype(bool))
                                  for k in ("output_throughput", "median_tpot_ms")
                                  if k in perf})
        for c in sorted(set(perf["concurrency"])):
            at = perf[perf["concurrency"] == c].set_index("variant")
            tok = at["output_throughput"]
            tpot = at["median_tpot_ms"]
            out[f"tok_s_c{c}"] = out["variant"].map(tok)
            out[f"tpot_ms_c{c}"] = out["variant"].map(tpot)
            if ref in tok.index:
                out[f"speed_vs_{ref}_c{c}"] = out["variant"].map(tok / tok[ref])
        return out


    def layer_table(self) -> pd.DataFrame:
        """Microseconds per forward of the timed layer, one row per variant (in run order),
        one column per token count, plus the ratio to the reference at each count."""
        if self.layer.empty:
            return pd.DataFrame()
        order = list(dict.fromkeys(self.layer["variant"]))
        us = self.layer.pivot(index="variant", columns="tokens", values="us_per_forward")
        us = us.reindex(order)
        out = pd.DataFrame(index=us.index)
        for t in us.columns:
            out[f"us at {t} tokens"] = us[t]
        for t in us.columns:
            out[f"x {order[0]} at {t} tokens"] = us[t] / us.loc[order[0], t]
        return out


def layer_timing(model: torch.nn.Module, tokens: tuple[int, ...] = (1, 32), reps: int = 20
                 ) -> dict[int, float]:
    """Median microseconds of one forward of the model's first `gate_up_proj` (else its
    first linear layer) on `t` tokens, for each t: dense, or dequantize + matmul."""
    from workbench.layers.linear import LinearBase

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LinearBase)]
    name, layer = next(((n, m) for n, m in layers if n.endswith("gate_up_proj")), layers[0])
    dtype = next(model.parameters()).dtype
    if not dtype.is_floating_point or dtype.itemsize < 2:
        dtype = torch.float32
    in_features = int(layer.input_size)
    out: dict[int, float] = {}
    with torch.inference_mode():
        for t in tokens:
            x = torch.randn(t, in_features, dtype=dtype)
            layer(x)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                layer(x)
                times.append(time.perf_counter() - t0)
            out[t] = statistics.median(times) * 1e6
    return out


def _decode_step_ms(step_trace: list[dict[str, Any]]) -> float:
    """Median duration of the steps that carried only decode tokens (ms)."""
    steps = [r["duration_s"] for r in step_trace
             if r.get("prefill_tokens", 0) == 0 and r.get("decode_tokens", 0) > 0]
    return statistics.median(steps) * 1e3 if steps else float("nan")


def compare_variants(
    model: str,
    variants: dict[str, dict[str, Any]] | None = None,
    concurrencies: tuple[int, ...] | list[int] = (1, 32),
    base_config: dict[str, Any] | None = None,
    *,
    workload: str = "balanced-chat",
    workload_params: dict[str, Any] | None = None,
    rounds: int = 2,
    min_requests: int = 4,
    warmup_requests: int = 2,
    seed: int = 0,
    judge: QualityJudge | None = None,
    gate: dict[str, Any] | None = None,
    quality_prompts: int = 8,
    quality_max_tokens: int = 32,
    ppl_tokens: int | None = 4096,
    ppl_context: int = 512,
    log: Any = print,
    max_other_cpu_share: float | None = None,
    cpu_watch: Any = None,
) -> QuantComparison:
    """Measure every variant (see the module docstring); the first is the quality reference.
    `max_other_cpu_share` (default validity.DEFAULT_MAX_OTHER_CPU_SHARE) and `cpu_watch`
    (default validity.default_cpu_watch()) judge each run's disturbance."""
    from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, default_cpu_watch

    threshold = (DEFAULT_MAX_OTHER_CPU_SHARE if max_other_cpu_share is None
                 else max_other_cpu_share)
    watch = cpu_watch if cpu_watch is not None else default_cpu_watch()
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.runner import run, run_sync
    from workbench.harness.targets import InProcessTarget
    from workbench.harness.workloads import make_workload
    from workbench.models.tokenizer import load_tokenizer
    from workbench.config.named_models import resolve_model

    variants = dict(VARIANTS if variants is None else variants)
    base = {"dtype": "float32", **(base_config or {})}
    folder = resolve_model(model)
    cs = sorted({int(c) for c in concurrencies})
    counts = {c: max(min_requests, rounds * c) for c in cs}
    full = make_workload(workload, seed, load_tokenizer(folder),
                         num_requests=max(counts.values()), **(workload_params or {}))
    loads = {c: replace(full, requests=full.requests[:counts[c]]) for c in cs}
    perf, memory, layer = [], [], []
    skipped: dict[str, str] = {}
    configs: dict[str, dict[str, Any]] = {}
    for label, extra in variants.items():
        config = {**base, **extra, "max_num_seqs": max(cs)}
        target = InProcessTarget(folder, config)
        try:
            for c in cs:
                t0 = time.perf_counter()
                res = run(target, loads[c], ArrivalSpec(mode="closed", concurrency=c),
                          warmup_requests=warmup_requests, max_other_cpu_share=threshold,
                          cpu_watch=watch)
                if res.error:
                    raise RuntimeError(res.error)
                m = res.metrics()
                perf.append({"variant": label, "concurrency": c, "requests": counts[c],
                             "valid": res.validity.valid,
                             "other_cpu_share": res.validity.other_cpu_share,
                             "mean_decode_step_ms": _decode_step_ms(res.step_trace),
                             **{k: m.get(k) for k in PERF_COLUMNS if k in m}})
                log(f"{label} C={c}: {m['output_throughput']:.1f} tok/s, median TPOT "
                    f"{m['median_tpot_ms']:.2f} ms ({time.perf_counter() - t0:.1f}s)")
                if not res.validity.valid:
                    log(f"INVALID {label} C={c}: " + "; ".join(res.validity.reasons))
                if c == cs[0]:
                    readout = res.target.get("memory", {})
                    memory.append({"variant": label,
                                   **{k: readout.get(k) for k in MEMORY_COLUMNS},
                                   "kv_cache_dtype": readout.get("kv_cache_dtype", "auto")})
                    assert target.engine is not None
                    for t, us in layer_timing(target.engine.model_runner.model).items():
                        layer.append({"variant": label, "tokens": t, "us_per_forward": us})
            configs[label] = config
        except Exception as e:  # noqa: BLE001 - the engine refused it: say so, go on
            skipped[label] = f"{type(e).__name__}: {e}"
            log(f"{label}: skipped ({skipped[label]})")
            perf = [r for r in perf if r["variant"] != label]
            memory = [r for r in memory if r["variant"] != label]
            layer = [r for r in layer if r["variant"] != label]
        finally:
            run_sync(target.stop)
    quality_rows: list[dict[str, Any]] = []
    reports: dict[str, Any] = {}
    if configs and judge is not None:
        t0 = time.perf_counter()
        quality_rows, reports = judge(folder, configs, gate=gate, num_prompts=quality_prompts,
                                      max_tokens=quality_max_tokens, ppl_tokens=ppl_tokens,
                                      context=ppl_context)
        log(f"quality gate against {next(iter(configs))!r}: {time.perf_counter() - t0:.1f}s")
    return QuantComparison(pd.DataFrame(perf), pd.DataFrame(memory),
                           pd.DataFrame(quality_rows), pd.DataFrame(layer), skipped, reports)
