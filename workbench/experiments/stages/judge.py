"""The runner's fourth stage: the verdict on the measured runs.

    judge(template, plan, executed, allow_mixed_hardware=..., progress=...) -> Judgement

The quality gate (when the template has one) replays golden prompts through the in-process
engine on the same folder, each variant against the baseline (`experiments.quality`);
meaningful for in-process targets and `workbench serve`. Then a verdict per variant
(`verdict.judge_runs`) unless every baseline run failed or the runs come from more than one
hardware fingerprint (`fingerprints.mixed_runs`, unless `allow_mixed_hardware`), and the
table VERDICT.md and the console show: the rule, the verdict table, a rate sweep's summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.experiments import rate_sweep_run
from workbench.experiments.fingerprints import mixed_runs
from workbench.experiments.quality import gate_reports
from workbench.experiments.run_record import run_label
from workbench.experiments.stages.execute import Executed
from workbench.experiments.stages.plan import BASELINE, Plan
from workbench.experiments.template import Template
from workbench.experiments.verdict import VariantVerdict, judge_runs
from workbench.experiments.verdict_report import rule_text, verdict_table


@dataclass(frozen=True)
class Judgement:
    """The judge stage's output."""

    verdicts: list[VariantVerdict]
    table: str  # markdown: the rule and the verdict table, or why there is no verdict
    adopted: Any = None  # the adopted value, or None
    no_verdict: str | None = None  # why there is none (every baseline run failed, mixed hw)
    mixed: str | None = None  # the runs came from more than one hardware fingerprint
    quality: dict[Any, list[str]] = field(default_factory=dict)  # value -> gate failures
    quality_reports: dict[Any, dict[str, Any]] = field(default_factory=dict)


def judge(template: Template, plan: Plan, executed: Executed, *,
          allow_mixed_hardware: bool = False, progress: bool = True) -> Judgement:
    """The `Judgement` (module docstring); `progress` prints the quality gate's steps."""
    quality, reports = (
        _quality(template, plan.replay.model, plan.replay.workload,
                 log=print if progress else None)
        if template.quality_gate else ({}, {}))
    runs = executed.runs
    base = [r for r in runs if r.label == BASELINE and r.error is None]
    mixed = None if allow_mixed_hardware else mixed_runs(runs)  # other hardware: no verdict
    verdicts = judge_runs(template, runs, quality, BASELINE) if base and not mixed else []
    no_verdict = mixed or (None if base else "every baseline run failed: no verdict")
    sweep = executed.sweep
    table = rule_text(template) + "\n\n" + verdict_table(
        verdicts, template.objective.metric,
        None if sweep is None else rate_sweep_run.SWEEP_COLUMNS,
        baseline=run_label(template, None)) if verdicts else str(no_verdict)
    if sweep is not None:
        table += "\n\n" + rate_sweep_run.sweep_summary(sweep)
    adopted = next((v.value for v in verdicts if v.adopted), None)
    return Judgement(verdicts, table, adopted, no_verdict, mixed, quality, reports)


def _quality(
    template: Template, model: str, workload: Any, log: Callable[..., Any] | None = None,
) -> tuple[dict[Any, list[str]], dict[Any, dict[str, Any]]]:
    """({value: gate failures}, {value: QualityReport dict}): each variant against the
    baseline on the workload's first `num_prompts` prompts (`workbench.experiments.quality`)."""
    gate = template.quality_gate or {}
    n = int(gate.get("num_prompts", 4))
    prompts = [list(r.prompt_token_ids) for r in workload.requests[:n]]
    variants = {v: template.variant_config(v) for v in template.variable_values}
    labels = {v: run_label(template, v) for v in template.variable_values}
    return gate_reports(model, template.baseline, variants, prompts, gate, log=log,
                        labels=labels)
