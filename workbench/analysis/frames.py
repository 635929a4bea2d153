"""pandas frames read back from MLflow: runs, parent runs, and baseline-vs-variant comparisons.

Place in the flow: `workbench.experiments.runner` and `workbench.sweeps` write one parent run
per experiment or sweep and one child run per (value, repeat); these functions read them back.

    runs_frame(experiment)            one row per child run:
        run_id, run_name, status, start_time, end_time, duration_s, parent_run_id,
        params.<key>  (JSON scalars parsed: "512" -> 512), metrics.<key> (latest value),
        tags.<key>    (MLflow's own "mlflow.*" tags left out)
    parent_runs(experiment)           the same columns for top-level runs, newest first
    compare_frame(parent_run_id, ms)  one row per (variant value, metric): medians over the
        FINISHED repeats, delta, relative effect, the interval of the difference and the
        verdict, computed by `workbench.experiments.verdict.compare_metric` (the same rule the
        experiment's decision used: the Welch interval at the template's alpha over its
        planned looks; a run logged with a `noise` band is read with that band)

Children are grouped by their `value` tag; the baseline's label is "baseline".
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.tracking.mlflow_store import tracking_uri

PARENT_TAG = "mlflow.parentRunId"
BASELINE_LABEL = "baseline"
COMPARE_COLUMNS = [
    "variable", "value", "metric", "direction", "n_baseline", "n_variant", "baseline_median",
    "variant_median", "delta", "relative_effect", "noise_low", "noise_high", "verdict",
]


def _client(uri: str | None) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri(uri))


def _experiment_id(client: Any, experiment_name: str) -> str:
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"experiment ({experiment_name!r}) is not in this tracking store; "
                         f"known experiments: {known}")
    return str(exp.experiment_id)


def _search(client: Any, experiment_ids: list[str], filter_string: str = "") -> list[Any]:
    """Every run matching `filter_string`, all pages."""
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string,
                                  max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _parse(value: str) -> Any:
    """JSON scalars become numbers/bools/None; anything else stays the logged string."""
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return value
    return parsed if parsed is None or isinstance(parsed, bool | int | float) else value


def _row(run: Any) -> dict[str, Any]:
    info, data = run.info, run.data
    start = pd.to_datetime(info.start_time, unit="ms") if info.start_time else pd.NaT
    end = pd.to_datetime(info.end_time, unit="ms") if info.end_time else pd.NaT
    row: dict[str, Any] = {
        "run_id": info.run_id,
        "run_name": info.run_name,
        "status": info.status,
        "start_time": start,
        "end_time": end,
        "duration_s": (info.end_time - info.start_time) / 1000.0
        if info.end_time and info.start_time else float("nan"),
        "parent_run_id": data.tags.get(PARENT_TAG),
    }
    row.update({f"params.{k}": _parse(v) for k, v in sorted(data.params.items())})
    row.update({f"metrics.{k}": float(v) for k, v in sorted(data.metrics.items())})
    row.update({f"tags.{k}": v for k, v in sorted(data.tags.items())
                if not k.startswith("mlflow.")})
    return row


def _frame(runs: list[Any], newest_first: bool = False) -> pd.DataFrame:
    frame = pd.DataFrame([_row(r) for r in runs])
    if frame.empty:
        return pd.DataFrame(columns=["run_id", "run_name", "status", "start_time", "end_time",
                                     "duration_s", "parent_run_id"])
    for col in [c for c in frame.columns if c.startswith("params.")]:
        values = frame[col].dropna()
        if len(values) and all(isinstance(v, int | float) and not isinstance(v, bool)
                               for v in values):
            frame[col] = pd.to_numeric(frame[col])
    frame = frame.sort_values("start_time", ascending=not newest_first, kind="stable")
    return frame.reset_index(drop=True)


def runs_frame(
    experiment_name: str | None, uri: str | None = None, *, parent_run_id: str | None = None
) -> pd.DataFrame:
    """One row per child run of `experiment_name` (only `parent_run_id`'s when given; the
    experiment may then be None: the parent's)."""
    client = _client(uri)
    if experiment_name is None:
        if not parent_run_id:
            raise ValueError("runs_frame needs an experiment_name or a parent_run_id")
        exp_id = str(client.get_run(parent_run_id).info.experiment_id)
    else:
        exp_id = _experiment_id(client, experiment_name)
    filt = f"tags.`{PARENT_TAG}` = '{parent_run_id}'" if parent_run_id else ""
    runs = [r for r in _search(client, [exp_id], filt) if PARENT_TAG in r.data.tags]
    return _frame(runs)


def parent_runs(experiment_name: str, uri: str | None = None) -> pd.DataFrame:
    """One row per top-level run (an experiment or a sweep) of `experiment_name`, newest
    first."""
    client = _client(uri)
    exp_id = _experiment_id(client, experiment_name)
    runs = [r for r in _search(client, [exp_id]) if PARENT_TAG not in r.data.tags]
    return _frame(runs, newest_first=True)


def _label_order(labels: list[str]) -> list[str]:
    """Numeric labels in numeric order, others in order of first appearance."""
    unique = list(dict.fromkeys(labels))
    try:
        return sorted(unique, key=float)
    except ValueError:
        return unique


def compare_frame(
    parent_run_id: str,
    metric_list: Sequence[str] | None = None,
    uri: str | None = None,
    *,
    noise: str | None = None,
    baseline: str = BASELINE_LABEL,
) -> pd.DataFrame:
    """Baseline vs each variant of one experiment, per metric (columns: COMPARE_COLUMNS).

    `metric_list` defaults to the metrics the verdict reports; `noise` ("welch", "spread"
    or "bootstrap") defaults to the template's `noise` if it logged one, else "welch" with
    the template's alpha (split over its planned looks) and smallest_effect. Only FINISHED
    child runs count.
    """
    from workbench.experiments.verdict import REPORTED, compare_metric, direction

    client = _client(uri)
    parent = client.get_run(parent_run_id)
    params = parent.data.params
    method = noise or str(params.get("template.noise", "welch"))
    if method not in ("welch", "spread", "bootstrap"):
        raise ValueError(f"noise ({method!r}) must be 'welch', 'spread' or 'bootstrap'")
    repeats = int(params.get("template.repeats", 3))
    looks = max(repeats, int(params.get("template.max_repeats", repeats))) - repeats + 1
    alpha = float(params.get("template.alpha", 0.05)) / looks  # `sequential`
    smallest = float(params.get("template.smallest_effect", 0.02))
    children = [r for r in _search(client, [parent.info.experiment_id],
                                   f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
                if r.info.status == "FINISHED" and "value" in r.data.tags]
    groups: dict[str, list[dict[str, float]]] = {}
    for r in children:
        groups.setdefault(r.data.tags["value"], []).append(dict(r.data.metrics))
    if not groups.get(baseline):
        raise ValueError(f"parent run {parent_run_id} has no FINISHED child run tagged "
                         f"value={baseline!r}; found values {sorted(groups)}")
    variable = parent.data.tags.get("variable", "")
    metrics = list(metric_list) if metric_list else list(REPORTED)
    rows = []
    for label in _label_order([k for k in groups if k != baseline]):
        for m in metrics:
            base = [r[m] for r in groups[baseline] if m in r]
            var = [r[m] for r in groups[label] if m in r]
            if not base or not var:
                continue
            v = compare_metric(m, base, var, method, alpha, smallest)
            rows.append([variable, _parse(label), m, direction(m), len(base), len(var),
                         v.baseline_median, v.variant_median, v.delta, v.relative_effect,
                         v.noise_low, v.noise_high, v.verdict])
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def run_artifact_frame(run_id: str, path: str = "requests.csv", uri: str | None = None
                       ) -> pd.DataFrame:
    """A CSV artifact of one run (e.g. the per-request table) as a DataFrame."""
    client = _client(uri)
    with tempfile.TemporaryDirectory() as tmp, no_progress_bar():
        local = client.download_artifacts(run_id, path, dst_path=tmp)
        return pd.read_csv(Path(local))


@contextmanager
def no_progress_bar() -> Iterator[None]:
    """Silence MLflow's per-download progress bar (noise in a notebook's output)."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    old = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def request_frames(parent_run_id: str, uri: str | None = None, repeat: int = 0
                   ) -> dict[str, pd.DataFrame]:
    """{value label: requests.csv of its repeat `repeat`} for every FINISHED child run."""
    client = _client(uri)
    parent = client.get_run(parent_run_id)
    children = _search(client, [parent.info.experiment_id],
                       f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
    chosen: dict[str, str] = {}
    for r in children:
        tags = r.data.tags
        if r.info.status == "FINISHED" and tags.get("repeat") == str(repeat) and "value" in tags:
            chosen.setdefault(tags["value"], r.info.run_id)
    order = [BASELINE_LABEL] * (BASELINE_LABEL in chosen) + _label_order(
        [k for k in chosen if k != BASELINE_LABEL])
    return {label: run_artifact_frame(chosen[label], "requests.csv", uri) for label in order}

