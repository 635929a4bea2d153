"""SLO attainment of hand-made requests and goodput read off hand-made attainment curves."""

from __future__ import annotations

import pytest

from workbench.harness.goodput import (
    GoodputEstimate,
    GoodputSLO,
    attainment_band,
    attainment_bands,
    band_rows,
    goodput,
    meets_slo,
    slo_attainment,
)
from workbench.harness.metrics import RequestRecord

SLO = GoodputSLO(ttft_ms=500, tpot_ms=100)


def rec(rid: str, ttft_s: float | None, end_s: float, tokens: int,
        success: bool = True) -> RequestRecord:
    """Sent at t = 0; times in seconds chosen to be exact in binary."""
    return RequestRecord(rid, prompt_tokens=8, output_tokens=tokens, success=success,
                         error=None if success else "boom", start_s=0.0,
                         first_token_s=ttft_s, end_s=end_s)


RECORDS = [
    rec("fast", 0.25, 0.5, 5),  # TTFT 250 ms, TPOT (0.5 - 0.25) / 4 = 62.5 ms: meets
    rec("ttft-on-the-bound", 0.5, 0.75, 5),  # TTFT exactly 500 ms: meets (inclusive)
    rec("ttft-late", 0.75, 1.0, 5),  # TTFT 750 ms: misses
    rec("tpot-slow", 0.25, 0.5, 3),  # TPOT (0.5 - 0.25) / 2 = 125 ms: misses
    rec("one-token", 0.25, 10.0, 1),  # no TPOT with one output token: meets
    rec("failed", 0.25, 0.5, 5, success=False),  # failures miss, whatever their times
    rec("nothing-streamed", None, 0.5, 5),  # no TTFT: misses
]


def test_meets_slo_per_request() -> None:
    assert [meets_slo(r, SLO) for r in RECORDS] == [True, True, False, False, True, False,
                                                    False]


def test_attainment_counts_every_request_sent_and_unsent() -> None:
    assert slo_attainment(RECORDS, SLO) == 3 / 7
    assert slo_attainment(RECORDS, SLO, unsent_requests=1) == 3 / 8
    assert slo_attainment(RECORDS[:2], SLO) == 1.0
    with pytest.raises(ValueError, match=r"slo_attainment of no requests is undefined"):
        slo_attainment([], SLO)
    with pytest.raises(ValueError, match=r"unsent_requests \(-1\) must be an integer >= 0"):
        slo_attainment(RECORDS, SLO, unsent_requests=-1)


def test_goodput_slo_is_validated() -> None:
    assert SLO.attainment == 0.9
    with pytest.raises(ValueError, match=r"^GoodputSLO ttft_ms \(0\) must be a number > 0 ms$"):
        GoodputSLO(ttft_ms=0, tpot_ms=100)
    with pytest.raises(ValueError, match=r"^GoodputSLO tpot_ms \('x'\) must be a number > 0"):
        GoodputSLO(ttft_ms=1, tpot_ms="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^GoodputSLO attainment \(1.5\) must be a share in "
                                         r"\(0, 1\]"):
        GoodputSLO(ttft_ms=1, tpot_ms=1, attainment=1.5)
    with pytest.raises(ValueError, match=r"GoodputSLO attainment \(0\) must be"):
        GoodputSLO(ttft_ms=1, tpot_ms=1, attainment=0)


def test_every_rate_passes_gives_the_highest_rate_as_a_lower_bound() -> None:
    curve = [(1.0, 1.0), (2.0, 0.95), (4.0, 0.9)]
    assert goodput(curve, 0.9) == GoodputEstimate(4.0, lower_bound=True, per_worker=4.0)
    assert goodput(curve, 0.9, num_workers=2) == GoodputEstimate(4.0, True, 2.0)


