"""What one measured run of an experiment leaves behind, and the name it is logged under.

A leaf of the experiments layer: a measured run (`child_run.run_one`) fills its `RunRecord`;
the rate sweep (`rate_sweep_run`) builds one per (value, repeat) from its points; the verdict
(`verdict.judge_runs`) and the results folder read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.experiments.labels import baseline_label, value_label
from workbench.experiments.template import Template


@dataclass
class RunRecord:
    label: str  # "baseline" or the variable value as text
    value: Any
    repeat: int
    run_id: str
    metrics: dict[str, float] = field(default_factory=dict)
    valid: bool = True
    error: str | None = None
    other_cpu_share: float | None = None  # of all CPUs, by other processes during the run
    disturbed: bool = False  # invalid because other processes took too much of the CPUs
    node: str | None = None  # where it ran: the Ray node's name, or the hostname
    fingerprint: str | None = None  # that node's `workbench preflight` fingerprint


def run_label(template: Template, value: Any) -> str:
    """The child run name of a value: "budget=64", "k=5"; None (the baseline):
    "baseline (512)" (`workbench.experiments.labels`)."""
    name = template.variable_name
    values = [template.baseline.get(name), *template.variable_values]
    if value is None:
        return baseline_label(name, template.baseline.get(name), values)
    return value_label(name, value, values)


def run_name(template: Template, value: Any, repeat: int, retry: str | None = None) -> str:
    """The child run's name, unique within its experiment: the value label and the repeat
    (1-based), "k=5 r2", "baseline (512) r1"; a retry of a disturbed run adds "retry N"."""
    return f"{run_label(template, value)} r{repeat + 1}" + (f" retry {retry}" if retry else "")
