"""The verdict: better / no change / worse against the baseline's noise band, and adoption.

For each variant and metric, the medians over repeats are compared. The noise band is
- "spread": the baseline repeats' range (max - min); a change counts only when the medians
  differ by more than that range;
- "bootstrap": a 95% bootstrap interval (2,000 resamples, fixed seed) of the difference of
  medians; a change counts only when the interval excludes 0.
A variant is adopted only if the objective is better beyond noise, every SLO bound holds (on
the median over its repeats), the quality gate (if any) passes, and all its runs were valid.

Invalid runs never enter the comparison: the caller passes only valid runs' metrics and counts
the rest. A run disturbed by other processes (CPU share above the threshold) says nothing
about the variant, so it is only left out; when fewer than `min_valid_repeats(repeats)` valid
runs remain on either side, the decision is "inconclusive: runs disturbed" (neither adopted
nor rejected: rerun on a quieter machine). A variant run that is invalid for another reason
(the client fell behind its schedule) rejects the variant, as before.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.experiments.labels import value_label
from workbench.experiments.template import Template
from workbench.harness import metric_registry
from workbench.harness.goodput import DIRECTIONS as GOODPUT_DIRECTIONS
from workbench.harness.metric_registry import SLO_BOUNDS

REPORTED = (
    "output_throughput", "request_throughput", "median_ttft_ms", "p95_ttft_ms",
    "median_tpot_ms", "p95_tpot_ms", "p95_itl_ms", "p95_e2el_ms", "error_rate",
    "goodput", "goodput_per_worker",  # a rate sweep's (`goodput.DIRECTIONS`)
)
MIN_VALID_REPEATS = 2  # valid runs needed per side once disturbed runs are left out


def min_valid_repeats(repeats: int) -> int:
    """Valid runs each side needs once disturbed runs are left out (never more than ran)."""
    return max(1, min(MIN_VALID_REPEATS, repeats))


def direction(metric: str) -> str:
    """"minimize" | "maximize" from the metric registry (a rate sweep's goodput numbers:
    `goodput.DIRECTIONS`); "none" for a metric with no better direction (a count such as
    `duration`) or one neither knows."""
    if metric in GOODPUT_DIRECTIONS:
        return GOODPUT_DIRECTIONS[metric]
    row = metric_registry.spec(metric)
    return "none" if row is None or row.objective is None else row.objective


@dataclass
class MetricVerdict:
    metric: str
    baseline_median: float
    variant_median: float
    delta: float
    relative_effect: float  # delta / baseline median
    noise_low: float  # the band the delta must leave to count
    noise_high: float
    verdict: str  # "better" | "no change" | "worse"; "higher" | "lower" without a direction


@dataclass
class VariantVerdict:
    variable: str
    value: Any
    metrics: dict[str, MetricVerdict]
    slo_failures: list[str] = field(default_factory=list)
    quality_failures: list[str] = field(default_factory=list)
    invalid_runs: int = 0  # invalid for a reason other than disturbance (the client fell behind)
    failed_runs: int = 0
    disturbed_runs: int = 0  # left out: other processes took too much of the CPUs
    baseline_disturbed_runs: int = 0
    valid_runs: int = 0  # the runs compared (valid, not failed)
    baseline_valid_runs: int = 0
    adopted: bool = False
    inconclusive: bool = False  # too few valid runs left: neither adopted nor rejected
    reason: str = ""

    @property
    def decision(self) -> str:
        return "ADOPT" if self.adopted else "inconclusive" if self.inconclusive else "reject"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metrics"] = {k: asdict(v) for k, v in self.metrics.items()}
        return d


def noise_band(
    base: list[float], var: list[float], method: str, seed: int = 0
) -> tuple[float, float]:
    if method == "bootstrap" and len(base) > 1 and len(var) > 1:
        rng = random.Random(seed)
        diffs = sorted(
            statistics.median(rng.choices(var, k=len(var)))
            - statistics.median(rng.choices(base, k=len(base)))
            for _ in range(2000)
        )
        return diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1]
    spread = max(base) - min(base) if base else 0.0
    delta = statistics.median(var) - statistics.median(base)
    return delta - spread, delta + spread


def compare_metric(metric: str, base: list[float], var: list[float], method: str) -> MetricVerdict:
    b, v = statistics.median(base), statistics.median(var)
    delta = v - b
    lo, hi = noise_band(base, var, method)
    beyond = lo > 0 or hi < 0  # the band around the difference excludes zero
    way = direction(metric)
    if not beyond:
        verdict = "no change"
    elif way == "none":
        verdict = "lower" if delta < 0 else "higher"
    elif (delta < 0) == (way == "minimize"):
        verdict = "better"
    else:
        verdict = "worse"
    return MetricVerdict(metric, b, v, delta, delta / b if b else 0.0, lo, hi, verdict)


def decide(
    template: Template,
    baseline_runs: list[dict[str, float]],
    variant_runs: dict[Any, list[dict[str, float]]],
    invalid: dict[Any, int] | None = None,
    failed: dict[Any, int] | None = None,
    quality: dict[Any, list[str]] | None = None,
    disturbed: dict[Any, int] | None = None,
    baseline_disturbed: int = 0,
) -> list[VariantVerdict]:
    """One VariantVerdict per variable value. `*_runs` are the per-repeat metric dicts of
    the VALID runs only; `invalid`, `failed`, `disturbed` count the others per value."""
    metrics = list(dict.fromkeys([template.objective.metric, *REPORTED]))
    out = []
    for value, runs in variant_runs.items():
        mv = {}
        for m in metrics:
            base = [r[m] for r in baseline_runs if m in r]
            var = [r[m] for r in runs if m in r]
            if base and var:
                mv[m] = compare_metric(m, base, var, template.noise)
        vv = VariantVerdict(template.variable_name, value, mv)
        for key, bound in template.slo.items():
            metric = SLO_BOUNDS[key]
            vals = [r[metric] for r in runs if metric in r]
            med = statistics.median(vals) if vals else float("inf")
            if med > bound:
                vv.slo_failures.append(f"{metric} {med:.4g} > {bound:g}")
        vv.quality_failures = list((quality or {}).get(value, []))
        vv.invalid_runs = (invalid or {}).get(value, 0)
        vv.failed_runs = (failed or {}).get(value, 0)
        vv.disturbed_runs = (disturbed or {}).get(value, 0)
        vv.baseline_disturbed_runs = baseline_disturbed
        vv.valid_runs, vv.baseline_valid_runs = len(runs), len(baseline_runs)
        vv.adopted, vv.reason = _adopt(template, vv)
        vv.inconclusive = vv.reason.startswith("inconclusive")
        out.append(vv)
    return out


def judge_runs(
    template: Template, runs: Sequence[Any], quality: dict[Any, list[str]] | None = None,
    baseline_label: str = "baseline",
) -> list[VariantVerdict]:
    """`decide` on an experiment's run records (label, value, metrics, valid, error,
    disturbed): failed and invalid runs are counted, only valid ones are compared."""
    base = [r.metrics for r in runs if r.label == baseline_label and r.error is None and r.valid]
    base_disturbed = sum(r.label == baseline_label and r.error is None and r.disturbed
                         for r in runs)
    var: dict[Any, list[dict[str, float]]] = {}
    invalid: dict[Any, int] = {}
    failed: dict[Any, int] = {}
    disturbed: dict[Any, int] = {}
    for r in runs:
        if r.label == baseline_label:
            continue
        var.setdefault(r.value, [])
        ok = r.error is None
        if ok and r.valid:
            var[r.value].append(r.metrics)
        failed[r.value] = failed.get(r.value, 0) + (not ok)
        disturbed[r.value] = disturbed.get(r.value, 0) + (ok and r.disturbed)
        invalid[r.value] = invalid.get(r.value, 0) + (ok and not r.valid and not r.disturbed)
    return decide(template, base, var, invalid, failed, quality, disturbed, base_disturbed)


def disturbance_threshold(template: Template, override: float | None = None) -> float:
    """The other-processes CPU share above which a run is invalid: `override` (the CLI's
    --max-other-cpu-share), else the template's `max_other_cpu_share`, else the default."""
    from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE

    value = override if override is not None else template.raw.get(
        "max_other_cpu_share", DEFAULT_MAX_OTHER_CPU_SHARE)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"max_other_cpu_share ({value!r}) must be a share of the machine's "
                         "CPUs in [0, 1], e.g. 0.25")
    return float(value)


