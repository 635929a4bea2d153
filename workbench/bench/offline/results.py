"""The offline benchmark's results: timed runs, one row per system, the validity judgement
and the Markdown table (`workbench/bench/offline.py` runs the systems and prints them).

Owned here: `timed` (one warm-up, then `RunPolicy.runs` kept runs, each with the share of
the CPUs other processes used; a disturbed run is redone while retries last, then kept and
marked; `record_steps` / `timed_step_account`: the engine's step account over its timed
calls), `SystemResult` (a system's runs and figures: medians over its undisturbed runs
only, NaN when there is none), `judge` (INVALID when a kept run was disturbed), the greedy
token comparison, and `table` ("—" where no undisturbed run gives a figure; no roofline
fraction when the roofline was refused; the engine's overhead share from its step account,
"—" for the other systems).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from workbench.harness.validity import CpuWatch, cpu_reason, default_cpu_watch, disturbed_line
from workbench.metrics.stats import EngineStats, StepRecord
from workbench.metrics.step_account import overhead_account

NO_FIGURE = "\u2014"  # what the table prints where no undisturbed run gives a figure


def _median_or_nan(values: Sequence[float]) -> float:
    return median(values) if values else float("nan")


def _clean(run_s: Sequence[float], shares: Sequence[float], max_others: float) -> list[float]:
    """The runs whose others' share is not above `max_others` (NaN: not measured, kept;
    runs without a share, e.g. a peer that reports only its worst, are kept too)."""
    return [t for i, t in enumerate(run_s)
            if not (i < len(shares) and shares[i] > max_others)]


@dataclass
class SystemResult:
    """One system's medians; `run_s` / `single_run_s` are the kept timed runs in seconds and
    `run_others` / `single_run_others` the share of the CPUs other processes used in each
    (NaN: not measured). Medians count only runs not above `max_others` (set by `judge`)."""

    name: str
    run_s: list[float]
    single_run_s: list[float]
    output_tokens: int
    total_tokens: int
    single_tokens: int
    load_s: float = 0.0
    others_cpu: float = float("nan")  # share of all CPUs other processes used in the runs
    run_others: list[float] = field(default_factory=list)
    single_run_others: list[float] = field(default_factory=list)
    max_others: float = math.inf  # the threshold the runs are judged by
    preload: str = ""  # vLLM peers: the LD_PRELOAD libraries that ran ("none", "unknown")
    mismatches: int | None = None  # requests whose tokens differ from the reference
    # where they differ: {request, position (first differing token), got, want}
    mismatch_details: list[dict[str, int | None]] = field(default_factory=list)
    unstable_runs: int = 0  # calls (warm-up included) whose tokens differ from the warm-up's
    valid: bool = True  # False: other processes took more than --max-others in a kept run
    invalid_reason: str = ""
    notes: str = ""
    # the engine's step account over its timed workload runs
    # (`metrics.step_account.overhead_account`: ms per step and share of step time per phase,
    # overhead_share); None for other systems
    step_account: dict[str, float] | None = None
    token_ids: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def clean_run_s(self) -> list[float]:
        """The kept runs other processes did not disturb: the only ones medians use."""
        return _clean(self.run_s, self.run_others, self.max_others)

    @property
    def clean_single_run_s(self) -> list[float]:
        return _clean(self.single_run_s, self.single_run_others, self.max_others)

    @property
    def disturbed_runs(self) -> int:
        """Kept runs (workload and single request) above `max_others`."""
        return (len(self.run_s) - len(self.clean_run_s)
                + len(self.single_run_s) - len(self.clean_single_run_s))

    @property
    def display_name(self) -> str:
        return f"{self.name} (preload: {self.preload})" if self.preload else self.name

    @property
    def output_tok_s(self) -> float:
        """Over the undisturbed runs' median; NaN when there is none."""
        return self.output_tokens / _median_or_nan(self.clean_run_s)

    @property
    def total_tok_s(self) -> float:
        return self.total_tokens / _median_or_nan(self.clean_run_s)

    @property
    def single_ms_per_token(self) -> float:
        return 1000.0 * _median_or_nan(self.clean_single_run_s) / self.single_tokens

    def to_json(self) -> dict[str, Any]:
        """Every field, the three figures (None where no undisturbed run gives one) and how
        many runs they are medians of; NaN shares as None."""
        doc = asdict(self)
        for key in ("others_cpu", "max_others"):
            doc[key] = _finite_or_none(doc[key])
        for key in ("run_others", "single_run_others"):
            doc[key] = [_finite_or_none(v) for v in doc[key]]
        return {**doc, "output_tok_s": _finite_or_none(self.output_tok_s),
                "total_tok_s": _finite_or_none(self.total_tok_s),
                "single_ms_per_token": _finite_or_none(self.single_ms_per_token),
                "median_of_runs": len(self.clean_run_s),
                "median_of_single_runs": len(self.clean_single_run_s),
                "disturbed_runs": self.disturbed_runs}


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class RunPolicy:
    """How each system is timed: `runs` timed runs after one warm-up; a run during which
    other processes used more than `max_others` of the CPUs is redone, `retries` times at
    most in all (the 2 cores are shared, and a busy core slows torch several-fold); a
    system whose kept runs are still above it is invalid. `watch` measures the share
    (default: `validity.default_cpu_watch()`; tests inject a fake)."""

    runs: int = 3
    max_others: float = 0.15
    retries: int = 3
    watch: CpuWatch | None = field(default=None, compare=False)


