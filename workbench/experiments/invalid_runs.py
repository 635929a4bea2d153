"""When runs come back INVALID, say what to do, and optionally measure them again.

Place in the flow (`stages.plan` and `stages.execute`, a plain experiment):

    check_load       before the first run: a 1 s watch of the other processes' CPU share
                     (`validity.load_before_start`, on a watch of its own); one warning line
                     when it already exceeds the threshold
    retry_disturbed  `--retry-invalid N`: after the template's repeats (before any adaptive
                     round), every disturbed run is measured again (the retries interleaved
                     among themselves: repeat by repeat, baseline and values in the plan's
                     order), up to N rounds; the new child is tagged
                     retry / retry_of, the old one `superseded` (never kept by --resume,
                     never judged); the parent's tag retried_runs counts them
    advice_line      after the verdict: one line, e.g. "3/3 invalid: rerun on a quieter
                     machine, or raise --max-other-cpu-share" (as `workbench sweep` says it)

Only disturbed runs (other processes took more than `max_other_cpu_share`) are retried: a
run whose client fell behind its schedule would fall behind again on the same template.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from workbench.experiments.resume import SUPERSEDED_TAG
from workbench.experiments.run_record import RunRecord
from workbench.harness.validity import busy_machine_line, invalid_advice, load_before_start

Key = tuple[str, int]  # (label, repeat)
# measure(kept records, {(label, repeat): tags}): every record, the missing ones measured
Measure = Callable[[dict[Key, RunRecord], dict[Key, dict[str, str]]], list[RunRecord]]


def check_load(watch: Any, threshold: float,
               say: Callable[[str], None] | None = None) -> float:
    """The other processes' share of the CPUs now (`validity.load_before_start`: a 1 s
    watch); one warning line (`validity.busy_machine_line`) when it exceeds `threshold`."""
    share = load_before_start(watch)
    line = busy_machine_line(share, threshold)
    if line is not None:
        (say or _stderr)(f"warning: {line}")
    return share


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def advice_line(runs: list[RunRecord]) -> str | None:
    """One line when runs are invalid: how many of how many, and what to do
    (`validity.invalid_advice` for disturbed runs, as `workbench sweep` says it)."""
    measured = [r for r in runs if r.error is None]
    behind = sum(not r.valid and not r.disturbed for r in measured)
    parts = [invalid_advice(sum(r.disturbed for r in measured), len(runs))]
    if behind:
        parts.append(f"{behind}/{len(runs)} invalid (the client fell behind its arrival "
                     "schedule): lower the arrival rate or raise max_concurrency")
    return "; ".join(p for p in parts if p) or None


def retry_disturbed(runs: list[RunRecord], retries: int, measure: Measure, store: Any,
                    parent: str, bar: Any = None, say: Callable[[str], None] = print
                    ) -> list[RunRecord]:
    """Up to `retries` rounds: the disturbed runs of `runs` (the template's repeats, in the
    plan's order) measured again through `measure(kept, tags)` (`run_jobs.run_plan` with
    every other record kept and `tags` per (label, repeat)), which returns the same list
    with each retried record replaced. `bar`: the `progress.RunProgress` whose total grows
    by the retries."""
    total = 0
    for attempt in range(1, retries + 1):
        bad = {(r.label, r.repeat): r for r in runs if r.error is None and r.disturbed}
        if not bad:
            break
        say(f"retry {attempt}/{retries}: measuring {len(bad)} disturbed run(s) again")
        if bar is not None:
            bar.add(len(bad))
        kept = {(r.label, r.repeat): r for r in runs if (r.label, r.repeat) not in bad}
        tags = {key: {"retry": str(attempt), "retry_of": old.run_id}
                for key, old in bad.items()}
        runs = measure(kept, tags)
        for r in runs:
            old = bad.get((r.label, r.repeat))
            if old is not None:
                store.set_tags(old.run_id, {SUPERSEDED_TAG: f"disturbed; retried as run "
                                                            f"{r.run_id}",
                                            "retried_by": r.run_id})
                total += 1
    if total:
        store.set_tags(parent, {"retried_runs": str(total)})
    return runs
