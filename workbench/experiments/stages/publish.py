"""The runner's last stage: the verdict where people read it, and the parent run closed.

    publish(ctx, plan, executed, judgement, executor_kind=...) -> ExperimentResult

On the parent run: VERDICT.md (first among its artifacts), verdicts.json, quality.json (a
quality gate), sweep.png (`analysis.plots.experiment_sweep`) or a rate sweep's
slo_attainment.png/.csv; the verdict as metrics (<objective>/<label>, delta_pct/<label>,
verdict/<label> as `VERDICT_CODES`, adopted/<label>) and each child's tag `verdict`; the
description (the question and a one-line verdict); tags adopted, invalid_runs,
disturbed_runs, no_verdict, other_cpu_share_before, invalid_advice; MLflow's runs table on
the children with the objective and the knob as columns. On disk (`ctx.out`): VERDICT.md,
runs.csv, runs.json (`experiments.results`). The parent ends FINISHED with a verdict, else
FAILED.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.experiments import invalid_runs, rate_sweep_run
from workbench.experiments.child_run import RunContext
from workbench.experiments.labels import metric_label
from workbench.experiments.results import VERDICT_MD, write_experiment_results
from workbench.experiments.run_record import RunRecord, run_label
from workbench.experiments.stages.execute import Executed
from workbench.experiments.stages.judge import Judgement
from workbench.experiments.stages.plan import BASELINE, Plan
from workbench.experiments.template import Template
from workbench.experiments.verdict import VariantVerdict
from workbench.experiments.verdict_report import verdict_summary
from workbench.tracking.param_keys import engine_params
from workbench.tracking.runs_view import save_children_view

VERDICT_CODES = {"better": 1.0, "no change": 0.0, "worse": -1.0, "inconclusive": 2.0,
                 "invalid": -2.0, "undecided": 3.0}


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


def publish(ctx: RunContext, plan: Plan, executed: Executed, judgement: Judgement, *,
            executor_kind: str) -> ExperimentResult:
    """Log and write the verdict (module docstring), close the parent; the result."""
    t, store, parent, out = ctx.template, ctx.store, ctx.parent, ctx.out
    runs, verdicts, table = executed.runs, judgement.verdicts, judgement.table
    store.log_files(parent, {
        VERDICT_MD: f"# {t.name}\n\n{t.question}\n\n{table}\n",
        "verdicts.json": json.dumps([v.as_dict() for v in verdicts], indent=2, default=str),
    })
    if t.quality_gate:
        store.log_files(parent, {"quality.json": json.dumps(
            {"gate": t.quality_gate,
             "variants": {str(v): {"failures": judgement.quality.get(v, []),
                                   "report": judgement.quality_reports.get(v)}
                          for v in t.variable_values}},
            indent=2, default=str)})
    if executed.sweep is None:
        _log_sweep_plot(store, parent, t, runs, out)
    else:
        rate_sweep_run.log_sweep_parent(store, parent, t, executed.sweep, out)
    if out is not None:
        write_experiment_results(out, t, runs, table)
    _log_verdict(store, parent, t, runs, verdicts)
    store.set_description(parent, f"{t.question}\n\n" + (
        f"**No verdict**: {judgement.mixed}" if judgement.mixed else verdict_summary(
            verdicts, t.objective.metric, run_label(t, None), VERDICT_MD)))
    adopted, no_verdict = judgement.adopted, judgement.no_verdict
    store.set_tags(parent, {"adopted": "none" if adopted is None else run_label(t, adopted),
                            "invalid_runs": str(sum(not r.valid for r in runs)),
                            "disturbed_runs": str(sum(r.disturbed for r in runs)),
                            **({"no_verdict": no_verdict} if no_verdict else {})})
    advice = invalid_runs.advice_line(runs)
    _save_children_view(store, parent, t)  # the children's table with metric columns
    store.set_tags(parent, {"other_cpu_share_before": f"{plan.load:.3f}",
                            **({"invalid_advice": advice} if advice else {})})
    store.finish(parent, failed=not verdicts)
    return ExperimentResult(t.name, parent, store.uri, ctx.checksum, runs, verdicts, table,
                            adopted, results_dir=out, rate_sweep=executed.sweep,
                            no_verdict=no_verdict, executor=executor_kind, advice=advice)


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
        key = metric_label(run_label(template, vv.value))
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
    range of repeats. Nothing to draw: no plot; a plotting failure only warns. matplotlib
    and seaborn are imported here, on first use: a run without a plot never loads them."""
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
    name = template.variable_name
    params = [k for v in template.variable_values for k in engine_params({name: v})]
    metrics = [template.objective.metric, "p95_ttft_ms", "p95_tpot_ms", "p95_itl_ms",
               "output_throughput", "other_cpu_share"]
    save_children_view(store.client, store.experiment_id, parent, metrics, params,
                       ascending=template.objective.direction == "minimize")