def _adopt(template: Template, vv: VariantVerdict) -> tuple[bool, str]:
    if vv.failed_runs:
        return False, f"{vv.failed_runs} run(s) failed"
    if vv.invalid_runs:
        return False, f"{vv.invalid_runs} run(s) invalid (the client fell behind)"
    need = min_valid_repeats(template.repeats)
    if (vv.disturbed_runs or vv.baseline_disturbed_runs) and (
            vv.valid_runs < need or vv.baseline_valid_runs < need):
        return False, (
            f"inconclusive: runs disturbed ({vv.baseline_disturbed_runs} baseline and "
            f"{vv.disturbed_runs} variant run(s) left out: other processes took too much of "
            f"the CPUs; {vv.baseline_valid_runs} + {vv.valid_runs} valid, {need} + {need} "
            "needed); rerun on a quieter machine")
    if not vv.baseline_valid_runs:
        return False, "no valid baseline run to compare with"
    obj = vv.metrics.get(template.objective.metric)
    if obj is None:
        return False, f"objective {template.objective.metric} was not measured"
    if vv.slo_failures:
        return False, "SLO: " + "; ".join(vv.slo_failures)
    if vv.quality_failures:
        return False, "quality: " + "; ".join(vv.quality_failures)
    # Beyond noise and the way the template asks (for a registered direction this is
    # "better" when the template agrees with the registry, which validation requires).
    if obj.verdict == "no change" or not template.objective.better(obj.delta):
        return False, f"objective {obj.metric} {obj.verdict} ({obj.relative_effect:+.1%})"
    return True, f"objective {obj.metric} improves {obj.relative_effect:+.1%} beyond noise"


