"""`workbench rerun RUN_ID`: measure a logged run again and say whether it reproduced.

    workbench rerun RUN_ID [--repeats N] [--tracking-uri URI] [--results-dir ROOT]
                           [--max-other-cpu-share SHARE] [--no-progress]

What is measured again depends on the run's tags (`rerun_logged.find_run`):

    experiment child   role baseline | variant under a kind=experiment parent: the template
                       (the parent's template.yaml, else its template.* params), that one
                       configuration, N times, each run as `workbench run` runs it
                       (`child_run.run_one`)
    experiment parent  kind=experiment: the baseline and every value, N times, interleaved
    sweep point        kind=sweep-point: its notebook under papermill with the logged
                       parameters (the swept value, the fixed ones, and any default changed
                       since, set back to its logged value), N times
    a rerun            role=rerun: the run it reran

Before anything runs, the workload is rebuilt and its checksum must equal the logged
`workload_checksum` (else `UserError`, nothing run); a hardware fingerprint or git sha other
than the logged one is one warning line each. Then, per metric (the template's objective and
the verdict's REPORTED; a sweep point: every metric it logged): logged | now | delta % |
same or drifted beyond noise (`experiments.drift`, the verdict's noise logic).

In MLflow: one new run in the same experiment (tags kind=rerun, role=rerun, rerun_of=<id>,
rerun_kind, rerun_verdict, workload_checksum, hardware_fingerprint, git_sha; metrics: the new
medians, `<metric>/<label>` for a parent; artifacts rerun.md, rerun.json), with the measured
runs as its children (role=rerun, rerun_of=<id>). On disk: results/<experiment>-rerun/<UTC
time>/ with rerun.md, rerun.json, runs.csv, runs.json (a sweep point: notebooks/ too).

This module sits in the experiments layer and may not import `workbench.sweeps` (entrypoints):
a sweep point is executed by the `run_point` its caller passes (`workbench rerun` passes
`workbench.cli.run_sweep_point`, the sweep's own point execution).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.experiments.child_run import RunContext, run_one
from workbench.experiments.drift import drift_table, noise_line, summary_line, verdict_word
from workbench.experiments.progress import RunProgress
from workbench.experiments.replay import replay_setup
from workbench.experiments.rerun_logged import (
    PARENT_TAG,
    VALIDITY_METRICS,
    Logged,
    RerunResult,
    absolute_uri,
    compare,
    find_run,
    fingerprint_warnings,
    finish,
    logged_template,
    median_metrics,
    rerun_tags,
    restored_defaults,
    results_folder,
    say,
)
from workbench.experiments.results import RUN_COLUMNS, default_root, experiment_rows, slug
from workbench.experiments.run_record import run_label
from workbench.experiments.stages.plan import BASELINE, run_values
from workbench.experiments.verdict import REPORTED, disturbance_threshold
from workbench.harness.validity import default_cpu_watch
from workbench.platforms.preflight import collect_preflight
from workbench.tracking.mlflow_store import Store, tracking_uri

PointRunner = Callable[..., dict[str, Any]]


def rerun(run_id: str, uri: str | None = None, repeats: int = 1, *, progress: bool = True,
          results_dir: str | Path | None = None, run_point: PointRunner | None = None,
          max_other_cpu_share: float | None = None, cpu_watch: Any = None) -> RerunResult:
    """Measure run `run_id` again `repeats` times and compare (module docstring); the folder
    goes under `results_dir` (default `results.default_root()`). A sweep point needs
    `run_point(notebook, param, value, fixed, *, store, parent, out, max_other_cpu_share,
    cpu_watch)` -> the sweep's row of that point (status, run_id, valid, error)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise UserError(f"repeats ({repeats!r}) must be an integer >= 1")
    from mlflow.tracking import MlflowClient  # on first use: importing mlflow takes seconds

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file
    uri = absolute_uri(tracking_uri(uri))
    client = MlflowClient(tracking_uri=uri)
    logged = find_run(client, run_id, uri)
    root = Path(results_dir) if results_dir is not None else default_root()
    if logged.kind != "sweep-point":
        return _rerun_template(client, logged, uri, repeats, root, progress,
                               max_other_cpu_share, cpu_watch)
    if run_point is None:
        raise TypeError("a sweep point is executed by the sweep's point runner: pass "
                        "run_point=workbench.cli.run_sweep_point (`workbench rerun` does)")
    return _rerun_point(client, logged, uri, repeats, root, run_point, max_other_cpu_share,
                        cpu_watch)


