"""The verdict: better / worse / no change / undecided per metric, and adoption.

For each variant and metric, the valid repeats of both sides give an interval of the relative
effect (variant vs baseline): a Welch t interval on the log values at the template's `alpha`
(split over the planned looks of adaptive repeats, `sequential`), `verdict_rule`'s docstring
says why. With the template's `smallest_effect` e:

    the interval excludes 0                 -> "better" | "worse" (by the metric's direction;
                                               "lower" | "higher" for a metric without one)
    the interval lies inside [-e, +e]       -> "no change" (an equivalence claim)
    neither, or one repeat on a side        -> "undecided" (too wide at this many repeats)

A variant is ADOPTed only if its objective is "better", every SLO bound holds (on the median
over its repeats), the quality gate (if any) passes, and all its runs were valid. An
undecided objective is neither adopted nor rejected (decision "undecided"; the reason says
about how many repeats per side would likely decide it); "worse" and "no change" reject.

Invalid runs never enter the comparison: the caller passes only valid runs' metrics and counts
the rest. A run disturbed by other processes (CPU share above the threshold) says nothing
about the variant, so it is only left out; when fewer than `min_valid_repeats(repeats)` valid
runs remain on either side, the decision is "inconclusive: runs disturbed" (neither adopted
nor rejected: rerun on a quieter machine). A variant run that is invalid for another reason
(the client fell behind its schedule) rejects the variant, as before.

The older bands ("spread": the baseline's range; "bootstrap" of the difference of medians)
are kept as `compare_metric(..., method="spread"|"bootstrap")` for `workbench rerun`'s drift
check and for reading old runs (`analysis.frames.compare_frame`); the template key `noise`
sets only those (deprecated for the verdict).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.experiments import verdict_rule as rule
from workbench.experiments.template import Template
from workbench.harness.goodput import DIRECTIONS as GOODPUT_DIRECTIONS
from workbench.metrics import registry as metric_registry
from workbench.metrics.registry import SLO_BOUNDS

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
    noise_low: float  # the interval of the delta (absolute: effect_* x baseline median)
    noise_high: float
    verdict: str  # "better" | "worse" | "no change" | "undecided"; "higher" | "lower"
    effect_low: float = 0.0  # the interval of the relative effect (welch); legacy: band / b
    effect_high: float = 0.0
    n_baseline: int = 0
    n_variant: int = 0
    repeats_needed: int | None = None  # undecided: about this many per side would decide


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
    undecided: bool = False  # the objective's interval too wide: neither adopted nor rejected
    reason: str = ""

    @property
    def decision(self) -> str:
        return ("ADOPT" if self.adopted else "inconclusive" if self.inconclusive
                else "undecided" if self.undecided else "reject")

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


def _word(metric: str, lower: bool) -> str:
    way = direction(metric)
    if way == "none":
        return "lower" if lower else "higher"
    return "better" if lower == (way == "minimize") else "worse"


def compare_metric(metric: str, base: list[float], var: list[float], method: str = "welch",
                   alpha: float = 0.05, smallest_effect: float = 0.02) -> MetricVerdict:
    """One metric of one variant against the baseline: `method` "welch" is the verdict's
    rule (module docstring, `verdict_rule`); "spread" | "bootstrap" the older bands, whose
    outcomes are "no change" (inside the band) or a direction."""
    b, v = statistics.median(base), statistics.median(var)
    delta = v - b
    rel = delta / b if b else 0.0
    if method != "welch":
        lo, hi = noise_band(base, var, method)
        verdict = ("no change" if not (lo > 0 or hi < 0)  # the band excludes zero
                   else _word(metric, delta < 0))
        return MetricVerdict(metric, b, v, delta, rel, lo, hi, verdict,
                             lo / b if b else 0.0, hi / b if b else 0.0, len(base), len(var))
    iv = rule.effect_interval(base, var, alpha)
    outcome = rule.classify(iv, smallest_effect)
    verdict = (outcome if outcome in (rule.NO_CHANGE, rule.UNDECIDED)
               else _word(metric, outcome == rule.DECREASE))
    need = (rule.repeats_to_decide(base, var, alpha, smallest_effect)
            if verdict == rule.UNDECIDED else None)
    scale = abs(b)
    return MetricVerdict(metric, b, v, delta, rel, iv.low * scale, iv.high * scale, verdict,
                         iv.low, iv.high, len(base), len(var), need)


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
    alpha = rule.look_alpha(template.alpha, template.planned_looks)  # `sequential`
    out = []
    for value, runs in variant_runs.items():
        mv = {}
        for m in metrics:
            base = [r[m] for r in baseline_runs if m in r]
            var = [r[m] for r in runs if m in r]
            if base and var:
                mv[m] = compare_metric(m, base, var, "welch", alpha, template.smallest_effect)
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
        vv.undecided = vv.reason.startswith("undecided")
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
    interval = f"interval {rule.percent(obj.effect_low)} .. {rule.percent(obj.effect_high)}"
    effect = f"{obj.relative_effect:+.1%}, {interval}"
    if obj.verdict == rule.UNDECIDED:
        return False, f"undecided: objective {obj.metric} ({effect}); {_to_decide(obj)}"
    # Beyond the interval and the way the template asks (for a registered direction this is
    # "better" when the template agrees with the registry, which validation requires).
    if obj.verdict == rule.NO_CHANGE:
        return False, (f"objective {obj.metric} no change ({effect}, inside "
                       f"+-{template.smallest_effect:.1%})")
    if not template.objective.better(obj.effect_high if obj.effect_high < 0 else obj.effect_low):
        return False, f"objective {obj.metric} {obj.verdict} ({effect})"
    return True, f"objective {obj.metric} improves {obj.relative_effect:+.1%} ({interval})"


def _to_decide(obj: MetricVerdict) -> str:
    """How many repeats per side would likely decide an undecided objective."""
    have = min(obj.n_baseline, obj.n_variant)
    if obj.repeats_needed is None:
        return (f"{have} valid repeat(s) per side decide nothing: at least 2 are needed "
                "(raise repeats, e.g. repeats: 3 and max_repeats: 10)")
    if obj.repeats_needed > rule.MAX_REPEATS_HINT:
        return (f"more than {rule.MAX_REPEATS_HINT} repeats per side would be needed at this "
                "spread and effect: the effect, if any, is smaller than the noise")
    return (f"about {max(obj.repeats_needed, have + 1)} repeats per side would likely decide "
            f"it (now {have}; raise max_repeats)")
