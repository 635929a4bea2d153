"""Run an experiment template: baseline and variants interleaved, logged, judged.

    for repeat in 1..R:                       A B C A B C ... (cancels slow drift)
        for value in [baseline, v1, v2, ...]:
            fresh in-process engine -> run_benchmark(workload, arrivals, cache_state)
            -> MLflow child run (params = whole config, metrics, step series, artifacts)
    while a variant's objective is undecided: one more round (`sequential`, up to max_repeats)
    verdict per variant (better/worse/no change/undecided: `verdict`), SLO + quality gates,
    adoption

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

import contextlib
import json
import re
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from workbench.experiments import interrupts, invalid_runs
from workbench.experiments.executors.base import Executor
from workbench.experiments.executors.config import ExecutorConfig
from workbench.experiments.labels import metric_label, value_label
from workbench.experiments.progress import RunProgress
from workbench.experiments.quality import gate_reports
from workbench.experiments.results import VERDICT_MD, new_results_dir, write_experiment_results
from workbench.experiments.run_record import (  # noqa: F401 - RunRecord re-exported
    RunRecord,
    run_label,
    run_name,
)
from workbench.experiments.sequential import add_rounds
from workbench.experiments.template import Template
from workbench.experiments.verdict import VariantVerdict, disturbance_threshold, judge_runs
from workbench.experiments.verdict_report import rule_text, verdict_summary, verdict_table
from workbench.harness.cache_metrics import kv_cache_metrics
from workbench.profiling import torch_trace
from workbench.tracking.param_keys import run_params

BASELINE = "baseline"


@dataclass
class ExperimentResult:
    name: str
    parent_run_id: str
    tracking_uri: str
    workload_checksum: str
    runs: list[RunRecord]
    verdicts: list[VariantVerdict]
    table: str
    adopted: Any = None  # the adopted value, or None
    results_dir: Path | None = None  # results/<name>/<UTC time>/ (`experiments.results`)
    rate_sweep: Any = None  # a rate sweep's `rate_sweep_run.RateSweepResult` (points, curves)
    no_verdict: str | None = None  # why there is none (every baseline run failed, mixed hardware)
    executor: str = "local"  # where the runs executed ("local" | "ray")
    advice: str | None = None  # what to do about invalid runs (`invalid_runs.advice_line`)

    def adopted_config(self, template: Template) -> dict[str, Any] | None:
        return None if self.adopted is None else template.variant_config(self.adopted)


def resolve_model(target: dict[str, Any]) -> str:
    """The local folder whose tokenizer builds the workload (http targets: `tokenizer`)."""
    from workbench.named_models import resolve_model as folder_of

    return folder_of(str(target.get("tokenizer", target.get("model", "bundled"))))


def build_workload(template: Template, model: str) -> Any:
    from workbench.harness.workloads import load_jsonl, make_workload
    from workbench.models.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    w = template.workload
    if "jsonl" in w:
        return load_jsonl(w["jsonl"], tokenizer=tok, name=w.get("name"))
    return make_workload(w["fixture"], int(w.get("seed", 0)), tok, **(w.get("params") or {}))


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
    if isinstance(retry_invalid, bool) or not isinstance(retry_invalid, int) or \
            retry_invalid < 0:
        raise ValueError(f"retry_invalid ({retry_invalid!r}) must be an integer >= 0 (the "
                         "times a disturbed run is measured again)")
    if profile not in (None, "torch"):
        raise ValueError(f"profile ({profile!r}) must be None or 'torch'")
    from workbench.experiments.executors.config import check_tracking_uri
    from workbench.experiments.executors.factory import make_executor

    config = executor or ExecutorConfig()
    if config.kind != "local" and template.rate_sweep is not None:
        from workbench.errors import UserError

        raise UserError(f"template {template.name!r} is a rate sweep (rate_sweep): "
                        f"--executor {config.kind} runs plain experiments and notebook sweeps; "
                        "run it with --executor local")
    if retry_invalid and template.rate_sweep is not None:
        from workbench.errors import UserError

        raise UserError(f"template {template.name!r} is a rate sweep (rate_sweep): "
                        "--retry-invalid retries the runs of plain experiments; run the sweep "
                        "again on a quieter machine")
    if resume and template.rate_sweep is not None:
        from workbench.errors import UserError

        raise UserError(f"template {template.name!r} is a rate sweep (rate_sweep): --resume "
                        "finishes plain experiments; run the sweep again without it")
    check_tracking_uri(config, uri)  # a cluster writes to a server every node reaches
    threshold = disturbance_threshold(template, max_other_cpu_share)
    with interrupts.sigterm_raises():  # SIGTERM ends the runs KILLED, as Ctrl-C does
        setup = replay_setup(template, check, sweep=True)  # every template problem, up front
        ex = make_executor(config)  # a cluster: connected, its node resource checked
        try:
            return _run_experiment(template, ex, setup, uri, progress, profile, threshold,
                                   cpu_watch, results_dir, resume, retry_invalid,
                                   load_watch)
        except KeyboardInterrupt as e:  # the parent and the runs in flight: KILLED
            from workbench.tracking.mlflow_store import Store

            parents, children = interrupts.end_killed(Store(template.name, uri), e)
            raise interrupts.Interrupted(interrupts.interrupted_line(e, parents, children),
                                         interrupts.signal_of(e)) from e
        finally:
            ex.close()


def _run_experiment(template: Template, ex: Executor, setup: tuple[str, Any, Any, Any],
                    uri: str | None, progress: bool, profile: str | None, threshold: float,
                    cpu_watch: Any, results_dir: str | Path | None,
                    resume: bool = False, retry_invalid: int = 0,
                    load_watch: Any = None) -> ExperimentResult:
    """`run_experiment` once the template is checked and the executor `ex` is ready."""
    from workbench.experiments import rate_sweep_run  # the sweep mode (`rate_sweep`)
    from workbench.experiments import resume as resuming
    from workbench.experiments.fingerprints import common_fingerprint, mixed_nodes, mixed_runs
    from workbench.experiments.run_jobs import run_plan
    from workbench.harness.validity import default_cpu_watch
    from workbench.preflight import collect_preflight
    from workbench.tracking.mlflow_store import Store

    allow_mixed = ex.config.allow_mixed_hardware
    probes = ex.node_preflights() if ex.kind != "local" else []  # each node's preflight
    refused = None if allow_mixed else mixed_nodes(probes)
    if refused:
        from workbench.errors import UserError

        raise UserError(refused)
    watch = cpu_watch if cpu_watch is not None else default_cpu_watch()
    load = invalid_runs.check_load(  # one line when the machine is already too busy
        load_watch if load_watch is not None else default_cpu_watch(), threshold)
    model, workload, arrival, slo = setup
    checksum = workload.checksum
    preflight = collect_preflight()
    fingerprint = common_fingerprint(probes) if probes else preflight["fingerprint"]
    store = Store(template.name, uri)
    mismatch = _fingerprint_warning(store, fingerprint)
    plan: list[tuple[str, Any]] = [(BASELINE, None)] + [
        (str(v), v) for v in template.variable_values
    ]
    earlier = resuming.find_parent(store, template, checksum) if resume else None
    kept: dict[tuple[str, int], RunRecord] = {}
    if earlier is not None:  # --resume: its FINISHED runs kept, the rest measured below
        parent = earlier.info.run_id
        store.client.update_run(parent, status="RUNNING")
        store.set_tags(parent, {**resuming.driver_tags(), "resumed": "true"})
        kept, lines = resuming.kept_runs(store, parent, plan, template.repeat_cap,
                                         objective=template.objective.metric)
        if progress:
            print(f"resuming experiment run {parent}: {len(kept)} of "
                  f"{template.repeats * len(plan)} runs kept", flush=True)
            for line in lines:
                print(f"  {line}", flush=True)
    else:
        if resume and progress:
            print(f"nothing to resume for {template.name!r} (no earlier run of this template "
                  "and workload): a new experiment", flush=True)
        parent = store.create_run(template.name, tags={
            "question": template.question, "variable": template.variable_name,
            "workload_checksum": checksum, "hardware_fingerprint": fingerprint,
            "executor": ex.kind, "template_sha": resuming.template_sha(template),
            "git_sha": str(preflight.get("git_sha")), "kind": "experiment",
            "baseline": value_label(template.variable_name,
                                    template.baseline.get(template.variable_name),
                                    [*template.variable_values, None]),
            **resuming.driver_tags(),
        })
        store.set_description(parent, template.question)  # the UI's Description box
        store.log_params(parent, {"template": template.raw})
        store.log_files(parent, {
            "template.yaml": yaml.safe_dump(template.raw, sort_keys=False),
            "preflight.json": json.dumps(preflight, indent=2, default=str),
            "workload.json": json.dumps(workload.summary(), indent=2, default=str),
            **({"nodes.json": json.dumps(probes, indent=2, default=str)} if probes else {}),
        })
    if mismatch:
        store.set_tags(parent, {"fingerprint_warning": mismatch})
    runs: list[RunRecord] = []
    sweep = None  # a rate sweep (`rate_sweep_run`): one point per (repeat, value, rate)
    points = len(template.rate_sweep.rates) if template.rate_sweep is not None else 1
    total = template.repeats * len(plan) * points - sum(r < template.repeats for _, r in kept)
    out = new_results_dir(template.name, results_dir) if results_dir is not None else None
    bar = RunProgress(total, enabled=progress, desc=template.name)
    try:
        if template.rate_sweep is not None:
            sweep = rate_sweep_run.run_sweeps(
                template, store, parent, model, workload, plan, preflight, checksum, bar,
                run_point=run_one, profile=profile, threshold=threshold, cpu_watch=watch,
                progress=progress, out=out)

            def sweep_round(repeat: int, sub: list[tuple[str, Any]]) -> list[RunRecord]:
                assert sweep is not None
                bar.add(len(sub) * points)
                done = len(sweep.runs)
                rate_sweep_run.run_sweeps(
                    template, store, parent, model, workload, sub, preflight, checksum, bar,
                    run_point=run_one, profile=profile, threshold=threshold,
                    cpu_watch=watch, progress=progress, out=out, rounds=[repeat],
                    result=sweep)
                return sweep.runs[done:]

            runs = add_rounds(template, list(sweep.runs), plan, sweep_round, say=bar.line)
        else:  # the interleaved runs, here or on a cluster (`run_jobs`)
            runs = run_plan(ex, template, store, parent, model, workload, arrival, slo, plan,
                            preflight, checksum, bar, profile=profile, threshold=threshold,
                            cpu_watch=watch, progress=progress, out=out, run_point=run_one,
                            setup=replay_setup, kept=kept)

            def again(keep: dict[tuple[str, int], RunRecord],
                      tags: dict[tuple[str, int], dict[str, str]]) -> list[RunRecord]:
                return run_plan(ex, template, store, parent, model, workload, arrival, slo,
                                plan, preflight, checksum, bar, profile=profile,
                                threshold=threshold, cpu_watch=watch, progress=progress,
                                out=out, run_point=run_one, setup=replay_setup, kept=keep,
                                tags=tags)

            runs = invalid_runs.retry_disturbed(runs, retry_invalid, again, store, parent,
                                                bar, bar.line if progress else print)

            def one_round(repeat: int, sub: list[tuple[str, Any]]) -> list[RunRecord]:
                bar.add(sum((label, repeat) not in kept for label, _ in sub))
                return run_plan(ex, template, store, parent, model, workload, arrival, slo,
                                sub, preflight, checksum, bar, profile=profile,
                                threshold=threshold, cpu_watch=watch, progress=progress,
                                out=out, run_point=run_one, setup=replay_setup, kept=kept,
                                rounds=[repeat])

            runs = add_rounds(template, runs, plan, one_round, say=bar.line)  # undecided
    finally:
        bar.close()
    # The quality gate replays golden prompts through the in-process engine on the same
    # folder: meaningful for in-process targets and `workbench serve`.
    quality, quality_reports = (
        _quality(template, model, workload, log=print if progress else None)
        if template.quality_gate else ({}, {}))
    base = [r for r in runs if r.label == BASELINE and r.error is None]
    mixed = None if allow_mixed else mixed_runs(runs)  # runs from other hardware: no verdict
    verdicts = judge_runs(template, runs, quality, BASELINE) if base and not mixed else []
    no_verdict = mixed or (None if base else "every baseline run failed: no verdict")
    table = rule_text(template) + "\n\n" + verdict_table(
        verdicts, template.objective.metric,
        None if sweep is None else rate_sweep_run.SWEEP_COLUMNS,
        baseline=run_label(template, None)) if verdicts else str(no_verdict)
    if sweep is not None:
        table += "\n\n" + rate_sweep_run.sweep_summary(sweep)
    adopted = next((v.value for v in verdicts if v.adopted), None)
    store.log_files(parent, {
        VERDICT_MD: f"# {template.name}\n\n{template.question}\n\n{table}\n",
        "verdicts.json": json.dumps([v.as_dict() for v in verdicts], indent=2, default=str),
    })
    if template.quality_gate:
        store.log_files(parent, {"quality.json": json.dumps(
            {"gate": template.quality_gate,
             "variants": {str(v): {"failures": quality.get(v, []),
                                   "report": quality_reports.get(v)}
                          for v in template.variable_values}},
            indent=2, default=str)})
    if sweep is None:
        _log_sweep_plot(store, parent, template, runs, out)
    else:
        rate_sweep_run.log_sweep_parent(store, parent, template, sweep, out)
    if out is not None:
        write_experiment_results(out, template, runs, table)
    _log_verdict(store, parent, template, runs, verdicts)
    store.set_description(parent, f"{template.question}\n\n" + (
        f"**No verdict**: {mixed}" if mixed else verdict_summary(
            verdicts, template.objective.metric, run_label(template, None), VERDICT_MD)))
    store.set_tags(parent, {"adopted": "none" if adopted is None else run_label(template, adopted),
                            "invalid_runs": str(sum(not r.valid for r in runs)),
                            "disturbed_runs": str(sum(r.disturbed for r in runs)),
                            **({"no_verdict": no_verdict} if no_verdict else {})})
    advice = invalid_runs.advice_line(runs)
    _save_children_view(store, parent, template)  # the children's table with metric columns
    store.set_tags(parent, {"other_cpu_share_before": f"{load:.3f}",
                            **({"invalid_advice": advice} if advice else {})})
    store.finish(parent, failed=not verdicts)
    return ExperimentResult(template.name, parent, store.uri, checksum, runs, verdicts, table,
                            adopted, results_dir=out, rate_sweep=sweep, no_verdict=no_verdict,
                            executor=ex.kind, advice=advice)


def replay_setup(template: Template, check: bool = True, sweep: bool = False
                 ) -> tuple[str, Any, Any, Any]:
    """(model folder, workload, ArrivalSpec, SLO): what every run of the template replays
    (`run_experiment`, `workbench rerun`). `check`: the whole template is checked first
    (`validate.check_template`, every problem at once, `TemplateError`). A rate-sweep
    template (each point has its own arrivals, `RateSweep.arrival`) gives ArrivalSpec None
    and its SLO when the caller runs sweeps (`sweep=True`), else a `UserError`."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.metrics import SLO

    if template.rate_sweep is not None and not sweep:
        from workbench.errors import UserError

        raise UserError(f"template {template.name!r} is a rate sweep (rate_sweep): rerunning "
                        "its runs is not supported; run the template again")
    model = resolve_model(template.target)
    if check:  # every problem of the template at once, before the first run
        from workbench.experiments.validate import check_template

        workload = check_template(template.as_data(), source=f"template {template.name!r}")
    else:
        workload = build_workload(template, model)
    if template.rate_sweep is not None:
        return model, workload, None, template.rate_sweep.slo.as_slo()
    arrival = ArrivalSpec.from_dict(template.arrivals)
    slo = SLO(
        ttft_ms=template.slo.get("p95_ttft_ms"), tpot_ms=template.slo.get("p95_tpot_ms"),
        e2el_ms=template.slo.get("p95_e2el_ms"),
    )
    return model, workload, arrival, slo


