"""Did a rerun reproduce the logged numbers? `same` or `drifted (+x.x%)` per metric.

Place in the flow: `workbench rerun` (experiments/rerun.py) measures a logged run again and
hands the logged and the new values here; the judgement is the verdict's own
(`verdict.compare_metric`, the template's `noise` method), with the logged value in the place
of the baseline and the new value in the place of the variant:

    logged samples  the logged repeats of that configuration (an experiment's child runs of
                    one value), moved to centre on the value the table shows as `logged` (the
                    run asked for, or the median of the repeats for a parent run)
    noise band      their spread (`noise: spread`) or a bootstrap interval (`bootstrap`);
                    with one logged sample (a sweep point, `repeats: 1`) the new repeats'
                    spread serves (`--repeats 3`); with one of each there is no band and any
                    change counts as drift
    verdict         the band excludes zero -> "drifted (+4.2%)"; else "same"
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from workbench.experiments.results import text_table
from workbench.experiments.verdict import MetricVerdict, compare_metric

SAME = "same"
NOT_MEASURED = "not measured"


@dataclass
class Drift:
    """One row of the rerun table."""

    config: str  # the configuration: "baseline (256)", "budget=64", a sweep point's name
    metric: str
    logged: float
    now: float | None  # the median of the new valid repeats; None: none succeeded
    delta_pct: float | None  # (now - logged) / logged in %; None when logged is 0 or now None
    verdict: str  # "same" | "drifted (+4.2%)" | "drifted (from 0)" | "not measured"
    noise: str  # where the band came from: "3 logged repeats", "2 new repeats", "none"

    @property
    def drifted(self) -> bool:
        return self.verdict.startswith("drifted")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reference(logged: Sequence[float], center: float, now: Sequence[float]
              ) -> tuple[list[float], str]:
    """The baseline sample `compare_metric` judges against, and its source: the logged
    repeats (>= 2), else the new repeats (>= 2), else `center` alone; moved so that its
    median is `center`."""
    if len(logged) >= 2:
        sample, noise = list(logged), f"{len(logged)} logged repeats"
    elif len(now) >= 2:
        sample, noise = list(now), f"{len(now)} new repeats"
    else:
        return [center], "none"
    shift = center - statistics.median(sample)
    return ([x + shift for x in sample] if shift else sample), noise


def drift(config: str, metric: str, center: float, logged: Sequence[float],
          now: Sequence[float], method: str = "spread") -> Drift:
    """The row for one metric: `center` is the logged value shown, `logged` the logged
    repeats of that configuration (their spread is the noise), `now` the new valid values."""
    if not now:
        return Drift(config, metric, center, None, None, NOT_MEASURED, "-")
    base, noise = reference(logged, center, now)
    m: MetricVerdict = compare_metric(metric, base, list(now), method)
    pct = 100.0 * (m.variant_median - center) / center if center else None
    if m.verdict == "no change":
        word = SAME
    else:
        word = "drifted (from 0)" if pct is None else f"drifted ({pct:+.1f}%)"
    return Drift(config, metric, center, m.variant_median, pct, word, noise)


def drift_table(rows: Sequence[Drift]) -> str:
    """Markdown: metric | logged | now | delta % | verdict (a `config` column first when the
    rows cover more than one configuration)."""
    many = len({r.config for r in rows}) > 1
    cols = (["config"] if many else []) + ["metric", "logged", "now", "delta %", "verdict"]
    table = [{"config": r.config, "metric": r.metric, "logged": r.logged, "now": r.now,
              "delta %": "-" if r.delta_pct is None else f"{r.delta_pct:+.1f}",
              "verdict": r.verdict} for r in rows]
    return text_table(table, cols)


def summary_line(rows: Sequence[Drift]) -> str:
    """"same: every metric within noise" | "drifted: 3 of 10 metrics beyond noise (...)" |
    "not measured: ..." (the new runs failed)."""
    missing = [r for r in rows if r.verdict == NOT_MEASURED]
    drifted = [r for r in rows if r.drifted]
    if not rows:
        return "nothing to compare: the run logged none of the metrics measured now"
    if missing:
        return (f"not measured: {len(missing)} of {len(rows)} metrics have no valid new run "
                "(failed, or disturbed by other processes: see above)")
    if not drifted:
        return f"same: every metric ({len(rows)}) within noise"
    many = len({r.config for r in rows}) > 1
    names = ", ".join(f"{r.metric} [{r.config}]" if many else r.metric for r in drifted[:4])
    more = "" if len(drifted) <= 4 else ", ..."
    return f"drifted: {len(drifted)} of {len(rows)} metrics beyond noise ({names}{more})"


def noise_line(rows: Sequence[Drift]) -> str:
    """Where the noise bands came from; with none, how to get one."""
    sources = sorted({r.noise for r in rows if r.now is not None})
    if not sources:
        return "noise band: none (nothing measured)"
    if "none" in sources:
        return ("noise band: none where one value was logged and one measured: any change "
                "counts as drift (--repeats 3 gives a band)")
    return "noise band: the spread of " + ", ".join(sources)


def verdict_word(rows: Sequence[Drift]) -> str:
    """One word for the whole rerun: same | drifted | failed (a metric was not measured) |
    none (nothing to compare: the run logged none of the metrics)."""
    if not rows:
        return "none"
    if any(r.verdict == NOT_MEASURED for r in rows):
        return "failed"
    return "drifted" if any(r.drifted for r in rows) else SAME

