"""The runner's first stage: what an experiment will measure, and on what.

    plan_experiment(template, executor, replay, ...) -> Plan

Before any run: a cluster whose nodes differ in hardware is refused (unless
`allow_mixed_hardware`: `fingerprints.mixed_nodes`); the machine's load is watched for 1 s
(one warning line when other processes already take more than the threshold:
`invalid_runs.check_load`); the preflight and the hardware fingerprint the runs are tagged
with are collected; and the (label, value) order of one round is fixed: the baseline first,
then the template's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import UserError
from workbench.experiments import invalid_runs
from workbench.experiments.executors.base import Executor
from workbench.experiments.fingerprints import common_fingerprint, mixed_nodes
from workbench.experiments.replay import Replay
from workbench.experiments.template import Template
from workbench.harness.validity import default_cpu_watch
from workbench.platforms.preflight import collect_preflight

BASELINE = "baseline"


@dataclass(frozen=True)
class Plan:
    """The plan stage's output: what every later stage reads."""

    replay: Replay  # model folder, workload, arrival, SLO
    values: list[tuple[str, Any]]  # one round's (label, value), baseline (BASELINE, None) first
    preflight: dict[str, Any]  # this driver's preflight
    fingerprint: str  # the runs' common hardware fingerprint (a cluster: its nodes')
    probes: list[dict[str, Any]]  # each node's preflight (a cluster), [] when local
    max_other_cpu_share: float  # the disturbance threshold
    cpu_watch: Any  # the `validity.CpuWatch` every run measures with
    load: float  # the other processes' CPU share before the first run

    @property
    def checksum(self) -> str:
        return str(self.replay.workload.checksum)


def run_values(template: Template) -> list[tuple[str, Any]]:
    """One round's (label, value) pairs: the baseline (BASELINE, None), then each value."""
    return [(BASELINE, None)] + [(str(v), v) for v in template.variable_values]


def plan_experiment(template: Template, ex: Executor, replay: Replay, *,
                    max_other_cpu_share: float, cpu_watch: Any = None,
                    load_watch: Any = None) -> Plan:
    """The `Plan` (module docstring); `UserError` for a cluster of mixed hardware."""
    probes = ex.node_preflights() if ex.kind != "local" else []  # each node's preflight
    refused = None if ex.config.allow_mixed_hardware else mixed_nodes(probes)
    if refused:
        raise UserError(refused)
    if template.target.get("kind") == "simulated":  # a virtual clock: no CPU to disturb
        load = float("nan")
    else:  # one line when the machine is already too busy
        load = invalid_runs.check_load(
            load_watch if load_watch is not None else default_cpu_watch(), max_other_cpu_share)
    preflight = collect_preflight()
    return Plan(replay, run_values(template), preflight,
                common_fingerprint(probes) if probes else preflight["fingerprint"], probes,
                max_other_cpu_share,
                cpu_watch if cpu_watch is not None else default_cpu_watch(), load)
