r"""Goodput as DistServe defines it: the highest request rate a configuration serves while a
target share of its requests meets a per-request latency SLO.

Place in the flow: pure functions over the harness's per-request records (`RequestRecord`,
`workbench.harness.metrics`) and over attainment curves that a rate sweep
(`workbench.experiments.rate_sweep_run`) measures; no I/O.

    a request meets the SLO  success, TTFT <= ttft_ms and TPOT <= tpot_ms (bounds inclusive;
                             a request with one output token has no TPOT and meets that part;
                             the same test as vLLM's goodput, `metrics.SLO.is_good`)
    SLO attainment           requests meeting the SLO / ALL requests sent (failures and
                             requests never sent are misses)
    goodput                  from a sweep (rate, attainment) sorted by rate, target t:

        attainment
          1.0 |  o-----o
              |         \
            t |- - - - - -+- - - -    o  passing point (attainment >= t)
              |            \         x  failing point
              |             x        +  goodput: where the line from the highest passing
              +--r1----r2-g-r3->        point to the first failing point after it
                            rate        crosses t (linear interpolation)

      - every rate passes: the highest rate, flagged `lower_bound` (the true goodput is at
        least that; sweep higher rates to find it);
      - no rate passes: the line from (0, 1.0) (an idle server meets every SLO) to the first
        point, crossing t at r1 * (1 - t) / (1 - a1); 0.0 when t = 1.0;
      - a noisy curve that passes again after a failing point: the highest passing point counts
        (DistServe: the highest rate at which attainment >= t).

    per worker               goodput / num_workers (DistServe's per-GPU goodput, the number to
                             compare between configurations with different worker counts)

Noise bands across repeats: `attainment_band` gives (rate, median, min, max) per rate, and
`attainment_bands` the {label: [(rate, median, lo, hi), ...]} a plot draws.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workbench.harness.metrics import SLO, RequestRecord

__all__ = ["DIRECTIONS", "GoodputEstimate", "GoodputSLO", "attainment_band", "attainment_bands",
           "band_rows", "goodput", "meets_slo", "slo_attainment"]

Curve = Sequence[tuple[float, float]]  # (rate req/s, attainment), sorted by rate
Band = list[tuple[float, float, float, float]]  # (rate, median, min, max) per rate

# Better directions of the numbers a rate sweep reports (they are not per-run harness metrics,
# so the metric registry has no rows for them; the verdict reads these).
DIRECTIONS = {"goodput": "maximize", "goodput_per_worker": "maximize",
              "slo_attainment": "maximize"}


def _positive(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


@dataclass(frozen=True)
class GoodputSLO:
    """The per-request SLO of goodput and the share of requests that must meet it."""

    ttft_ms: float  # time to first token bound, ms (inclusive)
    tpot_ms: float  # time per output token bound, ms (inclusive)
    attainment: float = 0.9  # the share of requests that must meet both bounds, in (0, 1]

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if not _positive(value):
                raise ValueError(f"GoodputSLO {name} ({value!r}) must be a number > 0 ms")
        a = self.attainment
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a <= 1:
            raise ValueError(f"GoodputSLO attainment ({a!r}) must be a share in (0, 1], "
                             "e.g. 0.9 (90% of requests meet the SLO)")

    def as_slo(self) -> SLO:
        """The same bounds as the harness's `metrics.SLO` (vLLM's `request_goodput`)."""
        return SLO(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms)


def meets_slo(record: RequestRecord, slo: GoodputSLO) -> bool:
    """Succeeded, TTFT <= ttft_ms and TPOT <= tpot_ms (no TPOT with one output token)."""
    return record.success and slo.as_slo().is_good(record)


def slo_attainment(records: Sequence[RequestRecord], slo: GoodputSLO,
                   unsent_requests: int = 0) -> float:
    """The share of all requests (failed ones and `unsent_requests` count as misses) that
    meet `slo`. ValueError when no request was sent or asked for."""
    if not isinstance(unsent_requests, int) or unsent_requests < 0:
        raise ValueError(f"unsent_requests ({unsent_requests!r}) must be an integer >= 0")
    total = len(records) + unsent_requests
    if total == 0:
        raise ValueError("slo_attainment of no requests is undefined; send at least one")
    return sum(meets_slo(r, slo) for r in records) / total


@dataclass(frozen=True)
class GoodputEstimate:
    """A goodput read off a discrete sweep."""

    rate: float  # requests/s
    lower_bound: bool  # every swept rate met the target: the goodput is at least `rate`
    per_worker: float  # rate / num_workers


def _check_curve(curve: Curve) -> list[tuple[float, float]]:
    points = [(float(r), float(a)) for r, a in curve]
    if not points:
        raise ValueError("goodput needs an attainment curve with at least one (rate, attainment)")
    for i, (rate, att) in enumerate(points):
        if not _positive(rate):
            raise ValueError(f"curve[{i}] rate ({rate!r}) must be a number > 0 requests/s")
        if not 0 <= att <= 1:
            raise ValueError(f"curve[{i}] attainment ({att!r}) must be a share in [0, 1]")
        if i and rate <= points[i - 1][0]:
            raise ValueError(f"curve[{i}] rate ({rate}) must be > curve[{i - 1}] rate "
                             f"({points[i - 1][0]}): sort the curve by increasing rate")
    return points


def _crossing(r1: float, a1: float, r2: float, a2: float, target: float) -> float:
    """The rate where the line (r1, a1) -> (r2, a2) (a1 >= target > a2) crosses target."""
    return r1 + (a1 - target) * (r2 - r1) / (a1 - a2)


def goodput(curve: Curve, target: float, num_workers: int = 1) -> GoodputEstimate:
    """The highest rate with attainment >= `target`, interpolated between the swept rates as
    the module docstring draws it."""
    points = _check_curve(curve)
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1:
        raise ValueError(f"target ({target!r}) must be an attainment share in (0, 1]")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers ({num_workers!r}) must be an integer >= 1")
    passing = [i for i, (_, a) in enumerate(points) if a >= target]
    if not passing:
        rate, lower = _crossing(0.0, 1.0, *points[0], target), False
    elif passing[-1] == len(points) - 1:
        rate, lower = points[-1][0], True
    else:
        i = passing[-1]
        rate, lower = _crossing(*points[i], *points[i + 1], target), False
    return GoodputEstimate(rate, lower, rate / num_workers)


def attainment_band(curves: Sequence[Curve]) -> Band:
    """(rate, median, min, max) of the attainment at each rate over repeats (one curve per
    repeat, all over the same rates)."""
    if not curves:
        raise ValueError("attainment_band needs at least one curve (one per repeat)")
    rates = [r for r, _ in curves[0]]
    for i, c in enumerate(curves):
        if [r for r, _ in c] != rates:
            raise ValueError(f"curve {i} has rates {[r for r, _ in c]}, curve 0 has {rates}: "
                             "every repeat must sweep the same rates")
    band: Band = []
    for j, rate in enumerate(rates):
        values = [c[j][1] for c in curves]
        band.append((rate, statistics.median(values), min(values), max(values)))
    return band


def attainment_bands(curves: Mapping[str, Sequence[Curve]]) -> dict[str, Band]:
    """{label: [(rate, median, min, max), ...]}: the shape the attainment plot takes."""
    return {label: attainment_band(cs) for label, cs in curves.items()}


def band_rows(curves: Mapping[str, Sequence[Curve]], target: float,
              num_workers: int = 1) -> list[dict[str, float | str | bool]]:
    """One row per (label, rate): label, rate, attainment_median / _min / _max, and the
    label's goodput (median over repeats of each repeat's goodput), goodput_per_worker and
    goodput_lower_bound (any repeat's goodput a lower bound), repeated on its rows."""
    rows: list[dict[str, float | str | bool]] = []
    for label, cs in curves.items():
        estimates = [goodput(c, target, num_workers) for c in cs]
        med = statistics.median(e.rate for e in estimates)
        for rate, m, lo, hi in attainment_band(cs):
            rows.append({"label": label, "rate": rate, "attainment_median": m,
                         "attainment_min": lo, "attainment_max": hi, "goodput": med,
                         "goodput_per_worker": med / num_workers,
                         "goodput_lower_bound": any(e.lower_bound for e in estimates)})
    return rows