@dataclass
class TimedRuns:
    """`timed`'s answer: the kept runs' seconds and others' CPU share each (NaN: not
    measured), the last output, and how many calls (redone ones included) returned other
    tokens than the warm-up (greedy decoding must be deterministic: anything but 0 is a bug
    to chase)."""

    run_s: list[float]
    others: list[float]
    out: list[list[int]]
    unstable: int = 0
    redone: int = 0

    @property
    def worst(self) -> float:
        """The largest share of the CPUs others used in a kept run (NaN: none measured)."""
        w = float("nan")
        for share in self.others:
            w = worse(w, share)
        return w


def timed(fn: Callable[[], list[list[int]]], policy: RunPolicy) -> TimedRuns:
    """One warm-up call, then `policy.runs` kept timed calls; a call disturbed by other
    processes is redone while retries last, after that it is kept, marked by its share."""
    watch = policy.watch if policy.watch is not None else default_cpu_watch()
    out = first = fn()
    unstable = redone = 0
    times: list[float] = []
    shares: list[float] = []
    while len(times) < policy.runs:
        with watch.measure() as share:
            t0 = time.perf_counter()
            out = fn()
            elapsed = time.perf_counter() - t0
        unstable += out != first
        if share.others > policy.max_others and redone < policy.retries:  # NaN: kept
            redone += 1
            print(f"  (run redone: other processes used {100 * share.others:.0f}% of the CPUs)")
            continue
        times.append(elapsed)
        shares.append(share.others)
    return TimedRuns(times, shares, out, unstable, redone)


def record_steps(stats: EngineStats, fn: Callable[[], list[list[int]]],
                 calls: list[list[StepRecord]]) -> Callable[[], list[list[int]]]:
    """`fn`, appending to `calls` the engine step records (`stats.step_trace`) each of its
    calls made."""
    def call() -> list[list[int]]:
        first = stats.num_steps
        out = fn()
        trace = stats.step_trace
        n = min(stats.num_steps - first, len(trace))
        calls.append(list(itertools.islice(trace, len(trace) - n, len(trace))))
        return out
    return call


def timed_step_account(calls: list[list[StepRecord]]) -> dict[str, float]:
    """`overhead_account` of the steps of every call after the first (`timed`'s warm-up),
    redone calls included."""
    return overhead_account(row for rows in calls[1:] for row in rows)


def worse(a: float, b: float) -> float:
    """The larger share, a NaN (not measured) counting only when both are."""
    return a if math.isnan(b) else b if math.isnan(a) else max(a, b)


