"""Run a template's rate sweep: goodput per (value, repeat), the runner's sweep mode.

    for repeat in 1..R:                         values interleaved, as in an ordinary run
        for value in [baseline, v1, ...]:
            MLflow child "budget=64"            goodput, goodput_per_worker, slo_attainment
                                                (step = rate index), params rate_sweep.*
                for rate in rates:              one point = one `child_run.run_one` (a fresh
                    grandchild "budget=64 @ 2 req/s"   target, the same seeded workload,
                                                Poisson arrivals at `rate`), its metrics
                                                plus slo_attainment / slo_met_requests /
                                                slo_requests from the per-request records
    parent: slo_attainment.png (median over repeats, band = min..max, the target line),
            slo_attainment.csv, slo_attainment/<value> (median, step = rate index)

A failed point does not lose the others: it counts as attainment 0 at its rate, the console
says so, the child's tag `failed_rates` and metric `failed_points` record it, and VERDICT.md
lists it. A (value, repeat) whose every point failed is a failed run (the verdict counts it).
Validity: a point disturbed by other processes makes its (value, repeat) disturbed (left out
of the verdict); a point invalid for another reason (the client fell behind) makes it invalid.

Adaptive repeats (`max_repeats` > `repeats`): while a variant's goodput is undecided, one more
round sweeps every rate again for the baseline and each undecided variant (`run_sweeps` with
`rounds=[repeat]`), as `sequential.add_rounds` does for ordinary runs.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.experiments.child_run import RunContext
from workbench.experiments.labels import metric_label
from workbench.experiments.rate_sweep import RateSweep
from workbench.experiments.run_record import RunRecord, run_label, run_name
from workbench.experiments.template import Template
from workbench.harness.goodput import (
    Band,
    GoodputSLO,
    attainment_bands,
    band_rows,
    goodput,
    meets_slo,
    slo_attainment,
)
from workbench.tracking.param_keys import run_params

ATTAINMENT_PNG, ATTAINMENT_CSV, POINTS_CSV = ("slo_attainment.png", "slo_attainment.csv",
                                              "points.csv")
SWEEP_COLUMNS = ("goodput", "goodput_per_worker")  # the verdict table's columns


@dataclass
class SweepPoint:
    """One measured (value, repeat, rate)."""

    label: str  # the RunRecord label: "baseline" or the value as text
    value: Any
    repeat: int
    rate_index: int
    rate: float  # requests/s
    run_id: str
    attainment: float  # 0.0 for a failed point
    requests: int = 0  # requests sent (the attainment's denominator)
    met: int = 0  # requests meeting the SLO
    error: str | None = None
    valid: bool = True
    disturbed: bool = False


@dataclass
class RateSweepResult:
    """Every point, and one `RunRecord` per (value, repeat) carrying its goodput."""

    sweep: RateSweep
    points: list[SweepPoint] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # label -> run name ("budget=64")

    def curves(self) -> dict[str, list[list[tuple[float, float]]]]:
        """{run name: one (rate, attainment) curve per repeat}, in plan order."""
        out: dict[str, dict[int, list[tuple[float, float]]]] = {}
        for p in self.points:
            out.setdefault(self.names[p.label], {}).setdefault(p.repeat, []).append(
                (p.rate, p.attainment))
        return {name: [by[r] for r in sorted(by)] for name, by in out.items()}

    def bands(self) -> dict[str, Band]:
        """{run name: [(rate, median, min, max), ...]} (`goodput.attainment_bands`)."""
        return attainment_bands(self.curves())

    def rows(self) -> list[dict[str, Any]]:
        return band_rows(self.curves(), self.sweep.slo.attainment, self.sweep.num_workers)


def attainment_metrics(result: Any, slo: GoodputSLO) -> dict[str, float]:
    """A point's SLO attainment from its per-request records (unsent requests miss)."""
    return {"slo_attainment": slo_attainment(result.records, slo, result.unsent_requests),
            "slo_met_requests": sum(meets_slo(r, slo) for r in result.records),
            "slo_requests": len(result.records) + result.unsent_requests}