def verdict_table(verdicts: list[VariantVerdict], objective: str,
                  columns: Sequence[str] | None = None) -> str:
    """Markdown: one row per variant with the objective, the tails (or `columns`) and the
    decision."""
    cols = list(dict.fromkeys([objective, *(columns if columns is not None else (
        "p95_ttft_ms", "p95_tpot_ms", "p95_itl_ms", "output_throughput"))]))
    head = ["value", *cols, "decision", "why"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    values = [v.value for v in verdicts]
    for v in verdicts:
        cells = [value_label(v.variable, v.value, values)]  # never a dict's repr
        for c in cols:
            m = v.metrics.get(c)
            cells.append("-" if m is None else
                         f"{m.variant_median:.4g} ({m.relative_effect:+.1%}, {m.verdict})")
        cells += [v.decision, v.reason]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict_summary(verdicts: list[VariantVerdict], objective: str, baseline: str,
                    table_name: str = "VERDICT.md") -> str:
    """Markdown for the parent run's description, the answer first (it must read before the
    UI's "Show more" fold): the decision, then one line per variant, then where the full
    table is. `baseline` is the baseline's label ("baseline (512)")."""
    values = [v.value for v in verdicts]

    def effect(v: VariantVerdict) -> str:
        m = v.metrics.get(objective)
        return (f"{objective} not measured" if m is None else
                f"{objective} {m.relative_effect:+.1%} ({m.verdict})")

    adopted = [v for v in verdicts if v.adopted]
    if adopted:
        best = adopted[0]
        head = (f"**Verdict: adopt {value_label(best.variable, best.value, values)}**: "
                f"{effect(best)} vs {baseline}")
    elif verdicts:
        head = f"**Verdict: keep {baseline}**: no variant adopted"
    else:
        head = "**No verdict**: every baseline run failed"
    lines = [head, ""] + [f"- {value_label(v.variable, v.value, values)}: {v.decision}, "
                          f"{effect(v)}" for v in verdicts]
    return "\n".join([*lines, "", f"The full table: Artifacts, {table_name}."])
