"""Notebook glue: where a notebook's MLflow runs go, and publishing its figures and numbers.

Every notebook under notebooks/ declares the same three tracking parameters:

    mlflow_uri = ""              # empty: no logging (or a throwaway temp store, see below)
    mlflow_parent_run_id = ""    # set by `workbench sweep`: this point's run in the sweep
    mlflow_experiment = "notebooks"

`resolve_tracking_uri("")` returns a fresh temporary sqlite store, so a notebook that needs
MLflow to work (an experiment, a comparison) runs in CI without touching the repo's mlruns/.
`publish(...)` saves figures to `figures_dir` when given and logs metrics, params, tags, tables
and figures to MLflow only when `mlflow_uri` is given: into `mlflow_parent_run_id` when a sweep
injected it, else into a new run of `mlflow_experiment`. `ensure_experiment` keeps a sqlite
store's artifacts beside its database file and tags it for MLflow's runs view (call it before
`run_experiment` in a notebook). Params are logged under the knob keys of
`workbench.tracking.param_keys` (notebook 03's `budgets` as `max_num_batched_tokens`).
`raw_template(template_file, default)` reads a template (or this checkout's
experiments/<default>) and `override_template(raw, ...)` scales it down to a notebook's
parameters before `parse_template`.
"""

from __future__ import annotations

import copy
import io
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from workbench.analysis.plots import save
from workbench.tracking.mlflow_store import artifact_location


def ensure_experiment(name: str, uri: str) -> None:
    """Create experiment `name` with its artifacts beside a sqlite store's file
    (<db folder>/artifacts/<name>) unless it exists. Without this, MLflow puts the artifacts
    of a sqlite store in ./mlruns of whatever folder the process runs in (for a notebook:
    notebooks/). Other stores (an MLflow server) choose for themselves: nothing is done."""
    from mlflow.tracking import MlflowClient

    from workbench.tracking.mlflow_store import ensure_kind

    location = artifact_location(uri, name)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    if exp is None and location is None:
        return  # a server: `Store` creates it (with the kind tag) where the server says
    exp_id = (client.create_experiment(name, artifact_location=location) if exp is None
              else exp.experiment_id)
    ensure_kind(client, exp_id)  # the UI opens it on the runs table (tracking.mlflow_store)


def temp_tracking_uri() -> str:
    """A new, empty sqlite tracking store in a temporary directory."""
    return f"sqlite:///{Path(tempfile.mkdtemp(prefix='wb-mlflow-')) / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None) -> str:
    """`uri` when given, else a temporary store (`temp_tracking_uri`)."""
    return uri if uri else temp_tracking_uri()


def publish(
    name: str,
    *,
    metrics: Mapping[str, float] | None = None,
    figures: Mapping[str, Figure | None] | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    figures_dir: str | Path = "",
    mlflow_uri: str = "",
    mlflow_parent_run_id: str = "",
    mlflow_experiment: str = "notebooks",
) -> dict[str, Any]:
    """Save `figures` as <figures_dir>/<key>.png; log everything to MLflow when `mlflow_uri`
    is given. Returns {"figures": [paths], "run_id": the run logged into, or None}. A figure
    that is None (a plot with no data, e.g. acceptance at k = 0) is left out."""
    out: dict[str, Any] = {"figures": [], "run_id": None}
    drawn = {key: fig for key, fig in (figures or {}).items() if fig is not None}
    if figures_dir:
        out["figures"] = [save(fig, Path(figures_dir) / f"{key}.png")
                          for key, fig in drawn.items()]
    if not mlflow_uri:
        return out
    from workbench.tracking.mlflow_store import Store
    from workbench.tracking.param_keys import notebook_params

    ensure_experiment(mlflow_experiment, mlflow_uri)
    store = Store(mlflow_experiment, mlflow_uri)
    run_id = mlflow_parent_run_id or store.create_run(name, tags={"kind": "notebook"})
    if params and not mlflow_parent_run_id:  # a sweep run already holds the parameters
        store.log_params(run_id, notebook_params(params))  # knob names as everywhere
    store.log_metrics(run_id, dict(metrics or {}))
    if tags:
        store.set_tags(run_id, dict(tags))
    files: dict[str, str | bytes] = {
        f"{name}/{key}.csv": frame.to_csv(index=False) for key, frame in (tables or {}).items()
    }
    for key, fig in drawn.items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        files[f"{name}/{key}.png"] = buf.getvalue()
    if files:
        store.log_files(run_id, files)
    if not mlflow_parent_run_id:
        store.finish(run_id)
    out["run_id"] = run_id
    return out


EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def raw_template(template_file: str | Path, default: str) -> dict[str, Any]:
    """The raw (unparsed) template in `template_file`, or when that is empty this checkout's
    experiments/<default>."""
    from workbench.experiments.template import read_yaml

    path = Path(template_file) if template_file else EXPERIMENTS / default
    raw = read_yaml(path, "template")
    if not isinstance(raw, dict):
        raise ValueError(f"template {path} must be a mapping, not {type(raw).__name__}")
    return raw


def override_template(
    raw: Mapping[str, Any],
    *,
    name: str | None = None,
    seed: int | None = None,
    workload_params: Mapping[str, Any] | None = None,
    arrivals: Mapping[str, Any] | None = None,
    repeats: int | None = None,
    values: list[Any] | None = None,
    drop: tuple[str, ...] = (),
    max_repeats: int | None = None,
) -> dict[str, Any]:
    """A copy of a raw template with a notebook's overrides: experiment `name`, workload
    `seed`, `workload_params` merged into the workload's params, `arrivals` replaced,
    `repeats`, the variable's `values` (when non-empty), and the top-level keys in `drop`
    removed (e.g. "quality_gate"). None leaves a field as the template has it. A notebook
    that sets `repeats` runs that many: the template's adaptive rounds (`max_repeats`) are
    dropped unless `max_repeats` is given too."""
    out = copy.deepcopy(dict(raw))
    for key in drop:
        out.pop(key, None)
    if name is not None:
        out["name"] = name
    if seed is not None:
        out["workload"]["seed"] = seed
    if workload_params:
        out["workload"]["params"] = {**out["workload"].get("params", {}), **workload_params}
    if arrivals is not None:
        out["arrivals"] = dict(arrivals)
    if repeats is not None:
        out["repeats"] = repeats
        out.pop("max_repeats", None)
    if max_repeats is not None:
        out["max_repeats"] = max_repeats
    if values:
        out["variable"] = {**out["variable"], "values": list(values)}
    return out