def run_sweeps(ctx: RunContext, plan: Sequence[tuple[str, Any]], bar: Any, *,
               run_point: Callable[..., RunRecord], rounds: Sequence[int] | None = None,
               result: RateSweepResult | None = None) -> RateSweepResult:
    """Every (repeat, value) of `plan`: its sweep child run under `ctx.parent` and its points.
    `run_point` measures one point (`child_run.run_one`'s signature: the runner hands in its
    own). `rounds` (default: the template's `repeats`) names the repeats to measure; an
    adaptive round (`sequential.add_rounds`) passes one repeat and the `result` so far, which
    it extends."""
    template = ctx.template
    assert template.rate_sweep is not None
    result = RateSweepResult(template.rate_sweep) if result is None else result
    for repeat in range(template.repeats) if rounds is None else rounds:
        for label, value in plan:
            result.names[label] = run_label(template, value)
            record, points = _sweep_one(ctx, label, value, repeat, bar, run_point)
            result.runs.append(record)
            result.points.extend(points)
    return result


def _sweep_one(ctx: RunContext, label: str, value: Any, repeat: int, bar: Any,
               run_point: Callable[..., RunRecord]) -> tuple[RunRecord, list[SweepPoint]]:
    """One (value, repeat): its child run, a point per rate under it, its goodput."""
    template, store, parent = ctx.template, ctx.store, ctx.parent
    sweep = template.rate_sweep
    assert sweep is not None
    slo = sweep.slo
    name = run_label(template, value)
    config = template.baseline if value is None else template.variant_config(value)
    child = store.create_run(run_name(template, value, repeat), parent_id=parent, tags={
        "variable": template.variable_name, "value": label, "repeat": str(repeat),
        "baseline_run": parent, "role": "baseline" if value is None else "variant",
        "workload_checksum": ctx.checksum,
        "hardware_fingerprint": ctx.preflight["fingerprint"],
        "kind": "rate_sweep", "rates": json.dumps(list(sweep.rates))})
    arrivals = {k: v for k, v in sweep.arrivals(sweep.rates[0]).items() if k != "rate"}
    store.log_params(child, {**run_params(config, template.workload, arrivals,
                                          cache_state=template.cache_state,
                                          target=template.target, model=ctx.model,
                                          repeat=repeat, built=ctx.workload),
                             "rate_sweep": sweep.to_dict()})
    under_child = replace(ctx, parent=child)  # each point is a grandchild of the experiment
    points = []
    for i, rate in enumerate(sweep.rates):
        of_n = max(template.repeats, repeat + 1)  # an adaptive round goes past `repeats`
        where = f"{name} @ {rate:g} req/s repeat {repeat + 1}/{of_n}"
        bar.start(where)
        rec = run_point(under_child, label, value, repeat, sweep.arrival(rate), slo.as_slo(),
                        name=f"{name} @ {rate:g} req/s", arrivals=sweep.arrivals(rate),
                        tags={"role": "sweep_point", "baseline_run": parent,
                              "sweep_run": child, "rate": f"{rate:g}", "rate_index": str(i)},
                        extra_metrics=lambda result: attainment_metrics(result, slo))
        bar.done("FAILED" if rec.error else "")
        m = rec.metrics
        points.append(SweepPoint(
            label, value, repeat, i, rate, rec.run_id,
            0.0 if rec.error else m["slo_attainment"],
            int(m.get("slo_requests", 0)), int(m.get("slo_met_requests", 0)), rec.error,
            rec.valid, rec.disturbed))
        if rec.error:
            print(f"sweep point {where} FAILED ({rec.error}): counted as SLO attainment 0",
                  flush=True)
    return _finish_child(store, child, label, value, repeat, sweep, points), points


def _finish_child(store: Any, child: str, label: str, value: Any, repeat: int,
                  sweep: RateSweep, points: list[SweepPoint]) -> RunRecord:
    """Goodput from the points, logged on the sweep's child run; its RunRecord."""
    est = goodput([(p.rate, p.attainment) for p in points], sweep.slo.attainment,
                  sweep.num_workers)
    failed = [p for p in points if p.error]
    measured = [p for p in points if not p.error]
    record = RunRecord(label, value, repeat, child, metrics={
        "goodput": est.rate, "goodput_per_worker": est.per_worker,
        "goodput_lower_bound": float(est.lower_bound), "failed_points": float(len(failed))})
    record.disturbed = any(p.disturbed for p in measured)
    record.valid = all(p.valid for p in measured)
    if not measured:
        record.error = f"every sweep point failed: {failed[0].error}"
    store.log_metrics(child, record.metrics)
    for p in points:
        store.log_metrics(child, {"slo_attainment": p.attainment}, step=p.rate_index)
    store.log_validity(child, record.valid, [
        f"sweep point {p.rate:g} req/s (run {p.run_id}) is "
        f"{'disturbed' if p.disturbed else 'invalid'}" for p in measured if not p.valid])
    store.set_tags(child, {"failed_rates": json.dumps([p.rate for p in failed]),
                           "goodput_lower_bound": str(est.lower_bound).lower()})
    store.log_files(child, {POINTS_CSV: _points_csv(points)})
    store.finish(child, failed=record.error is not None)
    return record


