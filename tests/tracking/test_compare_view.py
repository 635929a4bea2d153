"""The same knob from `workbench run` (a template) and `workbench sweep` (a notebook) lines
up in one MLflow store: one param key, children named by value labels, the parent carrying
the question as its description and the verdict as metrics, the experiments of the runs kind."""

from __future__ import annotations

from pathlib import Path

import mlflow
import nbformat

from tests.experiments.template_dicts import TINY_BUDGET, changed
from workbench.experiments.runner import run_experiment
from workbench.experiments.stages.publish import VERDICT_CODES
from workbench.experiments.template import parse_template
from workbench.sweeps.driver import sweep
from workbench.tracking.mlflow_store import EXPERIMENT_KIND, KIND_TAG, NOTE_TAG

TEMPLATE = changed(TINY_BUDGET, name="tiny-compare")


def _notebook(path: Path) -> Path:
    """A notebook whose parameters name the knob as notebook 03 does (`budget`)."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'budget = 256\nconcurrency = 2\nmlflow_uri = ""\nmlflow_parent_run_id = ""\n'
        'mlflow_experiment = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("print('budget', budget)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def test_run_and_sweep_of_one_knob_line_up(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_experiment(parse_template(TEMPLATE), uri=uri, progress=False,
                            max_other_cpu_share=1.0)  # never "disturbed": a verdict
    rows = sweep(_notebook(tmp_path / "nb.ipynb"), "budget", [64, 128], experiment="tiny-sweep",
                 uri=uri, out_dir=tmp_path / "out", progress=False)
    assert [r["status"] for r in rows] == ["FINISHED", "FINISHED"]

    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    for name in ("tiny-compare", "tiny-sweep"):
        assert client.get_experiment_by_name(name).tags[KIND_TAG] == EXPERIMENT_KIND
    kids = mlflow.search_runs(experiment_names=["tiny-compare", "tiny-sweep"],
                              filter_string="tags.mlflow.parentRunId != ''",
                              output_format="list")
    got = sorted((r.info.run_name, r.data.params["max_num_batched_tokens"],
                  r.data.params["concurrency"]) for r in kids)
    assert got == [("baseline (256) r1", "256", "2"), ("budget=128", "128", "2"),
                   ("budget=64", "64", "2"), ("budget=64 r1", "64", "2")]
    for r in kids:  # no other spelling of the knob on either path
        assert not {"budget", "engine.max_num_batched_tokens",
                    "arrivals.concurrency"} & set(r.data.params), r.data.params
    exp_kids = {r.info.run_name: r for r in kids if r.data.tags.get("kind") != "sweep-point"}
    assert {n: (r.data.tags["role"], r.data.tags["verdict"]) for n, r in exp_kids.items()} == {
        "baseline (256) r1": ("baseline", "baseline"),
        "budget=64 r1": ("variant", result.verdicts[0].metrics["p95_itl_ms"].verdict)}

    parent = client.get_run(result.parent_run_id)
    vv = result.verdicts[0]
    obj = vv.metrics["p95_itl_ms"]
    effect = f"p95_itl_ms {obj.relative_effect:+.1%} ({obj.verdict})"
    # one repeat a side decides nothing: undecided, whatever the numbers
    assert (vv.decision, obj.verdict, vv.adopted) == ("undecided", "undecided", False)
    head = "**Verdict: undecided**: keep baseline (256) for now; 1 variant(s) need more repeats"
    assert parent.data.tags[NOTE_TAG] == (
        f"{TEMPLATE['question']}\n\n{head}\n\n- budget=64: {vv.decision}, {effect}\n\n"
        "The full table: Artifacts, VERDICT.md.")
    assert parent.data.tags["baseline"] == "budget=256"
    vv = result.verdicts[0]
    assert parent.data.tags["adopted"] == ("budget=64" if vv.adopted else "none")
    obj = vv.metrics["p95_itl_ms"]
    assert parent.data.metrics == {
        "p95_itl_ms/budget_64": obj.variant_median,
        "p95_itl_ms/baseline": obj.baseline_median,
        "delta_pct/budget_64": 100.0 * obj.relative_effect,
        "verdict/budget_64": VERDICT_CODES[obj.verdict],
        "adopted/budget_64": float(vv.adopted)}
    assert "VERDICT.md" in {a.path for a in client.list_artifacts(result.parent_run_id)}
