"""The verdict as people read it: the rule in one line, the table, the parent's summary.

Place in the flow: `runner` judges the runs (`verdict.judge_runs`) and writes these to
VERDICT.md, the console and the parent run's description: `rule_text` (the interval, alpha
over the planned looks, the smallest effect), `verdict_table` (a baseline row, then per
variant and metric `median (effect [interval], verdict)`, the decision and why) and
`verdict_summary` (the answer first).
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.experiments import verdict_rule as rule
from workbench.experiments.labels import value_label
from workbench.experiments.template import Template
from workbench.experiments.verdict import MetricVerdict, VariantVerdict


def rule_text(template: Template) -> str:
    """One line that states the verdict's rule for this template (VERDICT.md, the console)."""
    looks = template.planned_looks
    alpha = rule.look_alpha(template.alpha, looks)
    split = f", split over {looks} looks: {alpha:.3g} each" if looks > 1 else ""
    rounds = (f"repeats {template.repeats}, up to {template.repeat_cap} while undecided"
              if looks > 1 else f"repeats {template.repeats}")
    return (f"Rule: a {(1 - alpha) * 100:.4g}% Welch t interval of the relative effect on "
            f"log values (alpha {template.alpha:g}{split}); better/worse: it excludes 0; "
            f"no change: it lies inside +-{template.smallest_effect:.1%} (smallest_effect); "
            f"undecided: neither; {rounds}.")


def _cell(m: MetricVerdict) -> str:
    return (f"{m.variant_median:.4g} ({m.relative_effect:+.1%} "
            f"[{rule.percent(m.effect_low)}, {rule.percent(m.effect_high)}], {m.verdict})")


def verdict_table(verdicts: list[VariantVerdict], objective: str,
                  columns: Sequence[str] | None = None, *, baseline: str | None = None
                  ) -> str:
    """Markdown: a baseline row (`baseline`: its label; the medians over its valid repeats),
    then one row per variant with the objective, the tails (or `columns`) as median (effect
    [interval], verdict), and the decision."""
    cols = list(dict.fromkeys([objective, *(columns if columns is not None else (
        "p95_ttft_ms", "p95_tpot_ms", "p95_itl_ms", "output_throughput"))]))
    head = ["value", *cols, "decision", "why"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    values = [v.value for v in verdicts]
    if baseline is not None and verdicts:
        cells = [baseline]
        for c in cols:
            m = next((v.metrics[c] for v in verdicts if c in v.metrics), None)
            cells.append("-" if m is None else f"{m.baseline_median:.4g}")
        n = max(v.baseline_valid_runs for v in verdicts)
        cells += ["baseline", f"{n} valid repeat(s); medians"]
        lines.append("| " + " | ".join(cells) + " |")
    for v in verdicts:
        cells = [value_label(v.variable, v.value, values)]  # never a dict's repr
        for c in cols:
            m = v.metrics.get(c)
            cells.append("-" if m is None else _cell(m))
        cells += [v.decision, v.reason]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict_summary(verdicts: list[VariantVerdict], objective: str, baseline: str,
                    table_name: str = "VERDICT.md") -> str:
    """Markdown for the parent run's description, the answer first (it must read before the
    UI's "Show more" fold): the decision, then one line per variant, then where the full
    table is. `baseline` is the baseline's label ("baseline (512)")."""
    values = [v.value for v in verdicts]

    def effect(v: VariantVerdict) -> str:
        m = v.metrics.get(objective)
        return (f"{objective} not measured" if m is None else
                f"{objective} {m.relative_effect:+.1%} ({m.verdict})")

    adopted = [v for v in verdicts if v.adopted]
    undecided = [v for v in verdicts if v.undecided]
    if adopted:
        best = adopted[0]
        head = (f"**Verdict: adopt {value_label(best.variable, best.value, values)}**: "
                f"{effect(best)} vs {baseline}")
    elif undecided:
        head = (f"**Verdict: undecided**: keep {baseline} for now; "
                f"{len(undecided)} variant(s) need more repeats")
    elif verdicts:
        head = f"**Verdict: keep {baseline}**: no variant adopted"
    else:
        head = "**No verdict**: every baseline run failed"
    lines = [head, ""] + [f"- {value_label(v.variable, v.value, values)}: {v.decision}, "
                          f"{effect(v)}" for v in verdicts]
    return "\n".join([*lines, "", f"The full table: Artifacts, {table_name}."])