def _rerun_template(client: Any, logged: Logged, uri: str, repeats: int, root: Path,
                    progress: bool, max_other_cpu_share: float | None,
                    cpu_watch: Any) -> RerunResult:
    # repeats: what the run lines and the disturbance lines count to
    template = dataclasses.replace(logged_template(client, logged.parent), repeats=repeats)
    tags, parent_tags = logged.run.data.tags, logged.parent.data.tags
    run_id = logged.run.info.run_id
    if logged.kind == "experiment":
        plan = run_values(template)
    else:
        label = tags.get("value", "")
        values = [v for v in template.variable_values if str(v) == label]
        if label != BASELINE and not values:
            raise UserError(f"value ({label!r}) of run {run_id} is none of the template's "
                            f"{template.variable_name} values {template.variable_values}")
        plan = [(label, values[0] if values else None)]
    checksum = tags.get("workload_checksum") or parent_tags.get("workload_checksum")
    model, workload, arrival, slo = replay_setup(template)  # the template checked first
    if checksum and workload.checksum != checksum:
        raise UserError(
            f"workload_checksum ({checksum!r}) of run {run_id} differs from the workload "
            f"rebuilt from its template ({workload.checksum!r}): the fixture, its seed or the "
            "tokenizer changed, so the numbers would not compare; nothing was run")
    notes = [] if checksum else ["the run logged no workload_checksum: not checked"]
    preflight = collect_preflight()
    warns = fingerprint_warnings(tags.get("hardware_fingerprint")
                                 or parent_tags.get("hardware_fingerprint"),
                                 parent_tags.get("git_sha"), preflight)
    say("warning", warns)
    say("note", notes)
    threshold = disturbance_threshold(template, max_other_cpu_share)
    watch = cpu_watch if cpu_watch is not None else default_cpu_watch()
    store = Store(logged.experiment, uri)
    new_id = store.create_run(f"rerun of {logged.run.info.run_name}", tags={
        **rerun_tags(logged, preflight), "workload_checksum": workload.checksum})
    ctx = RunContext(template, store, new_id, model, workload, preflight, workload.checksum,
                     max_other_cpu_share=threshold, cpu_watch=watch, progress=progress)
    records = []
    bar = RunProgress(repeats * len(plan), enabled=progress, desc=f"rerun {template.name}")
    try:
        for repeat in range(repeats):  # interleaved, as `workbench run`
            for label, value in plan:
                bar.start(f"{run_label(template, value)} repeat {repeat + 1}/{repeats}")
                records.append(run_one(ctx, label, value, repeat, arrival, slo,
                                       tags={"role": "rerun", "rerun_of": run_id}))
                bar.done("FAILED" if records[-1].error else "")
    except BaseException:  # Ctrl-C: the rerun run is not left RUNNING
        store.client.set_terminated(new_id, status="KILLED")
        raise
    finally:
        bar.close()
    siblings = _finished_children(client, logged.parent)
    metrics = list(dict.fromkeys([template.objective.metric, *REPORTED]))
    rows = []
    for label, value in plan:
        logged_runs = [r.data.metrics for r in siblings if r.data.tags.get("value") == label]
        center = (dict(logged.run.data.metrics) if logged.kind == "experiment-child" else
                  {m: statistics.median([s[m] for s in logged_runs if m in s])
                   for m in metrics if any(m in s for s in logged_runs)})
        new = [r.metrics for r in records if r.label == label and r.error is None and r.valid]
        rows += compare(run_label(template, value), center, logged_runs, new, metrics,
                        template.noise)
    measured = [{"label": run_label(template, r.value), "repeat": r.repeat + 1,
                 "run_id": r.run_id, "status": "FAILED" if r.error else "FINISHED",
                 "valid": r.valid, "error": r.error, "metrics": r.metrics} for r in records]
    result = RerunResult(new_id, run_id, logged.kind, logged.experiment, uri, rows,
                         drift_table(rows), _summary(rows), verdict_word(rows), measured,
                         warns, notes, workload.checksum)
    return finish(store, result, median_metrics(rows, keyed=logged.kind == "experiment"),
                  experiment_rows(template.variable_name, records), list(RUN_COLUMNS),
                  results_folder(logged, root))


def _summary(rows: list[Any]) -> str:
    return f"{summary_line(rows)}\n{noise_line(rows)}"


def _finished_children(client: Any, parent: Any) -> list[Any]:
    """The parent's children that FINISHED and were not marked invalid (the logged repeats
    whose spread is the noise)."""
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'",
                              max_results=5000)
    return [r for r in runs if r.info.status == "FINISHED"
            and r.data.tags.get("run_valid") != "false"]


