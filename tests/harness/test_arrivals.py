"""Arrival schedules: exact constant and ramped offsets, seeded Poisson/gamma with the right
mean rate and burstiness, trace replay, and validation that names the field."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from workbench.harness.arrivals import ArrivalSpec, arrival_offsets, ramp_warp


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip(offsets, offsets[1:], strict=False)]


def test_closed_loop_has_no_schedule() -> None:
    spec = ArrivalSpec("closed", concurrency=4)
    assert not spec.is_open_loop
    assert arrival_offsets(spec, 10) is None


def test_constant_gaps_exact() -> None:
    assert arrival_offsets(ArrivalSpec("constant", rate=4.0), 5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    offs = arrival_offsets(ArrivalSpec("constant", rate=3.0), 301)
    assert offs is not None and offs[-1] == 100.0 and offs[3] == 1.0
    assert arrival_offsets(ArrivalSpec("constant", rate=3.0), 0) == []
    assert arrival_offsets(ArrivalSpec("gamma", rate=2.0, burstiness=math.inf), 3) == [0, .5, 1]


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(ArrivalSpec("poisson", rate=math.inf), 4) == [0.0] * 4


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_poisson_and_gamma_mean_rate(burstiness: float) -> None:
    mode = "poisson" if burstiness == 1.0 else "gamma"
    gaps: list[float] = []
    for seed in range(20):  # many draws: 20 seeds x 1000 gaps
        offs = arrival_offsets(ArrivalSpec(mode, rate=8.0, burstiness=burstiness, seed=seed),
                               1001)
        assert offs is not None and offs[0] == 0.0 and offs == sorted(offs)
        gaps += _gaps(offs)
    assert 1.0 / statistics.fmean(gaps) == pytest.approx(8.0, rel=0.04)
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.08)


def test_same_seed_same_offsets() -> None:
    a = arrival_offsets(ArrivalSpec("gamma", rate=5.0, burstiness=0.5, seed=7), 50)
    assert a == arrival_offsets(ArrivalSpec("gamma", rate=5.0, burstiness=0.5, seed=7), 50)
    assert a != arrival_offsets(ArrivalSpec("gamma", rate=5.0, burstiness=0.5, seed=8), 50)
    assert a != arrival_offsets(ArrivalSpec("poisson", rate=5.0, seed=7), 50)


def test_bursty_gamma_has_higher_cv_than_poisson() -> None:
    def cv(spec: ArrivalSpec) -> float:
        g = _gaps(arrival_offsets(spec, 5001))  # type: ignore[arg-type]
        return statistics.pstdev(g) / statistics.fmean(g)

    poisson = cv(ArrivalSpec("poisson", rate=10.0, seed=1))
    bursty = cv(ArrivalSpec("gamma", rate=10.0, burstiness=0.3, seed=1))
    smooth = cv(ArrivalSpec("gamma", rate=10.0, burstiness=3.0, seed=1))
    assert bursty > 1.5 * poisson > 1.5 * 1.5 * smooth


def test_ramp_up_hand_computed() -> None:
    # rate 2/s, T = 4 s: unramped 0, .5, 1, 1.5, 2, 2.5 -> sqrt(2*4*s) up to s = T/2, then s + 2
    offs = arrival_offsets(ArrivalSpec("constant", rate=2.0, ramp_up_s=4.0), 7)
    want = [0.0, 2.0, math.sqrt(8.0), math.sqrt(12.0), 4.0, 4.5, 5.0]
    assert offs == pytest.approx(want, abs=1e-12)
    # the ramp warps the same seeded gaps: ramp-up only delays, it never redraws
    flat = arrival_offsets(ArrivalSpec("poisson", rate=3.0, seed=2), 40)
    ramped = arrival_offsets(ArrivalSpec("poisson", rate=3.0, seed=2, ramp_up_s=5.0), 40)
    assert ramped == [ramp_warp(s, 5.0) for s in flat]  # type: ignore[union-attr]
    assert ramp_warp(2.5, 5.0) == 5.0 and ramp_warp(1.0, 0.0) == 1.0


def test_ramp_up_count_matches_linear_intensity() -> None:
    # Expected arrivals by time t are rate * t^2 / (2T) during the ramp.
    rate, ramp = 50.0, 10.0
    counts = []
    for seed in range(10):
        offs = arrival_offsets(ArrivalSpec("poisson", rate=rate, ramp_up_s=ramp, seed=seed), 2000)
        counts.append(sum(1 for t in offs if t <= 6.0))  # type: ignore[union-attr]
    assert statistics.fmean(counts) == pytest.approx(rate * 36 / (2 * ramp), rel=0.05)


def test_trace_replays_arrival_s() -> None:
    spec = ArrivalSpec("trace", max_concurrency=2)
    assert spec.is_open_loop
    assert arrival_offsets(spec, 3, trace=[0.5, 0.5, 2]) == [0.5, 0.5, 2.0]
    with pytest.raises(ValueError, match=r"trace\[1\] is None: .*arrival_s"):
        arrival_offsets(spec, 2, trace=[0.0, None])
    with pytest.raises(ValueError, match=r"trace\[1\] arrival_s \(0.2\) < trace\[0\]"):
        arrival_offsets(spec, 2, trace=[1.0, 0.2])
    with pytest.raises(ValueError, match="trace has 1 entries but num_requests is 2"):
        arrival_offsets(spec, 2, trace=[1.0])
    with pytest.raises(ValueError, match="needs trace="):
        arrival_offsets(spec, 2)


@pytest.mark.parametrize(("kw", "msg"), [
    ({"mode": "closed"}, "concurrency (None) must be an integer >= 1"),
    ({"mode": "closed", "concurrency": 0}, "concurrency (0)"),
    ({"mode": "closed", "concurrency": 2, "rate": 1.0}, "rate (1.0) does not apply"),
    ({"mode": "closed", "concurrency": 2, "max_concurrency": 3}, "max_concurrency (3)"),
    ({"mode": "poisson"}, "rate (None) must be > 0"),
    ({"mode": "constant", "rate": 0.0}, "rate (0.0) must be > 0"),
    ({"mode": "gamma", "rate": 1.0, "burstiness": 0.0}, "burstiness (0.0) must be > 0"),
    ({"mode": "poisson", "rate": 1.0, "burstiness": 0.5}, "only applies to mode 'gamma'"),
    ({"mode": "poisson", "rate": 1.0, "concurrency": 2}, "concurrency (2) is for mode 'closed'"),
    ({"mode": "poisson", "rate": 1.0, "max_concurrency": 0}, "max_concurrency (0)"),
    ({"mode": "poisson", "rate": math.inf, "ramp_up_s": 1.0}, "needs a finite rate"),
    ({"mode": "poisson", "rate": 1.0, "ramp_up_s": -1.0}, "ramp_up_s (-1.0)"),
    ({"mode": "trace", "rate": 1.0}, "rate (1.0)"),
    ({"mode": "uniform", "rate": 1.0}, "mode ('uniform') must be one of"),
])
def test_validation_names_the_field(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        ArrivalSpec(**kw)
    assert msg in str(e.value)


def test_dict_round_trip_is_strict_json() -> None:
    for spec in (ArrivalSpec("closed", concurrency=8),
                 ArrivalSpec("gamma", rate=2.5, burstiness=0.5, max_concurrency=16,
                             ramp_up_s=3.0, seed=4),
                 ArrivalSpec("poisson", rate=math.inf)):
        d = json.loads(json.dumps(spec.to_dict(), allow_nan=False))
        assert ArrivalSpec.from_dict(d) == spec
    assert ArrivalSpec.from_dict({"mode": "poisson", "rate": "inf"}).rate == math.inf
    with pytest.raises(ValueError, match=r"unknown keys \['request_rate'\]"):
        ArrivalSpec.from_dict({"mode": "poisson", "request_rate": 1.0})
    with pytest.raises(ValueError, match="needs 'mode'"):
        ArrivalSpec.from_dict({"rate": 1.0})
