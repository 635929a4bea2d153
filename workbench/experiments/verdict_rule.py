"""The verdict's statistics: an interval for the relative effect, and what it says.

Place in the flow: `verdict.compare_metric` hands the valid repeats of the baseline and of a
variant here; `sequential` picks the error rate of each look; `verdict_sim` measures the rule.

The interval: a Welch t interval on the difference of the mean log values,

    d  = mean(log v) - mean(log b)
    se = sqrt(var(log v) / n_v + var(log b) / n_b)          (sample variances)
    df = Welch-Satterthwaite
    relative effect in [exp(d - t se) - 1, exp(d + t se) - 1],  t = t_{1 - alpha/2, df}

Why this one: latency and throughput are positive and their run-to-run noise is
multiplicative (a slow machine slows every request by a factor), so their logs are close to
normal, and the ratio of geometric means is the natural "x% faster". On normal logs Welch's
interval keeps close to its stated coverage (slightly above it: `verdict_sim` measures it) at
any n >= 2 per side, equal variances or not, where a bootstrap of 2..10 values has too few
distinct resamples and the Hodges-Lehmann interval cannot reach 95% at all below 4 + 4
repeats. Its error rate: in an
A/A comparison (no true effect) the interval excludes 0 with probability alpha (two-sided),
so a false "better" has probability alpha / 2. A metric with a value <= 0 (an error rate of
0) has no log: the same interval on the raw values, divided by |baseline mean|.

The outcomes, for a stated smallest effect of interest e (e.g. 0.02 = +-2%):

    interval excludes 0              -> "increase" | "decrease"  (better / worse by direction)
    interval inside [-e, +e]         -> "no change"   (an equivalence claim, TOST at alpha/2)
    otherwise, or < 2 repeats a side -> "undecided"   (too wide at this many repeats)
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

INCREASE, DECREASE, NO_CHANGE, UNDECIDED = "increase", "decrease", "no change", "undecided"
MAX_REPEATS_HINT = 100  # "more than 100 repeats per side": effectively never


@dataclass(frozen=True)
class Interval:
    """The relative effect's interval (variant vs baseline) and what it rests on."""

    low: float  # relative: -0.42 = 42% lower than the baseline
    high: float
    log_scale: bool  # False: raw values (some value <= 0)
    df: float  # Welch's degrees of freedom (inf: no variance, nan: < 2 repeats a side)


@functools.lru_cache(maxsize=4096)
def t_quantile(alpha: float, df: float) -> float:
    """t_{1 - alpha/2, df}: the two-sided critical value (cached: simulations ask often)."""
    return float(student_t.ppf(1.0 - alpha / 2.0, df))


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.variance(xs)


def welch(base: Sequence[float], var: Sequence[float]) -> tuple[float, float, float]:
    """(d, se, df) of mean(var) - mean(base); the caller checks n >= 2 each side."""
    mb, vb = _mean_var(base)
    mv, vv = _mean_var(var)
    qb, qv = vb / len(base), vv / len(var)
    se2 = qb + qv
    if se2 <= 0.0:
        return mv - mb, 0.0, math.inf
    df = se2 * se2 / (qb * qb / (len(base) - 1) + qv * qv / (len(var) - 1))
    return mv - mb, math.sqrt(se2), df


def effect_interval(base: Sequence[float], var: Sequence[float], alpha: float) -> Interval:
    """The (1 - alpha) interval of the relative effect; (-inf, inf) with < 2 values a side."""
    if len(base) < 2 or len(var) < 2:
        return Interval(-math.inf, math.inf, True, math.nan)
    if min(*base, *var) > 0.0:
        d, se, df = welch([math.log(x) for x in base], [math.log(x) for x in var])
        half = 0.0 if se == 0.0 else t_quantile(alpha, df) * se
        return Interval(math.expm1(d - half), math.expm1(d + half), True, df)
    d, se, df = welch(base, var)
    half = 0.0 if se == 0.0 else t_quantile(alpha, df) * se
    scale = abs(statistics.fmean(base))
    if scale == 0.0:  # a baseline of zeros: only the sign of the difference is known
        lo, hi = d - half, d + half
        return Interval(-math.inf if lo < 0 else 0.0, math.inf if hi > 0 else 0.0, False, df)
    return Interval((d - half) / scale, (d + half) / scale, False, df)


def classify(interval: Interval, smallest_effect: float) -> str:
    """"increase" | "decrease" | "no change" | "undecided" (module docstring)."""
    if interval.low > 0.0:
        return INCREASE
    if interval.high < 0.0:
        return DECREASE
    if -smallest_effect <= interval.low and interval.high <= smallest_effect:
        return NO_CHANGE
    return UNDECIDED


def repeats_to_decide(base: Sequence[float], var: Sequence[float], alpha: float,
                      smallest_effect: float) -> int | None:
    """About how many repeats per side would decide (exclude 0, or fit inside +-e) with the
    observed variance and effect on the log scale (raw scale with values <= 0); None with
    < 2 values a side (no variance to go by), MAX_REPEATS_HINT + 1 for "more than that"."""
    if len(base) < 2 or len(var) < 2:
        return None
    logs = min(*base, *var) > 0.0
    f = math.log if logs else float
    b, v = [f(x) for x in base], [f(x) for x in var]
    d = statistics.fmean(v) - statistics.fmean(b)
    s2 = (statistics.variance(b) + statistics.variance(v)) / 2.0
    scale = 1.0 if logs else abs(statistics.fmean(base)) or 1.0
    bound = math.log1p(smallest_effect) if logs else smallest_effect * scale
    for n in range(2, MAX_REPEATS_HINT + 1):
        half = t_quantile(alpha, 2 * n - 2) * math.sqrt(2.0 * s2 / n)
        if half < abs(d) or abs(d) + half < bound:
            return n
    return MAX_REPEATS_HINT + 1


def look_alpha(alpha: float, looks: int) -> float:
    """The error rate of each of `looks` planned looks (Bonferroni: over all the looks the
    chance of a false claim stays <= alpha; `sequential`)."""
    return alpha / looks


def percent(x: float) -> str:
    """+4.2%, -inf%: an interval end as the table shows it."""
    return f"{x:+.1%}" if math.isfinite(x) else ("+inf" if x > 0 else "-inf")
