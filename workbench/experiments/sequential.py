"""Adaptive repeats: while a variant's objective is undecided, measure another round.

Place in the flow: the execute stage (`stages.execute`) measures the template's `repeats`
rounds (`run_jobs.run_plan`), then hands the records here with a `measure_round` callback:

    look 1: verdict on the `repeats` rounds
    while some variant is "undecided" and rounds < max_repeats:
        one more interleaved round: baseline, then every undecided variant (same traffic)
        look k: verdict again on everything measured so far

The error rate stays what the template states: the design plans K = max_repeats - repeats + 1
looks and every look (the first one too, and any later verdict on the same runs, e.g. after
`--resume`) uses alpha / K (`verdict_rule.look_alpha`; Bonferroni). By the union bound the
chance that any of the K looks claims an effect that is not there is <= alpha, whenever the
experiment stops. Pocock's constant boundary would allow a somewhat larger rate per look, but
it is computed for equally spaced looks with a known variance; Bonferroni holds for any K,
any n >= 2 and a t interval, at some cost in power. `verdict_sim` measures the resulting
false-adoption rate and power. With max_repeats unset (= repeats) there is one look at the
full alpha, i.e. no extra rounds.

A variant that is rejected, adopted or inconclusive (disturbed runs) gets no more rounds. In a
rate-sweep template a round is a whole sweep (every rate) of the baseline and each undecided
variant (`rate_sweep_run.run_sweeps` with one round). `--resume` keeps any round an earlier
driver finished: `measure_round` skips the (label, repeat) pairs it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workbench.experiments.run_record import RunRecord, run_label
from workbench.experiments.template import Template
from workbench.experiments.verdict import judge_runs

# measure_round(repeat, plan): the records of one interleaved round of `plan` (label, value)
MeasureRound = Callable[[int, Sequence[tuple[str, Any]]], list[RunRecord]]


def undecided_values(template: Template, runs: Sequence[RunRecord],
                     baseline_label: str) -> list[Any]:
    """The variable values whose verdict on `runs` is "undecided" (the objective's interval
    too wide), in the template's order."""
    verdicts = judge_runs(template, list(runs), None, baseline_label)
    return [v.value for v in verdicts if v.undecided]


def add_rounds(template: Template, runs: list[RunRecord], plan: Sequence[tuple[str, Any]],
               measure_round: MeasureRound, say: Callable[[str], None] | None = None
               ) -> list[RunRecord]:
    """`runs` plus the extra rounds the adaptive design asks for (module docstring).
    `plan[0]` is the baseline's (label, None); `say` prints one line per added round."""
    baseline_label = plan[0][0]
    runs = list(runs)
    for repeat in range(template.repeats, template.repeat_cap):
        pending = undecided_values(template, runs, baseline_label)
        if not pending:
            break
        round_plan = [plan[0], *[(label, v) for label, v in plan[1:] if v in pending]]
        if say is not None:
            names = ", ".join(run_label(template, v) for v in pending)
            say(f"undecided after {repeat} repeats: {names}; round {repeat + 1} of up to "
                f"{template.repeat_cap} (baseline and the undecided variant(s))")
        runs += measure_round(repeat, round_plan)
    return runs