VERDICT_CODES = {"better": 1.0, "no change": 0.0, "worse": -1.0, "inconclusive": 2.0,
                 "invalid": -2.0, "undecided": 3.0}


def variant_verdict(template: Template, vv: VariantVerdict) -> str:
    """One word for a variant: better | no change | worse | undecided (its objective's
    interval, `verdict`), inconclusive (too few valid runs left), invalid (runs failed or
    invalid, or the objective was not measured)."""
    if vv.inconclusive:
        return "inconclusive"
    obj = vv.metrics.get(template.objective.metric)
    if vv.failed_runs or vv.invalid_runs or obj is None:
        return "invalid"
    if obj.verdict in ("better", "no change", "worse", "undecided"):
        return obj.verdict
    return "better" if template.objective.better(obj.delta) else "worse"


def _log_verdict(store: Any, parent: str, template: Template, runs: list[RunRecord],
                 verdicts: list[VariantVerdict]) -> None:
    """The verdict as the parent's metrics (per variant label L, metric-safe: <objective>/L
    (median), delta_pct/L, verdict/L (VERDICT_CODES), adopted/L; <objective>/baseline) and
    the children's tags role and verdict."""
    obj = template.objective.metric
    metrics: dict[str, float] = {}
    words: dict[str, str] = {}
    for vv in verdicts:
        label = run_label(template, vv.value)
        key = metric_label(label)
        words[str(vv.value)] = word = variant_verdict(template, vv)
        m = vv.metrics.get(obj)
        if m is not None:
            metrics[f"{obj}/{key}"] = m.variant_median
            metrics[f"delta_pct/{key}"] = 100.0 * m.relative_effect
            metrics[f"{obj}/baseline"] = m.baseline_median
        metrics[f"verdict/{key}"] = VERDICT_CODES[word]
        metrics[f"adopted/{key}"] = float(vv.adopted)
    store.log_metrics(parent, metrics)
    for r in runs:
        store.set_tags(r.run_id, {"verdict": "baseline" if r.value is None and
                                  r.label == BASELINE else words.get(r.label, "none")})


