"""Measure the verdict's rule by simulation: A/A false adoptions and the power to detect.

    python -m workbench.experiments.verdict_sim [--sims 4000] [--seed 0]

Each simulated experiment is a real template (objective p95_ttft_ms, minimize) judged by the
real code: `verdict.judge_runs` on `RunRecord`s, and for the adaptive design
`sequential.add_rounds` with a `measure_round` that draws one more round. Only the metric
values are simulated: each repeat's p95 TTFT is drawn by a `Draw` (injected; the default is
lognormal around 100 ms with a coefficient of variation of 3%, 10% or 25%: a quiet machine,
a typical one, and one as noisy as the issue's baseline repeats 74, 123, 90 ms, CV 27%).
A variant with effect -e draws from the same distribution times (1 - e).

    A/A        identical configurations (effect 0): every ADOPT is a false adoption
    power      effect -10% / -40% (the variant 10% / 40% faster): the share ADOPTed

`table` prints the markdown that docs/experiments.md shows.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.experiments.run_record import RunRecord
from workbench.experiments.sequential import add_rounds
from workbench.experiments.template import Template, parse_template
from workbench.experiments.verdict import judge_runs

METRIC = "p95_ttft_ms"
Draw = Callable[[random.Random, float], float]  # (rng, factor) -> one repeat's value


def lognormal(cv: float, median: float = 100.0) -> Draw:
    """One repeat's value: median * factor * exp(N(0, sigma)), sigma from the CV."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return lambda rng, factor: median * factor * math.exp(rng.gauss(0.0, sigma))


def sim_template(repeats: int, max_repeats: int | None = None, alpha: float = 0.05,
                 smallest_effect: float = 0.02) -> Template:
    """A minimal template: one variant, the objective p95 TTFT (minimize), no SLO."""
    data: dict[str, Any] = {
        "name": "verdict-sim", "question": "A/A and power of the verdict",
        "objective": {"metric": METRIC, "direction": "minimize"},
        "workload": {"fixture": "balanced-chat"}, "baseline": {"enable_prefix_caching": False},
        "variable": {"name": "enable_prefix_caching", "values": [True]},
        "repeats": repeats, "alpha": alpha, "smallest_effect": smallest_effect}
    if max_repeats is not None:
        data["max_repeats"] = max_repeats
    return parse_template(data)


@dataclass
class Tally:
    """Decisions over `sims` simulated experiments of one design and effect."""

    sims: int = 0
    adopt: int = 0
    worse: int = 0  # rejected: the objective worse
    no_change: int = 0  # rejected: the objective inside +-smallest_effect
    undecided: int = 0
    repeats: int = 0  # repeats per side, summed

    def share(self, n: int) -> float:
        return n / self.sims if self.sims else 0.0


def one_experiment(template: Template, draw: Draw, effect: float, rng: random.Random
                   ) -> tuple[str, int]:
    """(the variant's decision or its objective's verdict, repeats per side) of one
    simulated experiment: the template's repeats interleaved, then its adaptive rounds."""

    def round_of(repeat: int, plan: Sequence[tuple[str, Any]]) -> list[RunRecord]:
        return [RunRecord(label, value, repeat, f"{label}-{repeat}",
                          metrics={METRIC: draw(rng, 1.0 if value is None else 1.0 - effect)})
                for label, value in plan]

    plan = [("baseline", None), ("True", True)]
    runs = [r for repeat in range(template.repeats) for r in round_of(repeat, plan)]
    runs = add_rounds(template, runs, plan, round_of)
    (vv,) = judge_runs(template, runs)
    word = "ADOPT" if vv.adopted else vv.metrics[METRIC].verdict
    return word, vv.valid_runs


def simulate(template: Template, draw: Draw, effect: float, sims: int, seed: int = 0
             ) -> Tally:
    """`sims` experiments with one seeded generator: the same seed, the same tally."""
    rng = random.Random(seed)
    tally = Tally()
    for _ in range(sims):
        word, n = one_experiment(template, draw, effect, rng)
        tally.sims += 1
        tally.repeats += n
        tally.adopt += word == "ADOPT"
        tally.worse += word == "worse"
        tally.no_change += word == "no change"
        tally.undecided += word == "undecided"
    return tally


DESIGNS = ((3, None), (5, None), (10, None), (3, 10))  # (repeats, max_repeats)
CVS = (0.03, 0.10, 0.25)
EFFECTS = (0.10, 0.40)


def table(sims: int, seed: int = 0, cvs: Sequence[float] = CVS,
          designs: Sequence[tuple[int, int | None]] = DESIGNS) -> str:
    """Markdown: per noise CV and design, the A/A outcome shares and the power."""
    head = ["noise CV", "repeats", "A/A: false ADOPT", "A/A: worse", "A/A: no change",
            "A/A: undecided", "power -10%", "power -40%", "mean repeats (A/A, -10%, -40%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cv in cvs:
        for repeats, cap in designs:
            t = sim_template(repeats, cap)
            aa = simulate(t, lognormal(cv), 0.0, sims, seed)
            hits = [simulate(t, lognormal(cv), e, sims, seed + 1 + i)
                    for i, e in enumerate(EFFECTS)]
            used = ", ".join(f"{x.repeats / x.sims:.1f}" for x in (aa, *hits))
            design = f"{repeats}" if cap is None else f"{repeats} -> {cap} (adaptive)"
            lines.append("| " + " | ".join([
                f"{cv:.0%}", design, f"{aa.share(aa.adopt):.1%}", f"{aa.share(aa.worse):.1%}",
                f"{aa.share(aa.no_change):.1%}", f"{aa.share(aa.undecided):.1%}",
                *(f"{h.share(h.adopt):.1%}" for h in hits), used]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m workbench.experiments.verdict_sim",
                                 description="A/A false adoptions and power of the verdict")
    ap.add_argument("--sims", type=int, default=4000, help="experiments per cell")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.sims < 1:
        ap.error(f"--sims ({args.sims}) must be >= 1")
    print(table(args.sims, args.seed))
    print(f"\n{args.sims} simulated experiments per cell, seed {args.seed}; lognormal noise "
          "around 100 ms; alpha 0.05, smallest_effect 0.02; objective minimized.")


if __name__ == "__main__":
    main()