def _rerun_point(client: Any, logged: Logged, uri: str, repeats: int, root: Path,
                 run_point: PointRunner, max_other_cpu_share: float | None,
                 cpu_watch: Any) -> RerunResult:
    tags, parent_tags = logged.run.data.tags, logged.parent.data.tags
    run_id = logged.run.info.run_id
    nb = Path(tags.get("notebook") or parent_tags.get("notebook") or "")
    if not nb.is_file():
        raise UserError(f"notebook ({str(nb)!r}) of sweep point {run_id} is not a file; "
                        "restore it there to rerun the point")
    param = tags.get("sweep_param", "")
    value = json.loads(tags.get("sweep_value", "null"))
    fixed = dict(json.loads(parent_tags.get("fixed") or "{}"))
    restored, notes = restored_defaults(nb, param, {param: value, **fixed},
                                        logged.run.data.params)
    fixed.update(restored)
    notes.append("a sweep point logs no hardware fingerprint or git sha: neither is checked")
    say("note", notes)
    preflight = collect_preflight()
    store = Store(logged.experiment, uri)
    new_id = store.create_run(f"rerun of {logged.run.info.run_name}",
                              tags=rerun_tags(logged, preflight))
    out = results_folder(logged, root)
    (out / "notebooks").mkdir()
    name = logged.run.info.run_name or f"{param}={value}"
    measured = []
    try:
        for i in range(repeats):
            path = out / "notebooks" / f"{i:02d}_{slug(f'{param}={value}')}.ipynb"
            row = run_point(nb, param, value, fixed, store=store, parent=new_id, out=path,
                            max_other_cpu_share=max_other_cpu_share, cpu_watch=cpu_watch)
            store.set_tags(row["run_id"], {"role": "rerun", "rerun_of": run_id})
            got = client.get_run(row["run_id"]).data.metrics
            measured.append({
                "label": name, "repeat": i + 1, "run_id": row["run_id"],
                "status": row["status"], "valid": row["valid"], "error": row["error"],
                "notebook": str(path),
                "metrics": {k: v for k, v in got.items() if k not in VALIDITY_METRICS}})
    except BaseException:  # Ctrl-C: the rerun run is not left RUNNING
        store.client.set_terminated(new_id, status="KILLED")
        raise
    center = {k: v for k, v in logged.run.data.metrics.items() if k not in VALIDITY_METRICS}
    new = [m["metrics"] for m in measured if m["status"] == "FINISHED" and m["valid"]]
    rows = compare(name, center, [center], new, sorted(center), "spread")
    result = RerunResult(new_id, run_id, logged.kind, logged.experiment, uri, rows,
                         drift_table(rows), _summary(rows), verdict_word(rows), measured,
                         [], notes)
    csv_rows = [{"param": param, "value": json.dumps(value), **{k: v for k, v in m.items()
                                                              if k != "metrics"},
                 **m["metrics"]} for m in measured]
    return finish(store, result, median_metrics(rows, keyed=False), csv_rows,
                  ["param", "value", "label", "repeat", "run_id", "status", "valid", "error",
                   "notebook"], out)


# ----------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench rerun",
        description="Measure a logged experiment run or sweep point again; print its metrics "
                    "beside the logged ones (same / drifted beyond noise).")
    ap.add_argument("run_id", help="an experiment's parent or child run, or a sweep point")
    ap.add_argument("--repeats", type=int, default=1,
                    help="new runs per configuration (default 1; 3 give a noise band of their "
                         "own where the run logged a single value)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow URI (default: ./mlruns)")
    ap.add_argument("--results-dir", default=None, metavar="ROOT",
                    help="write results/<experiment>-rerun/<UTC time>/ under ROOT (default: "
                         "results/ at the checkout's root, or $WORKBENCH_RESULTS_DIR)")
    ap.add_argument("--max-other-cpu-share", type=float, default=None, metavar="SHARE",
                    help="a new run is invalid (never compared) when other processes used "
                         "more than this share of the CPUs meanwhile")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars or lines")
    return ap


def main(argv: list[str] | None = None, run_point: PointRunner | None = None) -> int:
    """CLI entry; exit status 1 when a new run failed (refused input: 2, via workbench.cli)."""
    ap = _parser()
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.repeats < 1:
        ap.error(f"--repeats ({args.repeats}) must be >= 1")
    if args.max_other_cpu_share is not None and not 0 <= args.max_other_cpu_share <= 1:
        ap.error(f"--max-other-cpu-share ({args.max_other_cpu_share}) must be in [0, 1]")
    result = rerun(args.run_id, args.tracking_uri, args.repeats, progress=not args.no_progress,
                   results_dir=args.results_dir, run_point=run_point,
                   max_other_cpu_share=args.max_other_cpu_share)
    print(f"\n# rerun of {result.kind} run {result.rerun_of} ({result.experiment})\n")
    print(result.table)
    print(f"\n{result.summary}")
    print(f"MLflow run {result.run_id} (rerun_of={result.rerun_of}) in {result.tracking_uri}")
    print(f"results folder: {result.results_dir}")
    return 1 if result.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
