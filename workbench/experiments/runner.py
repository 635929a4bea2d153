"""Run an experiment template: baseline and variants interleaved, logged, judged.

    for repeat in 1..R:                       A B C A B C ... (cancels slow drift)
        for value in [baseline, v1, v2, ...]:
            fresh in-process engine -> run_benchmark(workload, arrivals, cache_state)
            -> MLflow child run (params = whole config, metrics, step series, artifacts)
    while a variant's objective is undecided: one more round (`sequential`, up to max_repeats)
    verdict per variant (better/worse/no change/undecided: `verdict`), SLO + quality gates,
    adoption

`run_experiment` checks the template and starts the executor, then runs the stages
(`experiments.stages`), each one function from dataclass to dataclass:

    plan     (stages.plan)     -> Plan       the replay, one round's values, preflight, load
    resume   (stages.resume)   -> Parent     the parent run: resumed (--resume) or new
    execute  (stages.execute)  -> Executed   every run (`child_run.run_one` with a RunContext)
    judge    (stages.judge)    -> Judgement  quality gate, verdicts, the table
    publish  (stages.publish)  -> ExperimentResult  MLflow, the results folder, the parent closed

A run during which other processes took more than `max_other_cpu_share` of the CPUs is
invalid ("disturbed"): one console line says so, MLflow tags it run_valid=false (metric
other_cpu_share), and the verdict leaves it out (inconclusive when too few valid repeats remain).

Every run replays the same workload (its checksum is checked before each run); a run that
fails is logged FAILED with its error and whatever rows it had, and the sweep goes on.

Where the runs execute is the executor's business (`run_jobs`, `executors`): here, one after
another (local, the default), or each a Ray task holding one node of a cluster (ray). Each
run is tagged with its node and that node's hardware fingerprint; runs from more than one
fingerprint get no verdict unless `allow_mixed_hardware` (`fingerprints`), and a cluster whose
nodes differ is refused before any run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.experiments import interrupts
from workbench.experiments.child_run import RunContext, run_one
from workbench.experiments.executors import factory  # factory.make_executor: a test's stand-in
from workbench.experiments.executors.base import Executor
from workbench.experiments.executors.config import ExecutorConfig, check_tracking_uri
from workbench.experiments.replay import Replay, replay_setup
from workbench.experiments.results import new_results_dir
from workbench.experiments.stages.execute import execute
from workbench.experiments.stages.judge import judge
from workbench.experiments.stages.plan import plan_experiment
from workbench.experiments.stages.publish import ExperimentResult
from workbench.experiments.stages.publish import publish as publish_verdict
from workbench.experiments.stages.resume import open_parent
from workbench.experiments.template import Template
from workbench.experiments.verdict import disturbance_threshold
from workbench.tracking.mlflow_store import Store

__all__ = ["ExperimentResult", "run_experiment", "run_one"]


def run_experiment(
    template: Template, uri: str | None = None, progress: bool = True,
    profile: str | None = None,
    max_other_cpu_share: float | None = None,
    cpu_watch: Any = None,
    check: bool = True,
    results_dir: str | Path | None = None,
    executor: ExecutorConfig | None = None,
    resume: bool = False,
    retry_invalid: int = 0,
    load_watch: Any = None,
) -> ExperimentResult:
    """Run every (value, repeat); `profile="torch"` stores a Chrome trace per run.
    `executor`: where the runs execute (default: here, one after the other;
    `ExecutorConfig("ray", address=...)`: a Ray task per run on a cluster, logging to the
    tracking server `uri`; `workbench.experiments.executors`).
    `results_dir`: a root under which results/<name>/<UTC time>/ is written (VERDICT.md,
    runs.csv, runs.json, sweep.png, traces/; `workbench.experiments.results`); None: none.
    `progress`: a bar of runs and a line per run with its time and the ETA, a bar of
    requests within a run, the quality gate's steps with their times.
    `max_other_cpu_share`: the disturbance threshold (default: the template's
    `max_other_cpu_share`, else validity.DEFAULT_MAX_OTHER_CPU_SHARE); `cpu_watch`: the
    `validity.CpuWatch` to measure with (default: `validity.default_cpu_watch()`).
    `check=False` skips the up-front template check (`validate.check_template`; tests of the
    run-by-run failure path use it).
    `resume`: finish the newest parent run of this template and workload instead of starting
    one: its FINISHED runs are kept, the rest measured (`experiments.resume`).
    `retry_invalid`: measure a disturbed run again, up to this many times
    (`experiments.invalid_runs`); `load_watch`: the watch of the machine's load before the
    first run (default: `validity.default_cpu_watch()`, a watch of its own). Ctrl-C or
    SIGTERM: the parent and the run in flight end KILLED, `interrupts.Interrupted` says so
    (`experiments.interrupts`)."""
    config = executor or ExecutorConfig()
    _refuse(template, config, profile, resume, retry_invalid)
    check_tracking_uri(config, uri)  # a cluster writes to a server every node reaches
    threshold = disturbance_threshold(template, max_other_cpu_share)
    with interrupts.sigterm_raises():  # SIGTERM ends the runs KILLED, as Ctrl-C does
        replay = replay_setup(template, check, sweep=True)  # every template problem, up front
        ex = factory.make_executor(config)  # a cluster: connected, its node resource checked
        try:
            return _run_experiment(
                template, ex, replay, Store(template.name, uri), progress=progress,
                profile=profile, max_other_cpu_share=threshold, cpu_watch=cpu_watch,
                results_dir=results_dir, resume=resume, retry_invalid=retry_invalid,
                load_watch=load_watch)
        except KeyboardInterrupt as e:  # the parent and the runs in flight: KILLED
            parents, children = interrupts.end_killed(Store(template.name, uri), e)
            raise interrupts.Interrupted(interrupts.interrupted_line(e, parents, children),
                                         interrupts.signal_of(e)) from e
        finally:
            ex.close()


def _refuse(template: Template, config: ExecutorConfig, profile: str | None, resume: bool,
            retry_invalid: int) -> None:
    """`ValueError` / `UserError` for options this template cannot run with."""
    if isinstance(retry_invalid, bool) or not isinstance(retry_invalid, int) or \
            retry_invalid < 0:
        raise ValueError(f"retry_invalid ({retry_invalid!r}) must be an integer >= 0 (the "
                         "times a disturbed run is measured again)")
    if profile not in (None, "torch"):
        raise ValueError(f"profile ({profile!r}) must be None or 'torch'")
    if template.rate_sweep is None:
        return
    sweep = f"template {template.name!r} is a rate sweep (rate_sweep): "
    if config.kind != "local":
        raise UserError(sweep + f"--executor {config.kind} runs plain experiments and "
                        "notebook sweeps; run it with --executor local")
    if retry_invalid:
        raise UserError(sweep + "--retry-invalid retries the runs of plain experiments; run "
                        "the sweep again on a quieter machine")
    if resume:
        raise UserError(sweep + "--resume finishes plain experiments; run the sweep again "
                        "without it")


def _run_experiment(template: Template, ex: Executor, replay: Replay, store: Store, *,
                    progress: bool, profile: str | None, max_other_cpu_share: float,
                    cpu_watch: Any, results_dir: str | Path | None, resume: bool,
                    retry_invalid: int, load_watch: Any) -> ExperimentResult:
    """The stages, once the template is checked and the executor `ex` is ready."""
    plan = plan_experiment(template, ex, replay, max_other_cpu_share=max_other_cpu_share,
                           cpu_watch=cpu_watch, load_watch=load_watch)
    parent = open_parent(template, store, plan, executor_kind=ex.kind, resume=resume,
                         progress=progress)
    out = new_results_dir(template.name, results_dir) if results_dir is not None else None
    ctx = RunContext(template, store, parent.run_id, replay.model, replay.workload,
                     plan.preflight, plan.checksum, profile, max_other_cpu_share,
                     plan.cpu_watch, progress, out)
    executed = execute(ctx, ex, plan, parent, run_point=run_one, retry_invalid=retry_invalid)
    judgement = judge(template, plan, executed,
                      allow_mixed_hardware=ex.config.allow_mixed_hardware, progress=progress)
    return publish_verdict(ctx, plan, executed, judgement, executor_kind=ex.kind)
