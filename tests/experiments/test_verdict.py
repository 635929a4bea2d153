"""Verdicts (better / worse / no change / undecided from the effect's interval), and the
adoption rule, on hand-made numbers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from workbench.experiments.template import parse_template
from workbench.experiments.verdict import compare_metric, decide, noise_band

from .test_template import make


def runs(**series: list[float]) -> list[dict[str, float]]:
    n = len(next(iter(series.values())))
    return [{k: v[i] for k, v in series.items()} for i in range(n)]


def test_legacy_spread_band_still_serves_rerun_drift() -> None:
    # The older rule, kept for `workbench rerun`'s drift check: baseline range 3, median
    # delta -3 is not beyond it.
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


def test_non_overlapping_repeats_are_better_where_the_spread_band_said_no_change() -> None:
    # The prefix-caching run: every "on" repeat below every baseline repeat.
    base, var = [74.0, 123.0, 90.0], [41.0, 52.0, 45.0]
    assert compare_metric("p95_ttft_ms", base, var, "spread").verdict == "no change"  # old
    m = compare_metric("p95_ttft_ms", base, var)
    assert m.verdict == "better" and m.relative_effect == pytest.approx(45 / 90 - 1)
    # Welch t on the logs (as scipy's ttest_ind(equal_var=False) gives it), df 2.83
    assert (m.effect_low, m.effect_high) == (pytest.approx(-0.71416, abs=1e-5),
                                             pytest.approx(-0.16256, abs=1e-5))
    assert (m.n_baseline, m.n_variant, m.repeats_needed) == (3, 3, None)
    assert m.noise_low == pytest.approx(m.effect_low * 90) and m.noise_high < 0
    assert compare_metric("output_throughput", base, var).verdict == "worse"
    assert compare_metric("duration", base, var).verdict == "lower"  # no direction


def test_one_repeat_per_side_is_undecided_and_never_adopted() -> None:
    # repeats: 1 and -1.5% p95 TTFT: the old band was 0 wide and adopted it.
    t = _template(objective={"metric": "p95_ttft_ms", "direction": "minimize"}, repeats=1,
                  slo={})
    base, var = runs(p95_ttft_ms=[100.0]), runs(p95_ttft_ms=[98.5])
    (v,) = decide(t, base, {64: var})
    m = v.metrics["p95_ttft_ms"]
    assert (m.verdict, m.effect_low, m.effect_high) == ("undecided", -math.inf, math.inf)
    assert not v.adopted and v.undecided and v.decision == "undecided"
    assert v.reason == ("undecided: objective p95_ttft_ms (-1.5%, interval -inf .. +inf); "
                        "1 valid repeat(s) per side decide nothing: at least 2 are needed "
                        "(raise repeats, e.g. repeats: 3 and max_repeats: 10)")


def test_equivalence_inside_the_smallest_effect_is_no_change_and_rejects() -> None:
    t = _template(objective={"metric": "p95_ttft_ms", "direction": "minimize"}, slo={},
                  repeats=5)
    base = runs(p95_ttft_ms=[100.0, 100.5, 99.5, 100.2, 99.8])
    same = runs(p95_ttft_ms=[100.1, 99.9, 100.3, 99.7, 100.0])
    (v,) = decide(t, base, {64: same})
    m = v.metrics["p95_ttft_ms"]
    assert m.verdict == "no change" and -0.02 < m.effect_low < 0 < m.effect_high < 0.02
    assert not v.adopted and not v.undecided and v.decision == "reject"
    assert v.reason.startswith("objective p95_ttft_ms no change (+0.0%, interval -0.")
    assert v.reason.endswith(", inside +-2.0%)")
    # A 0.3% smallest effect is narrower than this interval: undecided, with a count.
    (v,) = decide(_template(objective={"metric": "p95_ttft_ms", "direction": "minimize"},
                            slo={}, repeats=5, smallest_effect=0.003), base, {64: same})
    assert v.decision == "undecided" and v.metrics["p95_ttft_ms"].repeats_needed == 10
    assert v.reason.endswith("about 10 repeats per side would likely decide it (now 5; "
                             "raise max_repeats)")


def test_worse_rejects_and_an_error_rate_of_zero_needs_no_log() -> None:
    t = _template(objective={"metric": "p95_ttft_ms", "direction": "minimize"}, slo={})
    base = runs(p95_ttft_ms=[50.0, 51, 52], error_rate=[0.0, 0, 0])
    slow = runs(p95_ttft_ms=[80.0, 81, 82], error_rate=[0.0, 0, 0])
    (v,) = decide(t, base, {64: slow})
    assert v.decision == "reject" and v.reason.startswith("objective p95_ttft_ms worse (+")
    e = v.metrics["error_rate"]
    assert (e.verdict, e.effect_low, e.effect_high) == ("no change", 0.0, 0.0)


def test_adaptive_looks_split_alpha_so_the_same_runs_decide_later() -> None:
    base, var = runs(p95_ttft_ms=[74.0, 123, 90]), runs(p95_ttft_ms=[41.0, 52, 45])
    obj = {"metric": "p95_ttft_ms", "direction": "minimize"}
    (v,) = decide(_template(objective=obj, slo={}), base, {64: var})
    assert v.adopted and v.reason.startswith("objective p95_ttft_ms improves -50.0% (interval")
    # max_repeats 10: 8 planned looks at 0.05 / 8 each; 3 + 3 repeats are not enough yet.
    t = _template(objective=obj, slo={}, max_repeats=10)
    assert (t.planned_looks, t.repeat_cap) == (8, 10)
    (v,) = decide(t, base, {64: var})
    assert v.decision == "undecided" and v.metrics["p95_ttft_ms"].repeats_needed == 4
    assert v.reason.endswith("about 4 repeats per side would likely decide it (now 3; raise "
                             "max_repeats)")


def _template(**changes: Any) -> Any:
    return parse_template(make(**{"objective": {"metric": "p95_itl_ms", "direction": "minimize"},
                                  "slo": {"p95_ttft_ms": 100, "max_error_rate": 0.0},
                                  **changes}))


def test_adoption_needs_objective_better_and_every_gate() -> None:
    t = _template()
    base = runs(p95_itl_ms=[10, 11, 12], p95_ttft_ms=[50, 50, 50], error_rate=[0, 0, 0])
    good = runs(p95_itl_ms=[5, 5, 6], p95_ttft_ms=[60, 61, 62], error_rate=[0, 0, 0])
    slow = runs(p95_itl_ms=[5, 5, 6], p95_ttft_ms=[150, 151, 152], error_rate=[0, 0, 0])
    v = decide(t, base, {64: good, 128: slow, 256: base}, invalid={}, failed={},
               quality={64: [], 128: [], 256: []})
    by = {x.value: x for x in v}
    assert by[64].adopted and by[64].reason.startswith("objective p95_itl_ms improves")
    assert not by[128].adopted and by[128].slo_failures == ["p95_ttft_ms 151 > 100"]
    # The same numbers again: not "no change" at +-9% noise, undecided (needs > 100 repeats)
    assert by[256].decision == "undecided" and by[256].reason == (
        "undecided: objective p95_itl_ms (+0.0%, interval -18.7% .. +23.0%); more than 100 "
        "repeats per side would be needed at this spread and effect: the effect, if any, is "
        "smaller than the noise")
    v = decide(t, base, {64: good}, quality={64: ["greedy token agreement 0.9 < 1.0"]})
    assert not v[0].adopted and v[0].reason.startswith("quality:")
    v = decide(t, base, {64: good}, invalid={64: 1})
    assert not v[0].adopted and "invalid" in v[0].reason
    v = decide(t, base, {64: good}, failed={64: 2})
    assert not v[0].adopted and v[0].reason == "2 run(s) failed"


def test_table_and_summary_show_the_rule_the_interval_and_a_baseline_row() -> None:
    from workbench.experiments.verdict_report import rule_text, verdict_summary, verdict_table

    t = _template(objective={"metric": "p95_ttft_ms", "direction": "minimize"}, slo={},
                  max_repeats=10)
    base = runs(p95_ttft_ms=[74.0, 123, 90])
    v = decide(t, base, {64: runs(p95_ttft_ms=[41.0, 52, 45])})
    table = verdict_table(v, "p95_ttft_ms", [], baseline="baseline (512)")
    assert table.splitlines()[:3] == [
        "| value | p95_ttft_ms | decision | why |", "|---|---|---|---|",
        "| baseline (512) | 90 | baseline | 3 valid repeat(s); medians |"]
    assert table.splitlines()[3].startswith(
        "| budget=64 | 45 (-50.0% [-85.3%, +63.1%], undecided) | undecided | undecided: ")
    assert rule_text(t) == (
        "Rule: a 99.38% Welch t interval of the relative effect on log values (alpha 0.05, split "
        "over 8 looks: 0.00625 each); better/worse: it excludes 0; no change: it lies inside "
        "+-2.0% (smallest_effect); undecided: neither; repeats 3, up to 10 while undecided.")
    assert verdict_summary(v, "p95_ttft_ms", "baseline (512)").splitlines()[:3] == [
        "**Verdict: undecided**: keep baseline (512) for now; 1 variant(s) need more repeats",
        "", "- budget=64: undecided, p95_ttft_ms -50.0% (undecided)"]


def test_verdict_keys_are_validated_and_noise_is_deprecated() -> None:
    from workbench.errors import TemplateError
    from workbench.experiments.validate import check_template

    for changes, message in [
        ({"smallest_effect": 0}, "smallest_effect (0) must be a relative effect in (0, 1), "
                                 "e.g. 0.02 for +-2%"),
        ({"alpha": 0.7}, "alpha (0.7) must be an error rate in (0, 0.5), e.g. 0.05"),
        ({"max_repeats": "ten"}, "max_repeats ('ten') must be an integer >= repeats (1), "
                                 "e.g. 10; leave it out for no extra rounds"),
    ]:
        with pytest.raises(ValueError) as e:
            parse_template(make(**changes))
        assert str(e.value) == message
    with pytest.raises(ValueError, match=r"^max_repeats \(2\) must be >= repeats \(3\)"):
        parse_template(make(max_repeats=2))
    with pytest.raises(TemplateError) as err:
        check_template(make(max_repeats=2, alpha=0, smallest_effect="2%"), source="t.yaml")
    text = str(err.value)
    assert "max_repeats (2) must be an integer >= repeats (3)" in text
    assert "alpha (0) must be an error rate in (0, 0.5)" in text
    assert "smallest_effect ('2%') must be a relative effect in (0, 1)" in text
    with pytest.warns(FutureWarning, match=r"template key noise \('bootstrap'\) is deprecated"):
        t = parse_template(make(noise="bootstrap"))
    assert t.noise == "bootstrap" and t.as_data()["noise"] == "bootstrap"
    assert "noise" not in parse_template(make()).as_data()
    assert parse_template(make(max_repeats=10)).as_data()["max_repeats"] == 10
    sweep = make(arrivals=None, objective=None, max_repeats=6,
                 rate_sweep={"rates": [1, 2], "slo": {"ttft_ms": 1000, "tpot_ms": 100}})
    assert parse_template(sweep).repeat_cap == 6  # a round is a whole sweep (sequential)


def _record(label: str, value: Any, repeat: int, itl: float, *, valid: bool = True,
            disturbed: bool = False, error: str | None = None) -> Any:
    from workbench.experiments.run_record import RunRecord

    metrics = {"p95_itl_ms": itl, "p95_ttft_ms": 50.0, "error_rate": 0.0}
    return RunRecord(label, value, repeat, f"{label}-{repeat}", metrics=metrics, valid=valid,
                     error=error, disturbed=disturbed, other_cpu_share=0.6 if disturbed else 0.0)


def test_disturbed_runs_are_left_out_and_too_few_make_the_verdict_inconclusive() -> None:
    from workbench.experiments.verdict import judge_runs
    from workbench.experiments.verdict_report import verdict_table

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