def _log_sweep_plot(store: Any, parent: str, template: Template, runs: list[RunRecord],
                    out: Path | None = None) -> None:
    """sweep.png on the parent run (`workbench.analysis.plots.experiment_sweep`): the
    objective and a tail against the variable, baseline starred, SLO bounds drawn, band =
    range of repeats. Nothing to draw: no plot; a plotting failure only warns."""
    name = template.variable_name
    base_value = template.baseline.get(name, "default")  # None (e.g. spec off) stays None
    rows = [{name: base_value if r.value is None else r.value, **r.metrics}
            for r in runs if r.error is None and not r.disturbed]  # disturbed: not shown
    if not rows:
        return
    try:
        from workbench.analysis.plots import experiment_sweep, save

        fig = experiment_sweep(rows, name, base_value, template.objective.metric,
                               template.slo, title=f"{template.name}: {name}")
        if fig is None:  # nothing to draw (reason logged)
            return
        with tempfile.TemporaryDirectory() as tmp:
            png = save(fig, (out if out is not None else Path(tmp)) / "sweep.png")
            store.log_artifact(parent, png)  # no folder: VERDICT.md stays first
    except Exception as e:  # noqa: BLE001 - the numbers are logged already
        warnings.warn(f"could not draw the sweep plot: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)


def _save_children_view(store: Any, parent: str, template: Template) -> None:
    """MLflow's runs table on the parent's children with the objective, the tails, the
    other processes' CPU share and the knob's params as columns (`tracking.runs_view`)."""
    from workbench.tracking.param_keys import engine_params
    from workbench.tracking.runs_view import save_children_view

    name = template.variable_name
    params = [k for v in template.variable_values for k in engine_params({name: v})]
    metrics = [template.objective.metric, "p95_ttft_ms", "p95_tpot_ms", "p95_itl_ms",
               "output_throughput", "other_cpu_share"]
    save_children_view(store.client, store.experiment_id, parent, metrics, params,
                       ascending=template.objective.direction == "minimize")


def _fingerprint_warning(store: Any, fingerprint: str) -> str | None:
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


def run_one(
    template: Template, store: Any, parent: str, model: str, workload: Any, arrival: Any,
    slo: Any, label: str, value: Any, repeat: int, preflight: dict[str, Any], checksum: str,
    profile: str | None = None, *, max_other_cpu_share: float | None = None,
    cpu_watch: Any = None, progress: bool = False, out: Path | None = None,
    tags: dict[str, str] | None = None, name: str | None = None,
    arrivals: dict[str, Any] | None = None,
    extra_metrics: Callable[[Any], dict[str, float]] | None = None,
) -> RunRecord:
    """One measured child run of `parent` (baseline: value None): a fresh target, the
    replay, its metrics, validity and artifacts; a failure is recorded, never raised.
    `tags` are added to (and override) the child's tags (`workbench rerun`: role=rerun).
    A rate sweep's point (`rate_sweep_run`) names the run (`name`), logs the arrivals it
    ran (`arrivals`, default the template's) and adds `extra_metrics(result)` to its
    metrics (its SLO attainment)."""
    from workbench.harness.runner import run, run_sync
    from workbench.harness.server_process import make_target

    config = template.baseline if value is None else template.variant_config(value)
    host = str(preflight.get("hostname"))
    all_tags = {"variable": template.variable_name, "value": label, "repeat": str(repeat),
                "baseline_run": parent, "role": "baseline" if value is None else "variant",
                "workload_checksum": checksum, "hardware_fingerprint": preflight["fingerprint"],
                "node": host, "node_hostname": host, **(tags or {})}
    run_id = store.create_run(  # "k=5 r2": unique in the runs table
        name or run_name(template, value, repeat, all_tags.get("retry")), parent_id=parent,
        tags=all_tags)
    store.log_params(run_id, run_params(  # knob keys as on every path (param_keys)
        config, template.workload, template.arrivals if arrivals is None else arrivals,
        cache_state=template.cache_state,
        target=template.target, model=model, repeat=repeat))
    record = RunRecord(label, value, repeat, run_id, node=all_tags["node"],
                       fingerprint=str(preflight["fingerprint"]))
    result = None
    target = None
    killed: str | None = None  # why it was interrupted
    try:
        if workload.checksum != checksum:
            raise RuntimeError("the workload changed between runs (checksum mismatch)")
        # in-process: a fresh engine per run; http: the server command (engine knobs as
        # flags) started before the run and stopped after it.
        target, lifecycle = make_target(template.target, config)
        with lifecycle, tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / TRACE_NAME
            try:
                with torch_trace(str(trace)) if profile == "torch" else contextlib.nullcontext():
                    result = run(target, workload, arrival, cache_state=template.cache_state,
                                 warmup_requests=template.warmup_requests,
                                 max_other_cpu_share=max_other_cpu_share, cpu_watch=cpu_watch,
                                 progress=progress, warn_invalid=False)
            finally:
                run_sync(target.stop)  # the target before its server
            if trace.exists():
                _keep_trace(store, run_id, trace, out, f"{label}_r{repeat}", progress)
        if result.error:
            raise RuntimeError(result.error)
        record.metrics = result.metrics(slo=slo)
        if extra_metrics is not None:
            record.metrics.update(extra_metrics(result))
        engine_time = (phase_shares(result.step_trace)["engine_time_s"]
                       if result.step_trace else None)
        record.metrics.update(kv_cache_metrics(result.server_delta, engine_time))
        v = result.validity
        record.valid, record.disturbed = v.valid, v.disturbed
        record.other_cpu_share = v.other_cpu_share
        store.log_metrics(run_id, record.metrics)
        store.log_validity(run_id, v.valid, v.reasons, v.other_cpu_share, v.max_other_cpu_share)
        store.set_tags(run_id, {"open_loop": str(result.open_loop)})
        if v.disturbed:
            from workbench.harness.validity import disturbed_line

            print(disturbed_line(f"run {run_label(template, value)} repeat {repeat + 1}/"
                                 f"{template.repeats}", v.other_cpu_share, v.max_other_cpu_share),
                  flush=True)
    except Exception as e:  # one failed run must not lose the others
        record.error = f"{type(e).__name__}: {e}"
        store.log_files(run_id, {"error.txt": traceback.format_exc()})
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: KILLED, measured again on --resume
        record.error = killed = interrupts.killed_reason(e)
        raise
    finally:
        if result is not None:
            _log_run_artifacts(store, run_id, result, record.metrics, target)
        if killed is not None:
            store.kill(run_id, killed)
        else:
            store.finish(run_id, failed=record.error is not None)
    return record


def _log_run_artifacts(
    store: Any, run_id: str, result: Any, metrics: dict[str, float], target: Any = None
) -> None:
    from workbench.harness.metrics import records_frame, summary_table

    files: dict[str, str | bytes] = {
        "requests.csv": records_frame(result.records).to_csv(index=False),
        "summary.json": json.dumps({"metrics": metrics, "validity": vars(result.validity),
                                    "arrival": result.arrival, "cache_state": result.cache_state,
                                    "target": result.target}, indent=2, default=str),
    }
    if metrics:
        files["summary.md"] = summary_table(metrics)
    if result.step_trace:
        import pandas as pd

        files["step_trace.csv"] = pd.DataFrame(result.step_trace).to_csv(index=False)
        store.log_series(run_id, result.step_trace,
                         ["running", "waiting", "kv_cache_usage_perc", "prefill_tokens",
                          "decode_tokens"])
        store.log_metrics(run_id, phase_shares(result.step_trace))
    if (result.target or {}).get("kind") == "http":
        from workbench.harness.join import log_server_side

        log_server_side(store, run_id, result, target)
    store.log_files(run_id, files)


def phase_shares(step_trace: list[dict[str, Any]]) -> dict[str, float]:
    """Share of engine time in steps that carried prefill tokens vs pure-decode steps."""
    total = sum(r["duration_s"] for r in step_trace) or 1.0
    prefill = sum(r["duration_s"] for r in step_trace if r.get("prefill_tokens", 0) > 0)
    return {"engine_time_s": total, "prefill_step_share": prefill / total,
            "decode_only_step_share": 1.0 - prefill / total}


TRACE_NAME = "torch_trace.json.gz"  # gzip Chrome trace: Perfetto / chrome://tracing open it


def _keep_trace(store: Any, run_id: str, trace: Path, out: Path | None, stem: str,
                say: bool) -> None:
    """Log the trace as the run's artifact; copy it to <out>/traces/<stem>.json.gz; say where."""
    import shutil

    store.log_artifact(run_id, trace)
    where = [f"MLflow run {run_id} artifact {trace.name}"]
    if out is not None:
        local = out / "traces" / f"{re.sub(r'[^A-Za-z0-9._=-]+', '_', stem)}.json.gz"
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace, local)
        where.append(str(local))
    if say:
        print(f"torch trace ({trace.stat().st_size / 1e6:.1f} MB gzip; open in "
              f"https://ui.perfetto.dev): {' and '.join(where)}", flush=True)


