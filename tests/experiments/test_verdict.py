"""Verdicts against the baseline's noise band, and the adoption rule, on hand-made numbers."""

from __future__ import annotations

from typing import Any

from workbench.experiments.template import parse_template
from workbench.experiments.verdict import compare_metric, decide, noise_band

from .test_template import make


def runs(**series: list[float]) -> list[dict[str, float]]:
    n = len(next(iter(series.values())))
    return [{k: v[i] for k, v in series.items()} for i in range(n)]


def test_spread_band_counts_only_changes_larger_than_the_baseline_range() -> None:
    # Baseline repeats 10, 11, 13 (range 3). Variant median 8: delta -3, not beyond.
    m = compare_metric("p95_itl_ms", [10, 11, 13], [8, 8, 9], "spread")
    assert (m.baseline_median, m.variant_median, m.delta) == (11, 8, -3)
    assert (m.noise_low, m.noise_high, m.verdict) == (-6, 0, "no change")
    m = compare_metric("p95_itl_ms", [10, 11, 13], [7, 7.5, 9], "spread")
    assert m.verdict == "better" and m.relative_effect == -3.5 / 11
    m = compare_metric("output_throughput", [10, 11, 13], [7, 7.5, 9], "spread")
    assert m.verdict == "worse"  # throughput is maximized


def test_bootstrap_band_is_deterministic_and_excludes_zero_for_a_clear_shift() -> None:
    base, var = [100.0, 101, 99, 100.5], [90.0, 91, 89, 90.5]
    lo, hi = noise_band(base, var, "bootstrap")
    assert (lo, hi) == noise_band(base, var, "bootstrap")
    assert hi < 0
    assert compare_metric("p95_ttft_ms", base, var, "bootstrap").verdict == "better"


def _template(**changes: Any) -> Any:
    return parse_template(make(objective={"metric": "p95_itl_ms", "direction": "minimize"},
                               slo={"p95_ttft_ms": 100, "max_error_rate": 0.0}, **changes))


def test_adoption_needs_objective_beyond_noise_and_every_gate() -> None:
    t = _template()
    base = runs(p95_itl_ms=[10, 11, 12], p95_ttft_ms=[50, 50, 50], error_rate=[0, 0, 0])
    good = runs(p95_itl_ms=[5, 5, 6], p95_ttft_ms=[60, 61, 62], error_rate=[0, 0, 0])
    slow = runs(p95_itl_ms=[5, 5, 6], p95_ttft_ms=[150, 151, 152], error_rate=[0, 0, 0])
    v = decide(t, base, {64: good, 128: slow, 256: base}, invalid={}, failed={},
               quality={64: [], 128: [], 256: []})
    by = {x.value: x for x in v}
    assert by[64].adopted and by[64].reason.startswith("objective p95_itl_ms improves")
    assert not by[128].adopted and by[128].slo_failures == ["p95_ttft_ms 151 > 100"]
    assert not by[256].adopted and "no change" in by[256].reason
    v = decide(t, base, {64: good}, quality={64: ["greedy token agreement 0.9 < 1.0"]})
    assert not v[0].adopted and v[0].reason.startswith("quality:")
    v = decide(t, base, {64: good}, invalid={64: 1})
    assert not v[0].adopted and "invalid" in v[0].reason
    v = decide(t, base, {64: good}, failed={64: 2})
    assert not v[0].adopted and v[0].reason == "2 run(s) failed"
