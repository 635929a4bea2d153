"""The runner's second stage: the experiment's parent run, resumed or new.

    open_parent(template, store, plan, executor_kind=..., resume=...) -> Parent

`--resume`: the newest parent of this template and workload (`experiments.resume.find_parent`)
is set RUNNING again and its FINISHED runs are kept (`kept_runs`); the rest is measured by
`execute`. Otherwise a new parent run: tags (question, variable, workload checksum,
hardware fingerprint, executor, template and git sha, the baseline's label, the driver),
the template as params (and a trace workload's resolved `workload.trace.*` keys), and
template.yaml, preflight.json, workload.json (nodes.json on a cluster) as artifacts. A parent
whose previous experiment ran on other hardware is tagged `fingerprint_warning` (and warns).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

import yaml

from workbench.experiments import resume as resuming
from workbench.experiments.labels import value_label
from workbench.experiments.run_record import RunRecord
from workbench.experiments.stages.plan import Plan
from workbench.experiments.template import Template
from workbench.tracking.param_keys import trace_keys


@dataclass(frozen=True)
class Parent:
    """The resume stage's output."""

    run_id: str
    kept: dict[tuple[str, int], RunRecord] = field(default_factory=dict)  # (label, repeat)
    resumed: bool = False


def open_parent(template: Template, store: Any, plan: Plan, *, executor_kind: str,
                resume: bool = False, progress: bool = True) -> Parent:
    """The `Parent` (module docstring); `progress` prints what a resume keeps."""
    mismatch = fingerprint_warning(store, plan.fingerprint)
    earlier = resuming.find_parent(store, template, plan.checksum) if resume else None
    if earlier is not None:  # --resume: its FINISHED runs kept, the rest measured
        parent = _reopen(template, store, plan, earlier.info.run_id, progress)
    else:
        if resume and progress:
            print(f"nothing to resume for {template.name!r} (no earlier run of this template "
                  "and workload): a new experiment", flush=True)
        parent = Parent(_create(template, store, plan, executor_kind))
    if mismatch:
        store.set_tags(parent.run_id, {"fingerprint_warning": mismatch})
    return parent


def _reopen(template: Template, store: Any, plan: Plan, run_id: str,
            progress: bool) -> Parent:
    store.client.update_run(run_id, status="RUNNING")
    store.set_tags(run_id, {**resuming.driver_tags(), "resumed": "true"})
    kept, lines = resuming.kept_runs(store, run_id, plan.values, template.repeat_cap,
                                     objective=template.objective.metric)
    if progress:
        print(f"resuming experiment run {run_id}: {len(kept)} of "
              f"{template.repeats * len(plan.values)} runs kept", flush=True)
        for line in lines:
            print(f"  {line}", flush=True)
    return Parent(run_id, kept, resumed=True)


def _create(template: Template, store: Any, plan: Plan, executor_kind: str) -> str:
    name = template.variable_name
    parent: str = store.create_run(template.name, tags={
        "question": template.question, "variable": name,
        "workload_checksum": plan.checksum, "hardware_fingerprint": plan.fingerprint,
        "executor": executor_kind, "template_sha": resuming.template_sha(template),
        "git_sha": str(plan.preflight.get("git_sha")), "kind": "experiment",
        "baseline": value_label(name, template.baseline.get(name),
                                [*template.variable_values, None]),
        **resuming.driver_tags(),
    })
    store.set_description(parent, template.question)  # the UI's Description box
    store.log_params(parent, {"template": template.raw,  # a trace's workload.trace.* too
                              **trace_keys(plan.replay.workload)})
    store.log_files(parent, {
        "template.yaml": yaml.safe_dump(template.raw, sort_keys=False),
        "preflight.json": json.dumps(plan.preflight, indent=2, default=str),
        "workload.json": json.dumps(plan.replay.workload.summary(), indent=2, default=str),
        **({"nodes.json": json.dumps(plan.probes, indent=2, default=str)}
           if plan.probes else {}),
    })
    return parent


def fingerprint_warning(store: Any, fingerprint: str) -> str | None:
    """Warn when the previous run of this experiment was measured on other hardware/software."""
    prev = store.client.search_runs(
        [store.experiment_id], filter_string="tags.kind = 'experiment'",
        order_by=["attributes.start_time DESC"], max_results=1)
    if not prev:
        return None
    old = prev[0].data.tags.get("hardware_fingerprint")
    if old in (None, fingerprint):
        return None
    msg = (f"hardware/software fingerprint {fingerprint} differs from the previous run of this "
           f"experiment ({old}, run {prev[0].info.run_id}): do not compare their numbers "
           "directly (`workbench preflight --compare` names the fields)")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return msg
