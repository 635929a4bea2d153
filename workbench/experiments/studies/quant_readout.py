"""Notebook 08's experiments read back into one comparison (`quantization` runs them).

    QuantGroup       one experiment's variants: {label: value} of one variable against a
                     baseline (labelled `reference`)
    Measured         one group's ExperimentResult at one concurrency
    readout(measured, variants, base, model, uri)  -> QuantComparison: perf (one row per
                     variant, concurrency and repeat), memory (each variant's first run's
                     `memory_readout`, summary.json), quality (the runner's quality gate,
                     quality.json: each variant against its group's reference), layer
                     (`harness.layer_timing` per variant), skipped (every run failed)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from workbench.experiments.runner import ExperimentResult

MEMORY_COLUMNS = ("weight_bytes", "kv_bytes", "bytes_per_block", "kv_bytes_per_token",
                  "num_blocks", "kv_token_capacity", "max_concurrency",
                  "activation_peak_bytes", "reserve_bytes", "budget_bytes")
PERF_COLUMNS = ("output_throughput", "median_tpot_ms", "p95_tpot_ms", "median_ttft_ms",
                "mean_decode_step_ms")
QUALITY_KEYS = ("perplexity", "ppl_increase_pct", "mean_kl", "max_kl", "top1_agreement",
                "text_top1_agreement", "token_agreement", "identical_sequences",
                "first_divergence")


@dataclass(frozen=True)
class QuantGroup:
    """One experiment's worth of variants: `values` ({label: value of `variable`}) against
    the baseline `baseline_extra` (engine knobs over the base config), labelled
    `reference`."""

    name: str
    variable: str
    values: dict[str, Any]
    baseline_extra: dict[str, Any] = field(default_factory=dict)
    reference: str = "full"


@dataclass(frozen=True)
class Measured:
    """One group's experiment at one concurrency (`num_requests` requests per run)."""

    group: QuantGroup
    concurrency: int
    num_requests: int
    result: ExperimentResult


@dataclass
class QuantComparison:
    perf: pd.DataFrame  # one row per (variant, concurrency, repeat)
    memory: pd.DataFrame  # one row per variant
    quality: pd.DataFrame  # one row per variant (the reference included)
    layer: pd.DataFrame  # one row per (variant, tokens): microseconds per forward
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it did not run
    results: list[ExperimentResult] = field(default_factory=list)  # every experiment run

    def side_by_side(self) -> pd.DataFrame:
        """One row per variant: weights and KV capacity, the gate's figures, and output tok/s
        and median TPOT at each concurrency (medians over valid repeats, with the ratio to the
        first variant's)."""
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
            at = perf[perf["concurrency"] == c].groupby("variant", sort=False)
            tok = at["output_throughput"].median()
            tpot = at["median_tpot_ms"].median()
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
        if "valid" in self.layer:  # one CPU watch per variant: its timings share it
            judged = self.layer.groupby("variant", sort=False)
            out["other_cpu_share"] = judged["other_cpu_share"].first()
            out["valid"] = judged["valid"].all()
        return out




def readout(measured: list[Measured], variants: Mapping[str, Mapping[str, Any]],
            base: Mapping[str, Any], model: str, uri: str,
            layer_tokens: tuple[int, ...] = (1, 32)) -> QuantComparison:
    """The comparison of the chosen `variants` (in their order) from every experiment."""
    from workbench.config.named_models import resolve_model

    labels = list(variants)
    perf: list[dict[str, Any]] = []
    memory: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    shown_reference: set[tuple[str, int]] = set()  # (reference label, concurrency)
    first_c = min(m.concurrency for m in measured)
    for m in measured:
        for r in m.result.runs:
            label = _label(m.group, r.value)
            if label not in labels:
                continue
            if r.value is None and (label, m.concurrency) in shown_reference:
                continue  # full precision: the first group's baseline runs only
            if r.error is not None:
                errors.setdefault(label, r.error)
                continue
            perf.append({"variant": label, "concurrency": m.concurrency, "repeat": r.repeat,
                         "requests": m.num_requests, "valid": r.valid,
                         "other_cpu_share": r.other_cpu_share,
                         "mean_decode_step_ms": _decode_step_ms(r.run_id, uri),
                         **{k: r.metrics.get(k) for k in PERF_COLUMNS if k in r.metrics}})
            if m.concurrency == first_c and label not in memory:
                memory[label] = _memory(r.run_id, uri, label)
        if any(r.value is None for r in m.result.runs):
            shown_reference.add((m.group.reference, m.concurrency))
    ran = {row["variant"] for row in perf}
    skipped = {label: errors[label] for label in labels if label not in ran and label in errors}
    order = {label: i for i, label in enumerate(labels)}
    perf.sort(key=lambda row: (order[row["variant"]], row["concurrency"], row["repeat"]))
    quality = _quality(measured, labels, first_c, uri)
    folder = str(resolve_model(model))
    layer = [row for label in labels if label in ran
             for row in _layer(label, folder, {**base, **variants[label]}, layer_tokens)]
    return QuantComparison(
        pd.DataFrame(perf), pd.DataFrame([memory[k] for k in labels if k in memory]),
        quality[quality["variant"].isin(list(ran))].reset_index(drop=True)
        if len(quality) else quality,
        pd.DataFrame(layer), skipped, [m.result for m in measured])


