"""`sweep(notebook, param, values)`: check the input, start the executor, run every point under
one MLflow parent run, resume, retry the disturbed points, write the report (the package
docstring has the layout of runs and folders).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.sweeps.inputs import check_names, check_values, declared_parameters, kernel_language
from workbench.sweeps.notebook_run import absolute_uri, run_point
from workbench.sweeps.report import value_key
from workbench.sweeps.resume import copy_notebook, finished_points, latest_parent, mark_killed

if TYPE_CHECKING:
    from workbench.experiments.executors.base import Executor
    from workbench.experiments.executors.config import ExecutorConfig


def _slug(value: Any) -> str:
    text = value if isinstance(value, str) else value_key(value)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:60] or "_"


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool, desc: str) -> Any:
    """A tqdm bar of points on stderr (`update`, `close`), or one that shows nothing."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with transformers; no bar without it
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="point", file=sys.stderr)


def sweep(
    notebook: str | Path,
    param: str,
    values: Sequence[Any],
    *,
    fixed: dict[str, Any] | None = None,
    experiment: str | None = None,
    uri: str | None = None,
    resume: bool = False,
    results_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    kernel_name: str | None = None,
    progress: bool = True,
    max_other_cpu_share: float | None = None,
    cpu_watch: Any = None,
    executor: ExecutorConfig | None = None,
    retry_invalid: int = 0,
    load_watch: Any = None,
) -> list[dict[str, Any]]:
    """One papermill run per value; one row per value: {value, status, output_path, run_id,
    error, valid, other_cpu_share, metrics, results_dir}. status is FINISHED, FAILED or
    (resume) SKIPPED; metrics: what the point's run logged (`point_metrics`). The folder
    <results_dir>/<experiment>/<UTC time>/ (root default: `results.default_root()`; `out_dir`
    is its old name) holds notebooks/, runs.csv, runs.json and summary.md.
    `max_other_cpu_share` (default validity.DEFAULT_MAX_OTHER_CPU_SHARE) and `cpu_watch`
    (default validity.default_cpu_watch()) judge each point's disturbance. `executor`: an
    `executors.ExecutorConfig` (default: local, here one point after another).
    Before anything runs: every value is checked against the notebook's declared parameter
    types (`check_values`), the kernel is resolved (`kernel_language`), and (locally) the
    machine's load is watched for a second (`load_watch`, default like `cpu_watch`): a
    warning line on stderr when others already take more than the threshold.
    `retry_invalid`: run each INVALID (disturbed) point again up to this many times; the
    last try's row is kept. Every row carries `parent_run_id` and `results_dir`."""
    from workbench.experiments.executors.config import ExecutorConfig, check_tracking_uri
    from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, default_cpu_watch

    if max_other_cpu_share is None:
        max_other_cpu_share = DEFAULT_MAX_OTHER_CPU_SHARE
    if not 0 <= max_other_cpu_share <= 1:
        raise ValueError(f"max_other_cpu_share ({max_other_cpu_share}) must be in [0, 1]")
    if isinstance(retry_invalid, bool) or not isinstance(retry_invalid, int) or \
            retry_invalid < 0:
        raise ValueError(f"retry_invalid ({retry_invalid!r}) must be an integer >= 0")

    nb = Path(notebook).resolve()
    if not nb.is_file():
        raise ValueError(f"notebook ({str(notebook)!r}) is not a file")
    values, fixed = list(values), dict(fixed or {})
    if not values:
        raise ValueError("values is empty; give at least one value to sweep")
    keys = [value_key(v) for v in values]
    if len(set(keys)) != len(keys):
        raise ValueError(f"values ({values}) contain duplicates; give each value once")
    language = kernel_language(nb, kernel_name)
    declared = declared_parameters(nb, kernel_name, language)
    check_names(declared, param, fixed, nb)
    check_values(nb, declared, param, values, fixed)
    config = executor or ExecutorConfig()
    check_tracking_uri(config, uri)
    if config.kind == "local":  # on a cluster each node's load is its own
        _warn_if_busy(load_watch if load_watch is not None else default_cpu_watch(),
                      max_other_cpu_share)
    from workbench.experiments.executors.factory import make_executor

    ex = make_executor(config)  # a cluster: connected, its node resource checked
    try:
        return _sweep(ex, nb, param, values, keys, fixed, declared, experiment=experiment,
                      uri=uri, resume=resume, root=results_dir if results_dir is not None
                      else out_dir, kernel_name=kernel_name, language=language,
                      progress=progress, max_other_cpu_share=max_other_cpu_share,
                      cpu_watch=cpu_watch if cpu_watch is not None else default_cpu_watch(),
                      retry_invalid=retry_invalid)
    finally:
        ex.close()


