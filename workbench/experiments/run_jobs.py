"""An experiment's measured runs on an executor: one job per (value, repeat), interleaved.

    for repeat in 1..R:  for value in [baseline, v1, v2, ...]:  -> job   (A B C A B C ...)
    local: each job is `run_point` (`child_run.run_one`) here, in that order (as before
           executors)
    ray:   each job is `run_on_node` in a Ray task holding one node (executors.ray_executor),
           submitted in that order; the node rebuilds the workload (checksum checked), logs
           its child run to the tracking server itself and tags it with where it ran
           (node, node_hostname, hardware_fingerprint, ray_node_id: executors.node)

Whatever order the jobs finish in, the records come back in the plan's order, so the verdict
reads them exactly as a local run's. A job whose node died is marked KILLED in MLflow (found
by its `executor_attempt` tag) and runs again on another node. The execute stage hands in
`run_one` (as it does to `rate_sweep_run`), so that a test may stand in for it; a Ray task
gets it pickled by reference and rebuilds the replay (`replay.replay_setup`). Every run shares one
`child_run.RunContext`; a node builds its own (its preflight, its CPU watch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.experiments.child_run import RunContext
from workbench.experiments.executors.base import ATTEMPT_TAG, Executor, mark_lost
from workbench.experiments.executors.node import in_cwd, node_identity, use_node_threads
from workbench.experiments.progress import RunProgress
from workbench.experiments.replay import replay_setup
from workbench.experiments.resume import require_objective
from workbench.experiments.run_record import RunRecord, run_label
from workbench.experiments.template import Template
from workbench.harness.validity import default_cpu_watch
from workbench.tracking.mlflow_store import Store


@dataclass(frozen=True)
class RunJob:
    """What a node needs to measure one (value, repeat); pickled into its Ray task."""

    template: Template
    uri: str  # the tracking server every node reaches
    parent: str  # the experiment's parent run
    checksum: str  # the workload every run must replay
    label: str
    value: Any
    repeat: int
    profile: str | None
    max_other_cpu_share: float | None  # the disturbance threshold
    runs_per_node: int
    cwd: str  # the driver's working folder (relative template paths resolve there)
    run_point: Callable[..., RunRecord]  # `child_run.run_one`
    tags: dict[str, str] | None = None  # added to the run's tags (a retry's retry, retry_of)


def run_on_node(job: RunJob, attempt: str) -> RunRecord:
    """One measured run inside a Ray task: `run_one` with this node's preflight, its CPU
    watch and its tags; the workload is rebuilt here (`run_one` checks its checksum) and the
    run is logged to `job.uri` from here."""
    with in_cwd(job.cwd):
        ident = node_identity()
        use_node_threads(ident, job.runs_per_node)
        model, workload, arrival, slo = replay_setup(job.template, check=False)
        ctx = RunContext(job.template, Store(job.template.name, job.uri), job.parent, model,
                         workload, ident.preflight, job.checksum, job.profile,
                         job.max_other_cpu_share, default_cpu_watch(), progress=False)
        return job.run_point(ctx, job.label, job.value, job.repeat, arrival, slo,
                             tags={"executor": "ray", ATTEMPT_TAG: attempt, **ident.tags(),
                                   **(job.tags or {})})


def run_plan(executor: Executor, ctx: RunContext, arrival: Any, slo: Any,
             plan: Sequence[tuple[str, Any]], bar: RunProgress, *,
             run_point: Callable[..., RunRecord],
             kept: dict[tuple[str, int], RunRecord] | None = None,
             rounds: Sequence[int] | None = None,
             tags: dict[tuple[str, int], dict[str, str]] | None = None) -> list[RunRecord]:
    """Every (value, repeat) of `plan` on `executor`, each run under `ctx.parent` with
    `arrival` traffic judged against `slo`; the records in the interleaved order. Local runs
    print as they always did; a cluster's lines name the node of each run. `run_point`:
    `child_run.run_one` (or a test's stand-in).
    `kept`: records of (label, repeat) pairs an earlier run finished (`--resume`): not
    measured again. `rounds`: the repeats to measure (default all the template's;
    `sequential`: one more)."""
    template, store = ctx.template, ctx.store
    kept, tags = kept or {}, tags or {}  # tags: more tags for a (label, repeat)'s run
    order = [(label, value, repeat) for repeat in (
        range(template.repeats) if rounds is None else rounds) for label, value in plan]
    jobs = [job for job in order if (job[0], job[2]) not in kept]
    names = [f"{run_label(template, v)} repeat {r + 1}/"
             f"{template.repeats if r < template.repeats else template.repeat_cap}"
             for _, v, r in jobs]
    local = executor.kind == "local"

    def here(job: tuple[str, Any, int], attempt: str) -> RunRecord:
        label, value, repeat = job
        return run_point(ctx, label, value, repeat, arrival, slo,
                         tags={"executor": "local", ATTEMPT_TAG: attempt,
                               **tags.get((label, repeat), {})})

    payloads: list[Any] = jobs if local else [
        RunJob(template, store.uri, ctx.parent, ctx.checksum, label, value, repeat, ctx.profile,
               ctx.max_other_cpu_share, executor.config.runs_per_node, os.getcwd(), run_point,
               tags.get((label, repeat)))
        for label, value, repeat in jobs]
    killed: dict[int, str] = {}

    def lost(i: int, attempt: str, reason: str) -> None:
        mark_lost(store, attempt, reason, killed, i, "run", names[i], "it runs again")

    def give_up(i: int, reason: str) -> RunRecord:
        label, value, repeat = jobs[i]
        return RunRecord(label, value, repeat, killed.get(i, ""), error=reason)

    records: list[RunRecord | None] = [None] * len(jobs)
    for done in executor.run(here if local else run_on_node, payloads,
                             what=names.__getitem__, lost=lost, give_up=give_up,
                             started=(lambda i: bar.start(names[i])) if local else None):
        rec = records[done.index] = done.value
        if local:
            bar.done("FAILED" if rec.error else "")
        else:  # the node's own console is not this one: its verdict on the run goes here
            bar.done(f"on {rec.node}" + ("  FAILED" if rec.error else "") + (
                f"  INVALID: other processes took {rec.other_cpu_share:.0%} of the CPUs"
                if rec.disturbed and rec.other_cpu_share is not None else ""),
                what=names[done.index], seconds=done.wall_s)
    assert all(r is not None for r in records), "a job never came back"
    new = {(r.label, r.repeat): r for r in records if r is not None}
    return require_objective(  # a run without its objective: failed, never compared
        [kept.get((label, repeat)) or new[(label, repeat)] for label, _, repeat in order],
        template.objective.metric)
