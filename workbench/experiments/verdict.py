"""The verdict: better / no change / worse against the baseline's noise band, and adoption.

For each variant and metric, the medians over repeats are compared. The noise band is
- "spread": the baseline repeats' range (max - min); a change counts only when the medians
  differ by more than that range;
- "bootstrap": a 95% bootstrap interval (2,000 resamples, fixed seed) of the difference of
  medians; a change counts only when the interval excludes 0.
A variant is adopted only if the objective is better beyond noise, every SLO bound holds (on
the median over its repeats), the quality gate (if any) passes, and all its runs were valid.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.experiments.template import Template

DIRECTIONS: dict[str, str] = {
    "output_throughput": "maximize",
    "total_token_throughput": "maximize",
    "request_throughput": "maximize",
    "request_goodput": "maximize",
    "error_rate": "minimize",
}
REPORTED = (
    "output_throughput", "request_throughput", "median_ttft_ms", "p95_ttft_ms",
    "median_tpot_ms", "p95_tpot_ms", "p95_itl_ms", "p95_e2el_ms", "error_rate",
)
_SLO_METRIC = {
    "p95_ttft_ms": "p95_ttft_ms", "p95_tpot_ms": "p95_tpot_ms", "p95_itl_ms": "p95_itl_ms",
    "p95_e2el_ms": "p95_e2el_ms", "max_error_rate": "error_rate",
}


def direction(metric: str) -> str:
    """Latencies (…_ms) are minimized, throughputs maximized."""
    return DIRECTIONS.get(metric, "minimize" if metric.endswith("_ms") else "maximize")


@dataclass
class MetricVerdict:
    metric: str
    baseline_median: float
    variant_median: float
    delta: float
    relative_effect: float  # delta / baseline median
    noise_low: float  # the band the delta must leave to count
    noise_high: float
    verdict: str  # "better" | "no change" | "worse"


@dataclass
class VariantVerdict:
    variable: str
    value: Any
    metrics: dict[str, MetricVerdict]
    slo_failures: list[str] = field(default_factory=list)
    quality_failures: list[str] = field(default_factory=list)
    invalid_runs: int = 0
    failed_runs: int = 0
    adopted: bool = False
    reason: str = ""

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
    if not beyond:
        verdict = "no change"
    elif (delta < 0) == (direction(metric) == "minimize"):
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
) -> list[VariantVerdict]:
    """One VariantVerdict per variable value. `*_runs` are the per-repeat metric dicts."""
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
            metric = _SLO_METRIC[key]
            vals = [r[metric] for r in runs if metric in r]
            med = statistics.median(vals) if vals else float("inf")
            if med > bound:
                vv.slo_failures.append(f"{metric} {med:.4g} > {bound:g}")
        vv.quality_failures = list((quality or {}).get(value, []))
        vv.invalid_runs = (invalid or {}).get(value, 0)
        vv.failed_runs = (failed or {}).get(value, 0)
        vv.adopted, vv.reason = _adopt(template, vv)
        out.append(vv)
    return out


def _adopt(template: Template, vv: VariantVerdict) -> tuple[bool, str]:
    if vv.failed_runs:
        return False, f"{vv.failed_runs} run(s) failed"
    obj = vv.metrics.get(template.objective.metric)
    if obj is None:
        return False, f"objective {template.objective.metric} was not measured"
    if vv.invalid_runs:
        return False, f"{vv.invalid_runs} run(s) invalid (the client fell behind)"
    if vv.slo_failures:
        return False, "SLO: " + "; ".join(vv.slo_failures)
    if vv.quality_failures:
        return False, "quality: " + "; ".join(vv.quality_failures)
    wanted = "better" if template.objective.direction == direction(obj.metric) else "worse"
    if obj.verdict != wanted:
        return False, f"objective {obj.metric} {obj.verdict} ({obj.relative_effect:+.1%})"
    return True, f"objective {obj.metric} improves {obj.relative_effect:+.1%} beyond noise"


def verdict_table(verdicts: list[VariantVerdict], objective: str) -> str:
    """Markdown: one row per variant with the objective, the tails and the decision."""
    cols = list(dict.fromkeys([objective, "p95_ttft_ms", "p95_tpot_ms", "p95_itl_ms",
                               "output_throughput"]))
    head = ["value", *cols, "decision", "why"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in verdicts:
        cells = [str(v.value)]
        for c in cols:
            m = v.metrics.get(c)
            cells.append("-" if m is None else
                         f"{m.variant_median:.4g} ({m.relative_effect:+.1%}, {m.verdict})")
        cells += ["ADOPT" if v.adopted else "reject", v.reason]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
