"""An experiment's child runs in MLflow's runs table, with metric columns.

MLflow 3's runs table shows the attribute columns (Source, Models, Dataset) until someone
picks metrics under "Columns": the table of a parent's children opened from a bare link
(`ui.runs_url`) lists the runs with no numbers. MLflow's own "Share" button keeps a view as
an experiment tag `mlflow.sharedViewState.<key>` (JSON: the search facets `searchFilter`,
`orderByKey`, `orderByAsc` and the UI state `selectedColumns`, `runsExpanded`, ...) and opens
it with `#/experiments/<id>/runs?viewStateShareKey=<key>` (`columnOrder` puts the objective
first; MLflow orders metric columns by name otherwise). A link that also carries a search
facet ignores the shared view, so `view_url` carries the key alone.

    key = save_children_view(client, exp_id, parent, ["p95_itl_ms", ...], ["max_num_seqs"])
    view_url("http://127.0.0.1:5000", exp_id, key)   # the children, sorted, with columns

Column keys are MLflow's canonical ones: metrics.`name`, params.`name`. The key is a
digest of the view, so the same view is one tag however often it is saved; the parent run
carries it as tag `runs_view` (`ui.experiment_urls` links it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

SHARED_VIEW_PREFIX = "mlflow.sharedViewState."  # MLflow's experiment tag of a shared view
VIEW_TAG = "runs_view"  # the parent's tag: the key of its children's view


def column(kind: str, name: str) -> str:
    """MLflow's canonical column key: metrics.`p95_itl_ms`, params.`max_num_seqs`."""
    return f"{kind}.`{name}`"


def children_view(parent_run_id: str, metrics: Sequence[str], params: Sequence[str] = (),
                  ascending: bool = True) -> dict[str, Any]:
    """The view: `parent_run_id`'s children, sorted by `metrics[0]`, these columns shown."""
    if not metrics:
        raise ValueError("metrics must name at least the objective (the sort column)")
    cols = [column("metrics", m) for m in dict.fromkeys(metrics)]
    cols += [column("params", p) for p in dict.fromkeys(params)]
    return {"searchFilter": f"tags.mlflow.parentRunId = '{parent_run_id}'",
            "orderByKey": cols[0], "orderByAsc": ascending, "selectedColumns": cols,
            "columnOrder": cols}


def save_children_view(client: Any, experiment_id: str, parent_run_id: str,
                       metrics: Sequence[str], params: Sequence[str] = (),
                       ascending: bool = True) -> str:
    """Store the view (`children_view`) as the experiment's shared view; its key."""
    text = json.dumps(children_view(parent_run_id, metrics, params, ascending),
                      sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    client.set_experiment_tag(experiment_id, SHARED_VIEW_PREFIX + key, text)
    client.set_tag(parent_run_id, VIEW_TAG, key)
    return key


def view_url(base: str, experiment_id: str, key: str) -> str:
    """The runs table opened on the shared view `key` (the classic machine-learning view)."""
    query = urlencode({"workflowType": "machine_learning", "viewStateShareKey": key},
                      quote_via=quote)
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"
