"""The step's overhead account: `duration_s` of one engine step split into STEP_PHASES,

    duration_s = schedule_s + prepare_inputs_s + forward_s + sample_s + update_s
                 + spec_propose_s + other_s

(`docs/step_account.md`). `step_account` computes it from the engine's boundaries and the
worker's phase times; each phase is a StepRecord field "<phase>_s" and the counter
`workbench:step_<phase>_time_seconds` sums it; `overhead_account(rows)` summarizes any rows
(ms per step, share of step time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypedDict

# The overhead account's phases, in step order; each is a StepRecord field "<phase>_s".
STEP_PHASES = ("schedule", "prepare_inputs", "forward", "sample", "update", "spec_propose",
               "other")
STEP_TIME = "workbench:step_time_seconds"
OVERHEAD_SHARE = "workbench:step_overhead_share"


class PhaseTimes(Protocol):
    """The worker's phase seconds of one step (`WorkerPhaseTimes`)."""

    prepare_inputs_s: float
    forward_s: float
    sample_s: float
    spec_propose_s: float


class HasPhaseTimes(Protocol):
    """A step's runner output (`ModelRunnerOutput`): its phase times."""

    @property
    def phase_times(self) -> PhaseTimes: ...


class StepRow(Protocol):
    """A step-trace row object (`StepRecord`)."""

    def as_dict(self) -> dict[str, Any]: ...


def phase_counter(phase: str) -> str:
    """The counter summing one phase's seconds: workbench:step_<phase>_time_seconds."""
    return f"workbench:step_{phase}_time_seconds"


class StepAccount(TypedDict):
    """StepRecord's phase fields (seconds), see STEP_PHASES."""

    schedule_s: float
    prepare_inputs_s: float
    forward_s: float
    sample_s: float
    update_s: float
    spec_propose_s: float
    other_s: float


def step_account(
    t0: float, t_scheduled: float, t_executed: float, t1: float, output: HasPhaseTimes | None,
) -> StepAccount:
    """A step's overhead account from the engine's boundaries: start, schedule() returned,
    execute_model returned, end; the runner's phases come from its output
    (`WorkerPhaseTimes`). `other_s` is the step minus every other phase (>= 0)."""
    w = output.phase_times if output is not None else None
    schedule, update = t_scheduled - t0, t1 - t_executed
    prepare, forward = (w.prepare_inputs_s, w.forward_s) if w else (0.0, 0.0)
    sample, propose = (w.sample_s, w.spec_propose_s) if w else (0.0, 0.0)
    other = max(0.0, (t1 - t0) - (schedule + prepare + forward + sample + update + propose))
    return StepAccount(schedule_s=schedule, prepare_inputs_s=prepare, forward_s=forward,
                       sample_s=sample, update_s=update, spec_propose_s=propose,
                       other_s=other)


def overhead_account(rows: Iterable[Mapping[str, Any] | StepRow]) -> dict[str, float]:
    """The overhead account of step-trace rows (`LLM.step_trace()`, `RunResult.step_trace`,
    StepRecords): over the rows that carry it (older rows without `forward_s` are left out),

        num_steps                   rows summed
        step_ms                     mean step duration, ms
        <phase>_ms                  mean seconds per step of each of STEP_PHASES, in ms
        <phase>_share               the phase's seconds / the steps' seconds
        overhead_share              (step - forward) / step: everything but the model forward

    Shares are 0.0 when the rows hold no time; every value is a float except num_steps.
    Phases sum to the step: sum(<phase>_ms) == step_ms (up to float rounding)."""
    n = 0
    step = 0.0
    sums = dict.fromkeys(STEP_PHASES, 0.0)
    for row in rows:
        r = row if isinstance(row, Mapping) else row.as_dict()
        if "forward_s" not in r:
            continue
        n += 1
        step += float(r["duration_s"])
        for phase in STEP_PHASES:
            sums[phase] += float(r.get(phase + "_s", 0.0))
    out: dict[str, float] = {"num_steps": n, "step_ms": 1e3 * step / n if n else 0.0}
    for phase in STEP_PHASES:
        out[phase + "_ms"] = 1e3 * sums[phase] / n if n else 0.0
    for phase in STEP_PHASES:
        out[phase + "_share"] = sums[phase] / step if step > 0 else 0.0
    out["overhead_share"] = (step - sums["forward"]) / step if step > 0 else 0.0
    return out