def test_crossing_between_two_rates_is_interpolated() -> None:
    # the line (2, 1.0) -> (4, 0.5) crosses 0.75 at 2 + 0.25 * 2 / 0.5 = 3
    curve = [(1.0, 1.0), (2.0, 1.0), (4.0, 0.5)]
    assert goodput(curve, 0.75) == GoodputEstimate(3.0, lower_bound=False, per_worker=3.0)
    assert goodput(curve, 0.75, num_workers=2) == GoodputEstimate(3.0, False, 1.5)
    assert goodput(curve, 1.0) == GoodputEstimate(2.0, False, 2.0)  # on a passing point
    assert goodput([(1.0, 0.9), (3.0, 0.5)], 0.9).rate == 1.0  # on the target exactly


def test_first_rate_fails_interpolates_from_an_idle_server() -> None:
    # the line (0, 1.0) -> (2, 0.5) crosses 0.75 at 1.0
    assert goodput([(2.0, 0.5), (4.0, 0.0)], 0.75) == GoodputEstimate(1.0, False, 1.0)
    assert goodput([(2.0, 0.0)], 0.75, num_workers=4) == GoodputEstimate(0.5, False, 0.125)
    assert goodput([(2.0, 0.5)], 1.0) == GoodputEstimate(0.0, False, 0.0)


def test_noisy_curve_uses_the_highest_passing_rate() -> None:
    # passes at 1, fails at 2, passes at 3 again, fails at 5: from (3, 1.0) to (5, 0.5)
    curve = [(1.0, 1.0), (2.0, 0.5), (3.0, 1.0), (5.0, 0.5)]
    assert goodput(curve, 0.75) == GoodputEstimate(4.0, False, 4.0)


@pytest.mark.parametrize(("curve", "target", "workers", "message"), [
    ([], 0.9, 1, r"goodput needs an attainment curve with at least one"),
    ([(2.0, 1.0), (1.0, 1.0)], 0.9, 1,
     r"curve\[1\] rate \(1.0\) must be > curve\[0\] rate \(2.0\): sort the curve"),
    ([(0.0, 1.0)], 0.9, 1, r"curve\[0\] rate \(0.0\) must be a number > 0 requests/s"),
    ([(1.0, 1.5)], 0.9, 1, r"curve\[0\] attainment \(1.5\) must be a share in \[0, 1\]"),
    ([(1.0, 1.0)], 0.0, 1, r"target \(0.0\) must be an attainment share in \(0, 1\]"),
    ([(1.0, 1.0)], 0.9, 0, r"num_workers \(0\) must be an integer >= 1"),
])
def test_goodput_refuses_bad_input(curve: list[tuple[float, float]], target: float,
                                   workers: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        goodput(curve, target, workers)


REPEATS = [[(1.0, 1.0), (2.0, 0.5)], [(1.0, 0.75), (2.0, 0.25)], [(1.0, 1.0), (2.0, 0.0)]]


def test_attainment_band_over_repeats() -> None:
    assert attainment_band(REPEATS) == [(1.0, 1.0, 0.75, 1.0), (2.0, 0.25, 0.0, 0.5)]
    assert attainment_bands({"a": REPEATS, "b": REPEATS[:1]}) == {
        "a": [(1.0, 1.0, 0.75, 1.0), (2.0, 0.25, 0.0, 0.5)],
        "b": [(1.0, 1.0, 1.0, 1.0), (2.0, 0.5, 0.5, 0.5)]}
    with pytest.raises(ValueError, match=r"curve 1 has rates \[1.0, 3.0\], curve 0 has "
                                         r"\[1.0, 2.0\]: every repeat must sweep the same"):
        attainment_band([REPEATS[0], [(1.0, 1.0), (3.0, 1.0)]])


def test_band_rows_carry_the_median_goodput() -> None:
    # goodput per repeat at 0.75: 1.5, 1.0 (passes at 1 exactly, fails at 2), 1.25
    rows = band_rows({"a": REPEATS}, 0.75, num_workers=2)
    assert rows == [
        {"label": "a", "rate": 1.0, "attainment_median": 1.0, "attainment_min": 0.75,
         "attainment_max": 1.0, "goodput": 1.25, "goodput_per_worker": 0.625,
         "goodput_lower_bound": False},
        {"label": "a", "rate": 2.0, "attainment_median": 0.25, "attainment_min": 0.0,
         "attainment_max": 0.5, "goodput": 1.25, "goodput_per_worker": 0.625,
         "goodput_lower_bound": False}]
