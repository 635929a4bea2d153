"""Validity of one benchmark run: did the client actually send the traffic it was asked to?

Place in the flow: the runner calls `check_validity` after a run; an invalid run stays in the
results, marked, with one sentence per reason (the runner also warns loudly).

Open loop only (a closed loop sends whenever a worker is free, so it cannot fall behind):
- target rate: the rate the schedule asked for, (n - 1) / span of the scheduled offsets
  (equal to `arrival.rate` for "constant"; for Poisson/gamma the rate of the actual draw, so a
  short run is not flagged for the draw's randomness);
- achieved rate: (n - 1) / (last actual send - first scheduled offset) over requests sent;
- invalid when achieved < 95% of target, or median lateness (send - scheduled) > the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workbench.bench.arrivals import ArrivalSpec
from workbench.bench.metrics import RequestRecord

MIN_RATE_FRACTION = 0.95


@dataclass
class Validity:
    """valid is False when any reason was found; rates in requests/s, lateness in seconds."""

    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    target_rate: float | None = None
    achieved_rate: float | None = None
    median_lateness_s: float | None = None
    p95_lateness_s: float | None = None

    def invalidate(self, reason: str) -> None:
        self.valid = False
        self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_validity(
    records: Sequence[RequestRecord],
    arrival: ArrivalSpec,
    duration_s: float,
    max_median_lateness_s: float = 0.05,
) -> Validity:
    """Judge whether an open-loop run kept its schedule (a closed loop is always valid here).

    Records without a target_arrival_s (never scheduled) are ignored. duration_s (the run's
    wall time) is accepted for symmetry with `compute_metrics`; the criteria use the schedule.
    """
    if max_median_lateness_s < 0:
        raise ValueError(f"max_median_lateness_s ({max_median_lateness_s}) must be >= 0")
    out = Validity()
    if not arrival.is_open_loop:
        return out
    sent = [r for r in records if r.target_arrival_s is not None]
    if not sent:
        return out
    targets = np.array([r.target_arrival_s for r in sent], dtype=float)
    starts = np.array([r.start_s for r in sent], dtype=float)
    lateness = starts - targets
    out.median_lateness_s = float(np.median(lateness))
    out.p95_lateness_s = float(np.percentile(lateness, 95))
    n = len(sent)
    target_span = float(targets.max() - targets.min())
    sent_span = float(starts.max() - targets.min())
    if n >= 2 and target_span > 0 and sent_span > 0:
        out.target_rate = (n - 1) / target_span
        out.achieved_rate = (n - 1) / sent_span
        if out.achieved_rate < MIN_RATE_FRACTION * out.target_rate:
            out.invalidate(
                f"achieved send rate {out.achieved_rate:.3g} req/s is below "
                f"{MIN_RATE_FRACTION:.0%} of the target {out.target_rate:.3g} req/s: the client "
                "fell behind the arrival schedule (raise max_concurrency or lower the rate)"
            )
    if out.median_lateness_s > max_median_lateness_s:
        out.invalidate(
            f"median lateness {out.median_lateness_s * 1e3:.1f} ms (p95 "
            f"{out.p95_lateness_s * 1e3:.1f} ms) exceeds {max_median_lateness_s * 1e3:.1f} ms: "
            "requests were sent later than scheduled (a concurrency cap or a busy client)"
        )
    return out