def judge(results: list[SystemResult], max_others: float) -> list[str]:
    """Judge every system's runs by `max_others`: a system with a kept run above it is
    invalid, and its medians use only its runs below it; the console lines that say so."""
    lines = []
    for r in results:
        r.max_others = max_others
        worst = worse(r.others_cpu, max((s for s in r.run_others + r.single_run_others
                                         if not math.isnan(s)), default=float("nan")))
        r.others_cpu = worst
        if worst > max_others:  # NaN (not measured) is never above
            r.valid, r.invalid_reason = False, cpu_reason(worst, max_others)
            kept = len(r.clean_run_s)
            tail = (f" (the table shows the median of its {kept} undisturbed "
                    f"run{'s' if kept != 1 else ''})" if kept
                    else " (no undisturbed run: no figure)")
            lines.append(disturbed_line(f"system {r.name}", worst, max_others) + tail)
    return lines


def mark_mismatches(results: list[SystemResult]) -> None:
    """Count, per system, the requests whose greedy tokens differ from the reference's."""
    if not results:
        return
    ref = results[0].token_ids
    for r in results:
        r.mismatch_details = mismatch_details(r.token_ids, ref)
        r.mismatches = len(r.mismatch_details)


def mismatch_details(ids: list[list[int]], ref: list[list[int]]) -> list[dict[str, int | None]]:
    """One row per request whose tokens differ from `ref`'s: its index, the first differing
    position, and the two tokens there (None past the end of the shorter output)."""
    rows: list[dict[str, int | None]] = []
    for i, (a, b) in enumerate(zip(ids, ref, strict=True)):
        if a == b:
            continue
        pairs = enumerate(zip(a, b, strict=False))  # outputs may differ in length
        pos = next((j for j, (x, y) in pairs if x != y), min(len(a), len(b)))
        rows.append({"request": i, "position": pos,
                     "got": a[pos] if pos < len(a) else None,
                     "want": b[pos] if pos < len(b) else None})
    return rows


def _fig(x: float, fmt: str) -> str:
    """`x` formatted (a trailing "%" in `fmt` is appended), or NO_FIGURE when not finite."""
    if not math.isfinite(x):
        return NO_FIGURE
    return format(x, fmt[:-1]) + "%" if fmt.endswith("%") else format(x, fmt)


def table(results: list[SystemResult], roofline_tok_s: float | None) -> str:
    """One row per system; an invalid system's row says INVALID, its figures are medians of
    its undisturbed runs ("—" when none) and no speed-up involving it is computed.
    `roofline_tok_s` None: the roofline was refused, no fraction is printed. "overhead share":
    the share of step time outside the model forward (`SystemResult.step_account`; "—" for
    a system without one)."""
    ref = results[0]
    head = ("| system | output tok/s | total tok/s | single ms/token | "
            f"{ref.name} speed-up | % roofline | mismatches | others' CPU | overhead share |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = ref.output_tok_s / r.output_tok_s
        speedup = ("n/a (invalid)" if not (r.valid and ref.valid)
                   else f"{ratio:.2f}x" if math.isfinite(ratio) else NO_FIGURE)
        roof = ("n/a (roofline invalid)" if roofline_tok_s is None
                else _fig(100 * r.output_tok_s / roofline_tok_s, ".1f%"))
        others = ("-" if math.isnan(r.others_cpu) else f"{100 * r.others_cpu:.0f}%") + (
            "" if r.valid else " INVALID")
        overhead = (NO_FIGURE if not r.step_account or not r.step_account.get("num_steps")
                    else _fig(100 * r.step_account["overhead_share"], ".1f%"))
        lines.append(
            f"| {r.display_name} | {_fig(r.output_tok_s, '.1f')} | "
            f"{_fig(r.total_tok_s, '.1f')} | {_fig(r.single_ms_per_token, '.2f')} | "
            f"{speedup} | {roof} | "
            f"{r.mismatches}/{len(ref.token_ids)} | {others} | {overhead} |")
    return "\n".join(lines)