def _points_csv(points: Sequence[SweepPoint]) -> str:
    cols = ["value", "repeat", "rate_index", "rate", "attainment", "requests", "met",
            "status", "valid", "disturbed", "run_id", "error"]
    return pd.DataFrame([{**vars(p), "value": p.label, "repeat": p.repeat + 1,
                          "status": "FAILED" if p.error else "FINISHED"} for p in points],
                        columns=cols).to_csv(index=False)


def sweep_summary(result: RateSweepResult) -> str:
    """Markdown for VERDICT.md below the verdict table: the SLO, attainment per rate
    (median [min, max] over repeats), goodput, and every failed point."""
    s = result.sweep
    rates = list(s.rates)
    head = ["value", *(f"{r:g} req/s" for r in rates), "goodput (req/s)",
            "per worker"]
    lines = [f"SLO: TTFT <= {s.slo.ttft_ms:g} ms and TPOT <= {s.slo.tpot_ms:g} ms for "
             f"{s.slo.attainment:.0%} of requests; Poisson arrivals (seed {s.seed}); "
             f"{s.num_workers} worker(s). SLO attainment, median [min, max] over repeats:", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in result.rows():
        by_name.setdefault(str(row["label"]), []).append(row)
    for name, rows in by_name.items():
        cells = [f"{r['attainment_median']:.2f} [{r['attainment_min']:.2f}, "
                 f"{r['attainment_max']:.2f}]" for r in rows]
        bound = ">= " if rows[0]["goodput_lower_bound"] else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {bound}{rows[0]['goodput']:.3g} "
                     f"| {bound}{rows[0]['goodput_per_worker']:.3g} |")
    if any(r["goodput_lower_bound"] for r in result.rows()):
        lines += ["", ">= : every swept rate met the target: the goodput is a lower bound "
                  "(sweep higher rates to find it)."]
    failed = [p for p in result.points if p.error]
    if failed:
        lines += ["", "Failed sweep points (counted as SLO attainment 0):"]
        lines += [f"- {result.names[p.label]} @ {p.rate:g} req/s repeat {p.repeat + 1}: "
                  f"{p.error}" for p in failed]
    return "\n".join(lines)


def log_sweep_parent(store: Any, parent: str, template: Template, result: RateSweepResult,
                     out: Path | None = None) -> None:
    """The parent's slo_attainment.csv and .png, slo_attainment/<value> medians (step = rate
    index), tag rate_sweep; the same files in the results folder. A plotting failure only
    warns (the numbers are logged already)."""
    sweep = result.sweep
    bands = result.bands()
    for name, band in bands.items():
        for i, (_, median, _, _) in enumerate(band):
            store.log_metrics(parent, {f"slo_attainment/{metric_label(name)}": median}, step=i)
    rows = result.rows()
    csv = pd.DataFrame(rows).to_csv(index=False)
    store.log_files(parent, {ATTAINMENT_CSV: csv})
    store.set_tags(parent, {"rate_sweep": json.dumps(sweep.to_dict())})
    if out is not None:
        (out / ATTAINMENT_CSV).write_text(csv)
        (out / POINTS_CSV).write_text(_points_csv(result.points))
    goodputs = {str(r["label"]): float(r["goodput"]) for r in rows}
    try:
        fig = _attainment_figure(bands, sweep.slo.attainment, goodputs,
                                 f"{template.name}: SLO attainment vs request rate")
        with tempfile.TemporaryDirectory() as tmp:
            png = (out if out is not None else Path(tmp)) / ATTAINMENT_PNG
            fig.savefig(png, dpi=120, bbox_inches="tight")
            store.log_artifact(parent, png)
    except Exception as e:  # noqa: BLE001 - the numbers are logged already
        warnings.warn(f"could not draw {ATTAINMENT_PNG}: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)


def _attainment_figure(bands: dict[str, Band], target: float, goodputs: dict[str, float],
                       title: str) -> Any:
    """`analysis.disagg.slo_attainment_plot`, each value's goodput marked (matplotlib is
    imported here, on first use, inside the caller's guard: a plotting failure only warns)."""
    from workbench.analysis.disagg import slo_attainment_plot

    return slo_attainment_plot(bands, target, goodputs=goodputs, title=title)
