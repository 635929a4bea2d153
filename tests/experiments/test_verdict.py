"""Verdicts against the baseline's noise band, and the adoption rule, on hand-made numbers."""

from __future__ import annotations

from typing import Any

import pytest

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


def _record(label: str, value: Any, repeat: int, itl: float, *, valid: bool = True,
            disturbed: bool = False, error: str | None = None) -> Any:
    from workbench.experiments.runner import RunRecord

    metrics = {"p95_itl_ms": itl, "p95_ttft_ms": 50.0, "error_rate": 0.0}
    return RunRecord(label, value, repeat, f"{label}-{repeat}", metrics=metrics, valid=valid,
                     error=error, disturbed=disturbed, other_cpu_share=0.6 if disturbed else 0.0)


def test_disturbed_runs_are_left_out_and_too_few_make_the_verdict_inconclusive() -> None:
    from workbench.experiments.verdict import judge_runs, verdict_table

    t = _template()  # repeats 3: 2 valid runs per side are needed
    clean = [_record("baseline", None, i, x) for i, x in enumerate([10, 11, 12])]
    # A disturbed variant run with a flattering number (1 ms) is left out: the other two
    # repeats still decide, on their own numbers.
    runs = clean + [_record("64", 64, 0, 5), _record("64", 64, 1, 6),
                    _record("64", 64, 2, 1, valid=False, disturbed=True)]
    (v,) = judge_runs(t, runs)
    assert v.adopted and v.disturbed_runs == 1 and v.valid_runs == 2 and v.invalid_runs == 0
    assert v.metrics["p95_itl_ms"].variant_median == 5.5  # (5 + 6) / 2: the 1 is not in it
    # Two of three variant runs disturbed: one valid run left, too few to decide either way.
    runs = clean + [_record("64", 64, 0, 5), _record("64", 64, 1, 1, valid=False, disturbed=True),
                    _record("64", 64, 2, 1, valid=False, disturbed=True)]
    (v,) = judge_runs(t, runs)
    assert not v.adopted and v.inconclusive and v.decision == "inconclusive"
    assert v.reason == ("inconclusive: runs disturbed (0 baseline and 2 variant run(s) left out: "
                        "other processes took too much of the CPUs; 3 + 1 valid, 2 + 2 needed); "
                        "rerun on a quieter machine")
    assert "| budget=64 |" in verdict_table([v], "p95_itl_ms") and "| inconclusive |" in (
        verdict_table([v], "p95_itl_ms"))
    # A disturbed baseline affects every variant the same way.
    runs = [_record("baseline", None, 0, 10), _record("baseline", None, 1, 30, valid=False,
                                                      disturbed=True),
            _record("baseline", None, 2, 30, valid=False, disturbed=True),
            _record("64", 64, 0, 5), _record("64", 64, 1, 5), _record("64", 64, 2, 6)]
    (v,) = judge_runs(t, runs)
    assert v.inconclusive and v.baseline_disturbed_runs == 2 and v.baseline_valid_runs == 1
    # Every baseline run disturbed: still a verdict row, inconclusive (never "adopt").
    runs = [_record("baseline", None, i, 10, valid=False, disturbed=True) for i in range(3)]
    (v,) = judge_runs(t, runs + [_record("64", 64, i, 5) for i in range(3)])
    assert v.inconclusive and v.metrics == {}


def test_failures_and_a_late_client_still_reject_before_disturbance() -> None:
    from workbench.experiments.verdict import judge_runs

    t = _template()
    clean = [_record("baseline", None, i, x) for i, x in enumerate([10, 11, 12])]
    late = clean + [_record("64", 64, 0, 5), _record("64", 64, 1, 5, valid=False),
                    _record("64", 64, 2, 5, valid=False, disturbed=True)]
    (v,) = judge_runs(t, late)
    assert not v.adopted and not v.inconclusive and v.invalid_runs == 1
    assert v.reason == "1 run(s) invalid (the client fell behind)"
    failed = clean + [_record("64", 64, 0, 5, error="RuntimeError: boom"),
                      _record("64", 64, 1, 5, valid=False, disturbed=True),
                      _record("64", 64, 2, 5)]
    (v,) = judge_runs(t, failed)
    assert v.reason == "1 run(s) failed" and v.decision == "reject"
    # A late baseline run is not compared either; none left means no comparison at all.
    base_late = [_record("baseline", None, i, 10, valid=False) for i in range(3)]
    (v,) = judge_runs(t, base_late + [_record("64", 64, i, 5) for i in range(3)])
    assert not v.adopted and v.reason == "no valid baseline run to compare with"


def test_disturbance_threshold_comes_from_the_call_the_template_or_the_default() -> None:
    from workbench.experiments.verdict import disturbance_threshold

    t = _template()
    assert disturbance_threshold(t) == 0.25
    assert disturbance_threshold(t, 0.1) == 0.1
    t.raw["max_other_cpu_share"] = 0.4
    assert disturbance_threshold(t) == 0.4
    t.raw["max_other_cpu_share"] = "high"
    with pytest.raises(ValueError, match=r"max_other_cpu_share \('high'\) must be a share"):
        disturbance_threshold(t)
