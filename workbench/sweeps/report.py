"""What a finished `workbench sweep` shows: the summary table, the results folder and the
MLflow parent run, read like an experiment's.

    results/sweep-<notebook>/<UTC time>/
      summary.md   one row per point: value, status, the sweep metrics, run, notebook
      sweep.png    each sweep metric against the swept value (`plots.sweep_metrics`)
      runs.csv, runs.json   every metric each point's run logged
    parent run
      description  what was swept (notebook, parameter, values, fixed), the counts, the
                   summary table, where the table and plot are
      metrics      each sweep metric of each valid point, at step = the swept value when
                   every value is a whole number >= 0 (MLflow's chart of a metric is then
                   metric vs value), else step = the point's index (tag `sweep_step`)
      artifacts    summary.md, sweep.png

The sweep metrics are the ones the notebook declares (`SWEEP_METRICS = [...]`, names or
fnmatch patterns, `workbench.sweeps.notebook_specs.sweep_metrics`), in that order; a notebook that
declares none gets KEY_METRICS it logged, else the first names in sorted order.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUMMARY_MD = "summary.md"
SWEEP_PNG = "sweep.png"
KEY_METRICS = ("output_throughput", "request_throughput", "p95_ttft_ms", "p95_itl_ms",
               "p95_tpot_ms", "p95_e2el_ms", "median_ttft_ms", "median_itl_ms")
VALIDITY_METRICS = ("valid", "other_cpu_share")
MAX_DECLARED = 8  # columns from a declaration


def value_key(value: Any) -> str:
    """The canonical JSON of a value: how a sweep point is recognised on resume."""
    return json.dumps(value, sort_keys=True, default=str)


def point_metrics(store: Any, run_id: str | None) -> dict[str, float]:
    """The metrics a point's run logged (the notebook's `publish`), validity ones left out."""
    if not run_id:
        return {}
    try:
        metrics = store.client.get_run(run_id).data.metrics
    except Exception:  # noqa: BLE001 - a summary without numbers, not a failed sweep
        return {}
    return {k: v for k, v in sorted(metrics.items()) if k not in VALIDITY_METRICS}


def key_metrics(rows: Sequence[dict[str, Any]], at_most: int = 5,
                declared: Sequence[str] | None = None) -> list[str]:
    """The metric columns of the summary: the names matching `declared` (in its order,
    each pattern's matches sorted), else KEY_METRICS that some point logged, else the first
    names in sorted order."""
    have = sorted({k for r in rows for k in r.get("metrics") or {}})
    if declared:
        chosen: list[str] = []
        for pattern in declared:
            chosen += [m for m in have if fnmatch.fnmatchcase(m, pattern) and m not in chosen]
        if chosen:
            return chosen[:MAX_DECLARED]
    keys = [k for k in KEY_METRICS if k in have]
    return (keys or have)[:at_most]


def status_text(row: dict[str, Any]) -> str:
    if row.get("valid", True):
        return str(row["status"])
    share = row.get("other_cpu_share")
    return (f"{row['status']} INVALID (other processes "
            f"{share if share is None else format(share, '.0%')} of the CPUs)")


def summary_table(rows: Sequence[dict[str, Any]], param: str,
                  declared: Sequence[str] | None = None) -> str:
    """One Markdown row per point: the value, its status, the sweep metrics, its run and
    notebook; then one line per failed point with its error."""
    from workbench.experiments.results import text_table

    metric_cols = key_metrics(rows, declared=declared)
    table = [{param: value_key(r["value"]), "status": status_text(r),
              **{m: (r.get("metrics") or {}).get(m) for m in metric_cols},
              "run": (r.get("run_id") or "-")[:12],
              "notebook": Path(str(r["output_path"])).name if r.get("output_path") else "-"}
             for r in rows]
    text = text_table(table, [param, "status", *metric_cols, "run", "notebook"])
    errors = [f"{param}={value_key(r['value'])}: {r['error']}" for r in rows if r.get("error")]
    return "\n".join([text, *errors])


def metric_steps(values: Sequence[Any]) -> tuple[list[int], str]:
    """(step per value, what a step is): the values themselves when all are whole numbers
    >= 0 and distinct, else their index in the sweep."""
    whole = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    if len(whole) == len(values) and len(set(whole)) == len(whole):
        return list(whole), "the swept value"
    return list(range(len(values))), "the point's index in sweep_values"


def description(nb: Path, param: str, values: Sequence[Any], fixed: dict[str, Any],
                rows: Sequence[dict[str, Any]], table: str, folder: Path, steps: str,
                metrics: Sequence[str]) -> str:
    """The parent run's description (markdown): the sweep, its counts, the table, where
    things are."""
    count = {s: sum(r["status"] == s for r in rows) for s in ("FINISHED", "FAILED", "SKIPPED")}
    invalid = sum(not r.get("valid", True) for r in rows)
    head = (f"**Sweep** of `{param}` over {', '.join(value_key(v) for v in values)} in "
            f"`{nb.name}`" + (f" (fixed: {value_key(fixed)})" if fixed else "") + ".")
    counts = (f"{len(rows)} points: {count['FINISHED']} finished, {count['FAILED']} failed"
              + (f", {count['SKIPPED']} kept from an earlier sweep" if count["SKIPPED"] else "")
              + (f"; **{invalid} INVALID** (disturbed: their numbers are not read)"
                 if invalid else "") + ".")
    if invalid:
        from workbench.harness.validity import invalid_advice

        counts += (f" {invalid_advice(invalid, len(rows))} (`--retry-invalid N` runs them "
                   "again at once; `--resume` reruns only them).")
    where = (f"Table: `{SUMMARY_MD}`; plot: `{SWEEP_PNG}` (this run's artifacts, and "
             f"`{folder}`). Metrics of this run: "
             + (", ".join(f"`{m}`" for m in metrics) if metrics else "none")
             + f" per valid point, step = {steps}; each point is a child run.")
    return "\n\n".join([head, counts, table, where])


def report(store: Any, parent: str, nb: Path, param: str, values: Sequence[Any],
           fixed: dict[str, Any], rows: list[dict[str, Any]], folder: Path,
           declared: Sequence[str] | None) -> None:
    """The results folder (runs.csv, runs.json, summary.md, sweep.png) and the parent run
    (description, per-point metrics, summary.md, sweep.png); every row gets its metrics."""
    from workbench.experiments.results import write_rows

    for r in rows:
        r["metrics"] = point_metrics(store, r.get("run_id"))
        r["results_dir"] = str(folder)
        r["parent_run_id"] = parent
    flat = [{"param": param, "value": value_key(r["value"]), "status": r["status"],
             "valid": r["valid"], "other_cpu_share": r["other_cpu_share"],
             "run_id": r["run_id"], "notebook": r["output_path"], "error": r["error"],
             "node": r.get("node"), **r["metrics"]} for r in rows]
    write_rows(folder, flat, ["param", "value", "status", "valid", "other_cpu_share",
                              "run_id", "notebook", "error", "node"])
    table = summary_table(rows, param, declared)
    (folder / SUMMARY_MD).write_text(table + "\n")
    chosen = key_metrics(rows, declared=declared)
    steps, what = metric_steps([r["value"] for r in rows])
    for step, r in zip(steps, rows, strict=True):
        if r.get("valid", True) and r["status"] != "FAILED":
            store.log_metrics(parent, {m: r["metrics"][m] for m in chosen
                                       if m in r["metrics"]}, step=step)
    files: dict[str, str | bytes] = {SUMMARY_MD: table + "\n"}
    png = _plot(rows, param, chosen, folder, nb)
    if png is not None:
        files[SWEEP_PNG] = png.read_bytes()
    store.log_files(parent, files)
    store.set_tags(parent, {"sweep_step": what, "sweep_metrics": json.dumps(chosen),
                            "invalid_points": str(sum(not r.get("valid", True) for r in rows))})
    store.set_description(parent, description(nb, param, [r["value"] for r in rows], fixed,
                                              rows, table, folder, what, chosen))


def _plot(rows: Sequence[dict[str, Any]], param: str, metrics: Sequence[str], folder: Path,
          nb: Path) -> Path | None:
    """sweep.png in the folder; None when no point has a sweep metric."""
    import pandas as pd

    from workbench.analysis.plots import save, sweep_metrics

    if not metrics:
        return None
    frame = pd.DataFrame({param: pd.Series([r["value"] for r in rows], dtype=object),
                          "valid": [bool(r.get("valid", True)) for r in rows],
                          **{m: [(r.get("metrics") or {}).get(m) for r in rows]
                             for m in metrics}})
    fig = sweep_metrics(frame, param, metrics, title=f"{nb.stem}: sweep over {param}")
    return None if fig is None else save(fig, folder / SWEEP_PNG)


def links(uri: str, parent: str) -> list[str]:
    """The console lines that open the sweep in MLflow (`workbench ui` serves them on
    127.0.0.1:5000; a tracking server its own UI): the parent's summary.md rendered, and
    the child runs' table."""
    from mlflow.tracking import MlflowClient

    from workbench.tracking.ui import artifact_url, base_url, runs_url

    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else base_url()
    try:
        exp = str(MlflowClient(tracking_uri=uri).get_run(parent).info.experiment_id)
    except Exception as e:  # noqa: BLE001 - the sweep is logged; only the links are lost
        return [f"(no MLflow links: {type(e).__name__}: {e})"]
    summary, points = artifact_url(base, exp, parent, SUMMARY_MD), runs_url(base, exp, parent)
    return [f"sweep (the parent run's summary and plot): {summary}",
            f"points (one child run per value): {points}"]