def _quality(
    template: Template, model: str, workload: Any, log: Any = None,
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


def promoted_template(template: Template, adopted: Any, parent_run_id: str,
                      next_variable: tuple[str, list[Any]] | None = None) -> dict[str, Any]:
    """The template with `variable = adopted` as its new baseline. By default the same
    variable stays, its values the ones not adopted plus the old baseline value (the engine's
    default when the baseline left the knob unset), so the next run re-checks the choice;
    `next_variable=(name, values)` asks the next question instead. `UserError` when no value
    is left to try (the old baseline value was null, e.g. `speculative_config: null`)."""
    from workbench.errors import UserError
    from workbench.experiments.validate_engine import knob_default

    raw = template.with_baseline(template.variant_config(adopted))
    raw.pop("variants", None)
    name = template.variable_name
    if next_variable is not None:
        name, values = next_variable[0], list(next_variable[1])
    else:
        old = template.baseline.get(name, knob_default(name))
        values = []
        for v in [old, *template.variable_values]:
            if v is not None and v != adopted and v not in values:
                values.append(v)
        if not values:
            raise UserError(
                f"the promoted template would have no {name} value left to try: "
                f"{name}={adopted!r} becomes the baseline and the old baseline value ({old!r}) "
                "cannot be a variable value; name the next question with "
                "--next-variable NAME --values V1 [V2 ...]")
    raw["variable"] = {"name": name,
                       "values": [dict(v) if isinstance(v, dict) else v for v in values]}
    raw["description"] = (f"promoted from MLflow run {parent_run_id}: "
                          f"{template.variable_name}={adopted}")
    return raw


def write_promoted(raw: dict[str, Any], out_path: str | Path) -> Path:
    """Check the promoted template like any other (`TemplateError` listing its problems,
    nothing written), then write it: what is written runs as the next baseline."""
    from workbench.experiments.validate import check_template

    dst = Path(out_path)
    check_template(raw, source=f"the promoted template ({dst})",
                   consequence="nothing was written")
    dst.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dst


def promote(template: Template, result: ExperimentResult, out_path: str | Path,
            next_variable: tuple[str, list[Any]] | None = None) -> Path | None:
    """Write the adopted config as the new baseline template; None when nothing was adopted."""
    if result.adopted is None:
        return None
    return write_promoted(promoted_template(template, result.adopted, result.parent_run_id,
                                            next_variable), out_path)


def promote_from_mlflow(parent_run_id: str, out_path: str | Path, uri: str | None = None,
                        next_variable: tuple[str, list[Any]] | None = None) -> Path | None:
    """`workbench promote RUN_ID`: rebuild the promoted template from a finished experiment."""
    from mlflow.tracking import MlflowClient

    from workbench.experiments.template import parse_template
    from workbench.tracking.mlflow_store import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(uri))
    run = client.get_run(parent_run_id)
    adopted_tag = run.data.tags.get("adopted")
    if adopted_tag in (None, "none"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tpath = client.download_artifacts(parent_run_id, "template.yaml", tmp)
        template = parse_template(yaml.safe_load(Path(tpath).read_text()))
        vpath = client.download_artifacts(parent_run_id, "verdicts.json", tmp)
        adopted = next(v["value"] for v in json.loads(Path(vpath).read_text()) if v["adopted"])
    return write_promoted(promoted_template(template, adopted, parent_run_id, next_variable),
                          out_path)