def _warn_if_busy(watch: Any, threshold: float) -> None:
    from workbench.harness.validity import busy_machine_line, load_before_start

    line = busy_machine_line(load_before_start(watch), threshold)
    if line is not None:
        print(f"workbench sweep: {line}", file=sys.stderr, flush=True)


def _sweep(ex: Executor, nb: Path, param: str, values: list[Any], keys: list[str],
           fixed: dict[str, Any], declared: dict[str, Any], *, experiment: str | None,
           uri: str | None, resume: bool, root: str | Path | None, kernel_name: str | None,
           language: str | None, progress: bool, max_other_cpu_share: float, cpu_watch: Any,
           retry_invalid: int) -> list[dict[str, Any]]:
    """`sweep` once its input is checked and the executor `ex` is ready."""
    from workbench.analysis.notebook import ensure_experiment
    from workbench.sweeps.points import run_points
    from workbench.tracking.mlflow_store import Store, tracking_uri

    name = experiment or f"sweep-{nb.stem}"
    ensure_experiment(name, tracking_uri(absolute_uri(uri)))
    store = Store(name, absolute_uri(uri))
    parent = latest_parent(store, nb, param) if resume else None
    done = finished_points(store, parent) if parent else {}
    if parent:
        for line in mark_killed(store, parent):
            print(f"workbench sweep: {line}", file=sys.stderr, flush=True)
    if parent is None:
        parent = store.create_run(f"sweep {nb.stem} {param}", tags={
            "kind": "sweep", "notebook": str(nb), "notebook_name": nb.name,
            "sweep_param": param, "sweep_values": json.dumps(keys), "fixed": value_key(fixed)})
        store.log_params(parent, {"notebook": str(nb), "param": param, "fixed": fixed})
    else:
        old = json.loads(store.client.get_run(parent).data.tags.get("sweep_values", "[]"))
        store.set_tags(parent, {"sweep_values": json.dumps(list(dict.fromkeys(old + keys)))})
        store.client.update_run(parent, status="RUNNING")
    from workbench.experiments.results import new_results_dir

    folder = new_results_dir(name, root)
    run_dir = folder / "notebooks"
    run_dir.mkdir(parents=True, exist_ok=True)
    slots: list[dict[str, Any] | None] = [None] * len(values)
    ctx = {"store": store, "parent": parent, "nb": nb, "param": param, "fixed": fixed,
           "declared": declared, "kernel_name": kernel_name, "language": language,
           "values": values,
           "max_other_cpu_share": max_other_cpu_share, "cpu_watch": cpu_watch}
    bar = _progress(len(values), progress, f"{nb.stem} {param}")
    todo: list[int] = []
    for i, value in enumerate(values):
        if keys[i] in done:
            run_id, output = done[keys[i]]
            output = copy_notebook(output, run_dir)
            slots[i] = {"value": value, "status": "SKIPPED", "output_path": output,
                        "run_id": run_id, "error": None, "valid": True,
                        "other_cpu_share": None, "node": None}
            bar.update(1)
        else:
            todo.append(i)
    points = [(values[i], keys[i], run_dir / f"{i:02d}_{param}={_slug(values[i])}.ipynb")
              for i in todo]
    try:  # in order here; on a cluster each point a Ray task (`sweeps.points`)
        for finished in run_points(ex, ctx, points, run_point):
            slots[todo[finished.index]] = finished.value
            bar.update(1)
        for attempt in range(1, retry_invalid + 1):
            again = [i for i in todo if (row := slots[i]) is not None and not row["valid"]]
            if not again:
                break
            print(f"workbench sweep: {len(again)} INVALID point(s) run again (retry "
                  f"{attempt} of {retry_invalid})", file=sys.stderr, flush=True)
            retry = [(values[i], keys[i], run_dir / f"{i:02d}_{param}={_slug(values[i])}"
                      f"_retry{attempt}.ipynb") for i in again]
            for finished in run_points(ex, ctx, retry, run_point):
                slots[again[finished.index]] = finished.value
    finally:
        bar.close()
        rows = [r for r in slots if r is not None]
        failed = len(rows) < len(values) or any(r["status"] == "FAILED" for r in rows)
        from workbench.sweeps.notebook_specs import sweep_metrics
        from workbench.sweeps.report import report

        for r in rows:
            r["results_dir"], r["parent_run_id"] = str(folder), parent
        try:
            report(store, parent, nb, param, [r["value"] for r in rows], fixed, rows, folder,
                   sweep_metrics(nb))
        except Exception as e:  # noqa: BLE001 - the points are logged; the parent still ends
            print(f"workbench sweep: the sweep's report was not written: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        store.finish(parent, failed=failed)
    return rows