def _label(group: QuantGroup, value: Any) -> str:
    if value is None:
        return group.reference
    return next(k for k, v in group.values.items() if v == value)


def _decode_step_ms(run_id: str, uri: str) -> float:
    """Median duration of the run's steps that carried only decode tokens (ms)."""
    from workbench.analysis.frames import run_artifact_frame

    trace = run_artifact_frame(run_id, "step_trace.csv", uri)
    steps = trace[(trace["prefill_tokens"] == 0) & (trace["decode_tokens"] > 0)]
    return float(steps["duration_s"].median() * 1e3) if len(steps) else float("nan")


def _memory(run_id: str, uri: str, label: str) -> dict[str, Any]:
    from workbench.analysis.artifacts import run_artifact_json

    readout = (run_artifact_json(run_id, "summary.json", uri).get("target") or {}).get(
        "memory", {})
    return {"variant": label, **{k: readout.get(k) for k in MEMORY_COLUMNS},
            "kv_cache_dtype": readout.get("kv_cache_dtype", "auto")}


def _quality(measured: list[Measured], labels: list[str], first_c: int, uri: str
             ) -> pd.DataFrame:
    """One row per judged variant (and its group's reference when chosen): the gate's
    figures, "pass" / "FAIL" with the reasons, and the reference it was judged against."""
    from workbench.analysis.artifacts import run_artifact_json
    from workbench.experiments.quality_report import QualityReport

    rows: list[dict[str, Any]] = []
    fields = set(QualityReport.__dataclass_fields__)
    for m in measured:
        if m.concurrency != first_c or not any(r.value is None for r in m.result.runs):
            continue
        try:
            judged = run_artifact_json(m.result.parent_run_id, "quality.json", uri)
        except Exception:  # noqa: BLE001 - no gate logged (the template had none)
            continue
        for label, value in m.group.values.items():
            entry = judged["variants"].get(str(value), {})
            failures, report = entry.get("failures", []), entry.get("report")
            rep = QualityReport(**{k: v for k, v in report.items() if k in fields}) \
                if report else None
            if rep is not None and m.group.reference in labels and not any(
                    row["variant"] == m.group.reference for row in rows):
                rows.append(_reference_row(rep, m.group.reference))
            rows.append({"variant": label, **(rep.row() if rep else {}),
                         "quality_reference": m.group.reference,
                         "gate": "FAIL" if failures else "pass",
                         "gate_reasons": "; ".join(failures)})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    order = {label: i for i, label in enumerate(labels)}
    rank = frame["variant"].map(lambda v: order.get(v, len(order)))
    return frame.assign(_rank=rank).sort_values("_rank", kind="stable").drop(
        columns="_rank").reset_index(drop=True)


def _reference_row(rep: Any, reference: str) -> dict[str, Any]:
    """The reference against itself: its own perplexity, no divergence by definition."""
    n = rep.num_prompts
    return {"variant": reference, "perplexity": rep.reference_perplexity,
            "ppl_increase_pct": 0.0 if rep.reference_perplexity is not None else None,
            "mean_kl": 0.0 if rep.mean_kl is not None else None,
            "max_kl": 0.0 if rep.max_kl is not None else None,
            "top1_agreement": 1.0 if rep.top1_agreement is not None else None,
            "text_top1_agreement": 1.0 if rep.text_top1_agreement is not None else None,
            "token_agreement": 1.0, "identical_sequences": f"{n}/{n}",
            "first_divergence": [None] * n, "quality_reference": reference,
            "gate": "reference", "gate_reasons": ""}


def _layer(label: str, folder: str, config: dict[str, Any], tokens: tuple[int, ...]
           ) -> list[dict[str, Any]]:
    """One row per token count: the variant's layer timing, watched and judged as a run is
    (`harness.watched`): a disturbed timing is kept and marked valid=False."""
    from workbench.harness.layer_timing import engine_layer_timing
    from workbench.harness.watched import watched

    us, validity = watched(lambda: engine_layer_timing(folder, config, tokens),
                           f"layer timing of {label}")
    return [{"variant": label, "tokens": t, "us_per_forward": v,
             "other_cpu_share": validity.other_cpu_share, "valid": validity.valid}
            for t, v in us.items()]
