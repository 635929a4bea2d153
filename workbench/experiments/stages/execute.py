"""The runner's third stage: every measured run of the experiment.

    execute(ctx, ex, plan, parent, run_point=run_one, retry_invalid=N) -> Executed

A plain experiment: the template's repeats, interleaved, on the executor (`run_jobs.run_plan`;
the runs a resumed parent kept are not measured again); `--retry-invalid N`: its disturbed
runs measured again (`invalid_runs.retry_disturbed`); then, while a variant is undecided, one
more round of the baseline and the undecided variant(s) (`sequential.add_rounds`).
A rate sweep: one sweep child per (value, repeat) with a point per rate
(`rate_sweep_run.run_sweeps`), then its adaptive rounds (whole sweeps).

`run_point` measures one run (`child_run.run_one`'s signature); the runner hands in its own
`run_one` so that a test may replace it there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.experiments import invalid_runs, rate_sweep_run
from workbench.experiments.child_run import RunContext
from workbench.experiments.executors.base import Executor
from workbench.experiments.progress import RunProgress
from workbench.experiments.rate_sweep_run import RateSweepResult
from workbench.experiments.run_jobs import run_plan
from workbench.experiments.run_record import RunRecord
from workbench.experiments.sequential import add_rounds
from workbench.experiments.stages.plan import Plan
from workbench.experiments.stages.resume import Parent

Key = tuple[str, int]  # (label, repeat)


@dataclass(frozen=True)
class Executed:
    """The execute stage's output: every record in the interleaved order (kept ones too)."""

    runs: list[RunRecord]
    sweep: RateSweepResult | None = None  # a rate sweep's points and curves


def execute(ctx: RunContext, ex: Executor, plan: Plan, parent: Parent, *,
            run_point: Callable[..., RunRecord], retry_invalid: int = 0) -> Executed:
    """`Executed` (module docstring); a progress bar of runs when `ctx.progress`."""
    t = ctx.template
    points = len(t.rate_sweep.rates) if t.rate_sweep is not None else 1
    total = (t.repeats * len(plan.values) * points
             - sum(r < t.repeats for _, r in parent.kept))
    bar = RunProgress(total, enabled=ctx.progress, desc=t.name)
    try:
        if t.rate_sweep is not None:
            return _sweeps(ctx, plan, bar, points, run_point)
        return Executed(_plain(ctx, ex, plan, parent, bar, run_point, retry_invalid))
    finally:
        bar.close()


def _sweeps(ctx: RunContext, plan: Plan, bar: RunProgress, points: int,
            run_point: Callable[..., RunRecord]) -> Executed:
    sweep = rate_sweep_run.run_sweeps(ctx, plan.values, bar, run_point=run_point)

    def sweep_round(repeat: int, sub: Sequence[tuple[str, Any]]) -> list[RunRecord]:
        bar.add(len(sub) * points)
        done = len(sweep.runs)
        rate_sweep_run.run_sweeps(ctx, sub, bar, run_point=run_point, rounds=[repeat],
                                  result=sweep)
        return sweep.runs[done:]

    runs = add_rounds(ctx.template, list(sweep.runs), plan.values, sweep_round, say=bar.line)
    return Executed(runs, sweep)


def _plain(ctx: RunContext, ex: Executor, plan: Plan, parent: Parent, bar: RunProgress,
           run_point: Callable[..., RunRecord], retry_invalid: int) -> list[RunRecord]:
    """The interleaved runs, here or on a cluster (`run_jobs`), their retries and rounds."""
    def measure(values: Any, kept: dict[Key, RunRecord], **kw: Any) -> list[RunRecord]:
        return run_plan(ex, ctx, plan.replay.arrival, plan.replay.slo, values, bar,
                        run_point=run_point, kept=kept, **kw)

    runs = measure(plan.values, parent.kept)

    def again(keep: dict[Key, RunRecord], tags: dict[Key, dict[str, str]]) -> list[RunRecord]:
        return measure(plan.values, keep, tags=tags)

    runs = invalid_runs.retry_disturbed(runs, retry_invalid, again, ctx.store, ctx.parent,
                                        bar, bar.line if ctx.progress else print)

    def one_round(repeat: int, sub: Sequence[tuple[str, Any]]) -> list[RunRecord]:
        bar.add(sum((label, repeat) not in parent.kept for label, _ in sub))
        return measure(sub, parent.kept, rounds=[repeat])

    return add_rounds(ctx.template, runs, plan.values, one_round, say=bar.line)  # undecided
