"""The children of an experiment in MLflow's runs table: each with its own readable name
(value label and repeat), and the link `workbench run` prints opens them with metric
columns (an MLflow shared view: `workbench.tracking.runs_view`)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from mlflow.tracking import MlflowClient

from tests.experiments.test_interrupt import PARENT_TAG, TEMPLATE
from workbench.experiments import runner
from workbench.experiments.template import parse_template
from workbench.tracking.runs_view import SHARED_VIEW_PREFIX, children_view
from workbench.tracking.ui import experiment_urls


def test_children_have_unique_names_and_a_view_with_metric_columns(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = runner.run_experiment(parse_template(TEMPLATE), uri=uri, progress=False,
                                   check=False)
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result.parent_run_id)
    exp = parent.info.experiment_id
    kids = client.search_runs([exp], f"tags.`{PARENT_TAG}` = '{result.parent_run_id}'",
                              order_by=["attributes.start_time ASC"])
    assert [k.info.run_name for k in kids] == [
        "baseline (256) r1", "budget=64 r1", "baseline (256) r2", "budget=64 r2"]

    key = parent.data.tags["runs_view"]
    view = json.loads(client.get_experiment(exp).tags[SHARED_VIEW_PREFIX + key])
    columns = ["metrics.`p95_itl_ms`", "metrics.`p95_ttft_ms`", "metrics.`p95_tpot_ms`",
               "metrics.`output_throughput`", "metrics.`other_cpu_share`",
               "params.`max_num_batched_tokens`"]
    assert view == {
        "searchFilter": f"tags.mlflow.parentRunId = '{result.parent_run_id}'",
        "orderByKey": "metrics.`p95_itl_ms`", "orderByAsc": True,
        "selectedColumns": columns, "columnOrder": columns}  # the objective first
    assert all(c.split(".", 1)[1].strip("`") in k.data.metrics
               for c in view["selectedColumns"][:5] for k in kids)

    table, _ = experiment_urls(uri, result.parent_run_id, "p95_itl_ms",
                               base="http://127.0.0.1:5000")
    parts = urlsplit(table)
    assert parts.fragment.startswith(f"/experiments/{exp}/runs?")
    query = parse_qs(parts.fragment.split("?", 1)[1])
    # a search facet beside the key would make MLflow ignore the shared view
    assert query == {"workflowType": ["machine_learning"], "viewStateShareKey": [key]}


def test_a_view_needs_its_sort_column() -> None:
    view = children_view("abc", ["goodput"], ascending=False)
    assert view["orderByKey"] == "metrics.`goodput`" and view["orderByAsc"] is False
    with pytest.raises(ValueError) as e:
        children_view("abc", [])
    assert str(e.value) == "metrics must name at least the objective (the sort column)"
