"""`workbench rerun`: a logged experiment child, parent and sweep point measured again, the
comparison (same / drifted beyond noise), the warnings, the refusals, what is logged."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from mlflow.tracking import MlflowClient

from tests.experiments.template_dicts import TINY_BUDGET, changed
from workbench import cli
from workbench.errors import UserError
from workbench.experiments.drift import Drift, drift, drift_table, noise_line, summary_line
from workbench.experiments.rerun import rerun
from workbench.experiments.rerun_logged import template_from_params
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template
from workbench.tracking.mlflow_store import Store, flatten

PARENT_TAG = "mlflow.parentRunId"
METRICS = ["p95_itl_ms", "output_throughput", "request_throughput", "median_ttft_ms",
           "p95_ttft_ms", "median_tpot_ms", "p95_tpot_ms", "p95_e2el_ms", "error_rate"]
VERDICT = re.compile(r"same|drifted \([+-]\d+\.\d%\)")


# ----------------------------------------------------------------- the comparison, exactly
def test_drift_uses_the_logged_repeats_spread() -> None:
    # logged repeats 9, 10, 11: band = delta +- 2
    assert drift("budget=64", "p95_itl_ms", 10.0, [9.0, 10.0, 11.0], [11.5]) == Drift(
        "budget=64", "p95_itl_ms", 10.0, 11.5, 15.0, "same", "3 logged repeats")
    row = drift("budget=64", "p95_itl_ms", 10.0, [9.0, 10.0, 11.0], [13.0])
    assert (row.now, row.delta_pct, row.verdict) == (13.0, 30.0, "drifted (+30.0%)")
    # a child run logged 12 among repeats 9..11: the band moves to centre on 12
    row = drift("budget=64", "p95_itl_ms", 12.0, [9.0, 10.0, 11.0], [12.5])
    assert (row.logged, row.verdict, f"{row.delta_pct:.4f}") == (12.0, "same", "4.1667")
    assert drift("budget=64", "p95_itl_ms", 12.0, [9.0, 10.0, 11.0], [9.5]).verdict == (
        "drifted (-20.8%)")


def test_drift_with_one_logged_value() -> None:
    # one logged value: the new repeats' spread is the band (4.5..6.5 -> +-2)
    assert drift("x=1", "score", 5.0, [5.0], [5.5, 6.5, 4.5]) == Drift(
        "x=1", "score", 5.0, 5.5, 10.0, "same", "3 new repeats")
    # one of each: no band, any change is drift
    assert drift("x=1", "score", 5.0, [5.0], [5.0]).verdict == "same"
    assert drift("x=1", "score", 5.0, [5.0], [5.1]).verdict == "drifted (+2.0%)"
    assert drift("x=1", "score", 0.0, [0.0], [1.0]).verdict == "drifted (from 0)"
    assert drift("x=1", "score", 5.0, [5.0], []) == Drift(
        "x=1", "score", 5.0, None, None, "not measured", "-")


def test_drift_table_and_summary() -> None:
    rows = [drift("baseline (256)", "p95_itl_ms", 10.0, [9.0, 11.0], [10.5]),
            drift("budget=64", "p95_itl_ms", 4.0, [4.0, 4.0], [5.0])]
    assert drift_table(rows) == (
        "| config         | metric     | logged | now  | delta % | verdict          |\n"
        "|----------------|------------|--------|------|---------|------------------|\n"
        "| baseline (256) | p95_itl_ms | 10     | 10.5 | +5.0    | same             |\n"
        "| budget=64      | p95_itl_ms | 4      | 5    | +25.0   | drifted (+25.0%) |")
    assert drift_table(rows[:1]).splitlines()[0] == (
        "| metric     | logged | now  | delta % | verdict |")
    assert summary_line(rows) == "drifted: 1 of 2 metrics beyond noise (p95_itl_ms [budget=64])"
    assert summary_line(rows[:1]) == "same: every metric (1) within noise"
    assert noise_line(rows) == "noise band: the spread of 2 logged repeats"


def test_template_from_params_rebuilds_the_logged_template() -> None:
    assert template_from_params(flatten({"template": TINY_BUDGET, "other": 1})) == TINY_BUDGET


# ----------------------------------------------------------------- an experiment, rerun
@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    result = run_experiment(parse_template(changed(TINY_BUDGET, name="tiny-rerun")), uri=uri,
                            progress=False, max_other_cpu_share=1.0)
    assert [r.error for r in result.runs] == [None, None]
    return result, uri


@pytest.fixture
def tampered(experiment: tuple[Any, str]) -> Iterator[Any]:
    """Set run tags for one test (set_tag(run_id, key, value)), restored afterwards."""
    _, uri = experiment
    client = MlflowClient(tracking_uri=uri)
    saved: list[tuple[str, str, str]] = []

    def set_tag(run_id: str, key: str, value: str) -> None:
        saved.append((run_id, key, client.get_run(run_id).data.tags[key]))
        client.set_tag(run_id, key, value)

    yield set_tag
    for run_id, key, value in reversed(saved):
        client.set_tag(run_id, key, value)


def test_rerun_of_a_child_run(experiment: tuple[Any, str], tampered: Any,
                              capsys: pytest.CaptureFixture[str]) -> None:
    result, uri = experiment
    child = result.runs[1]  # budget=64, repeat 1
    tampered(child.run_id, "hardware_fingerprint", "000000000000")
    tampered(result.parent_run_id, "git_sha", "0" * 40)
    got = rerun(child.run_id, uri, progress=False)

    assert (got.kind, got.rerun_of, got.experiment) == ("experiment-child", child.run_id,
                                                        "tiny-rerun")
    assert got.workload_checksum == result.workload_checksum
    assert [(r.config, r.metric) for r in got.rows] == [("budget=64", m) for m in METRICS]
    assert [r.logged for r in got.rows] == [child.metrics[m] for m in METRICS]
    assert all(VERDICT.fullmatch(r.verdict) for r in got.rows), got.table
    assert got.rows[-1].verdict == "same"  # error_rate 0 -> 0
    assert got.verdict in ("same", "drifted") and not got.failed
    assert len(got.warnings) == 2
    assert got.warnings[0].startswith("hardware fingerprint ")
    assert "differs from the logged 000000000000: the numbers are not" in got.warnings[0]
    assert re.fullmatch(r"git sha \S+ differs from the logged 000000000000: the code changed "
                        r"since the run \(git diff 000000000000\)", got.warnings[1])
    err = capsys.readouterr().err
    assert f"workbench rerun: warning: {got.warnings[0]}" in err
    assert f"workbench rerun: warning: {got.warnings[1]}" in err

    client = MlflowClient(tracking_uri=uri)
    new = client.get_run(got.run_id)
    assert new.info.experiment_id == client.get_run(child.run_id).info.experiment_id
    assert new.info.status == "FINISHED" and PARENT_TAG not in new.data.tags
    assert {k: new.data.tags[k] for k in ("kind", "role", "rerun_of", "rerun_kind",
                                          "workload_checksum", "rerun_verdict")} == {
        "kind": "rerun", "role": "rerun", "rerun_of": child.run_id,
        "rerun_kind": "experiment-child", "workload_checksum": result.workload_checksum,
        "rerun_verdict": got.verdict}
    assert new.data.metrics == {r.metric: r.now for r in got.rows}
    assert {a.path for a in client.list_artifacts(got.run_id)} >= {"rerun.md", "rerun.json"}
    kids = client.search_runs([new.info.experiment_id],
                              filter_string=f"tags.`{PARENT_TAG}` = '{got.run_id}'")
    assert [(k.info.run_name, k.data.tags["role"], k.data.tags["rerun_of"],
             k.data.tags["value"], k.data.tags["workload_checksum"]) for k in kids] == [
        ("budget=64 r1", "rerun", child.run_id, "64", result.workload_checksum)]
    assert [m["run_id"] for m in got.measured] == [kids[0].info.run_id]

    folder = got.results_dir
    assert folder.parent.name == "tiny-rerun-rerun"
    assert sorted(p.name for p in folder.iterdir()) == [
        "rerun.json", "rerun.md", "runs.csv", "runs.json"]
    data = json.loads((folder / "rerun.json").read_text())
    assert data["rows"] == [r.as_dict() for r in got.rows]
    assert (data["rerun_of"], data["warnings"]) == (child.run_id, got.warnings)
    assert got.table in (folder / "rerun.md").read_text()


def test_rerun_of_the_parent_run_from_the_command_line(
        experiment: tuple[Any, str], capsys: pytest.CaptureFixture[str]) -> None:
    result, uri = experiment
    cli.main(["rerun", result.parent_run_id, "--tracking-uri", uri, "--no-progress"])
    out, err = capsys.readouterr()
    assert "warning" not in err  # same machine, same checkout
    assert f"# rerun of experiment run {result.parent_run_id} (tiny-rerun)" in out
    folder = Path(out.strip().splitlines()[-1].removeprefix("results folder: "))
    data = json.loads((folder / "rerun.json").read_text())
    assert [(r["config"], r["metric"]) for r in data["rows"]] == [
        (config, m) for config in ("baseline (256)", "budget=64") for m in METRICS]
    assert data["rows"][0]["logged"] == result.runs[0].metrics["p95_itl_ms"]  # one repeat
    assert all(VERDICT.fullmatch(r["verdict"]) for r in data["rows"])

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_run(result.parent_run_id).info.experiment_id
    [new] = client.search_runs(
        [exp], filter_string=f"tags.rerun_of = '{result.parent_run_id}' and tags.role = "
                             "'rerun' and tags.kind = 'rerun'")
    assert new.info.run_id == data["run_id"]
    assert f"MLflow run {new.info.run_id} (rerun_of={result.parent_run_id})" in out
    assert set(new.data.metrics) == {f"{m}/{key}" for key in ("baseline_256", "budget_64")
                                     for m in METRICS}
    assert new.data.tags["workload_checksum"] == result.workload_checksum
    kids = client.search_runs([exp], filter_string=f"tags.`{PARENT_TAG}` = '{data['run_id']}'")
    assert sorted(k.data.tags["value"] for k in kids) == ["64", "baseline"]
    assert {k.data.tags["rerun_of"] for k in kids} == {result.parent_run_id}


# ----------------------------------------------------------------- refusals
def test_refusals(experiment: tuple[Any, str], tampered: Any,
                  capsys: pytest.CaptureFixture[str]) -> None:
    result, uri = experiment
    with pytest.raises(SystemExit) as e:
        cli.main(["rerun", "f" * 32, "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"workbench rerun: run id ('{'f' * 32}') is not a run in {uri}")

    store = Store("tiny-rerun", uri)
    plain = store.create_run("a notebook's own run", tags={"kind": "notebook"})
    with pytest.raises(UserError, match=f"run {plain} \\(kind 'notebook', role None\\) is "
                                        "neither an experiment run"):
        rerun(plain, uri, progress=False)

    client = MlflowClient(tracking_uri=uri)
    child = result.runs[0].run_id
    exp = client.get_run(child).info.experiment_id
    before = len(client.search_runs([exp]))
    tampered(child, "workload_checksum", "0" * 16)
    with pytest.raises(UserError, match=re.escape(
            f"workload_checksum ('{'0' * 16}') of run {child} differs from the workload "
            f"rebuilt from its template ('{result.workload_checksum}')")):
        rerun(child, uri, progress=False)
    assert len(client.search_runs([exp])) == before  # nothing was run or logged
    with pytest.raises(UserError, match=r"repeats \(0\) must be an integer >= 1"):
        rerun(child, uri, repeats=0)


# ----------------------------------------------------------------- a sweep point
def _notebook(path: Path, y: int) -> Path:
    """Logs score = 10 x + y into the point's run (the injected mlflow_parent_run_id)."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        f'x = 1\ny = {y}\nmlflow_uri = ""\nmlflow_parent_run_id = ""\nmlflow_experiment = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from mlflow.tracking import MlflowClient\n"
        "MlflowClient(mlflow_uri).log_metric(mlflow_parent_run_id, 'score', 10.0 * x + y)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def test_rerun_of_a_sweep_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two kernel starts (the sweep's point, its rerun): about 10 s."""
    from workbench.sweeps.driver import sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb = _notebook(tmp_path / "nb.ipynb", y=5)
    [row] = sweep(nb, "x", [2], experiment="tiny-sweep-rerun", uri=uri,
                  results_dir=tmp_path / "results", progress=False)
    assert row["status"] == "FINISHED"
    with pytest.raises(TypeError, match="run_point=workbench.cli.run_sweep_point"):
        rerun(row["run_id"], uri)  # the experiments layer cannot import the sweep itself
    _notebook(nb, y=7)  # the default changed since: the rerun sets it back to the logged 5
    cli.main(["rerun", row["run_id"], "--tracking-uri", uri, "--no-progress",
              "--results-dir", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert ("workbench rerun: note: notebook parameter y: its default is now 7, the point ran "
            "with 5; rerun with 5") in err
    assert "| score  | 25     | 25  | +0.0    | same    |" in out
    folder = Path(out.strip().splitlines()[-1].removeprefix("results folder: "))
    data = json.loads((folder / "rerun.json").read_text())
    assert data["rows"] == [Drift("x=2", "score", 25.0, 25.0, 0.0, "same", "none").as_dict()]
    assert (data["kind"], data["rerun_of"], data["verdict"]) == (
        "sweep-point", row["run_id"], "same")
    assert [p.name for p in (folder / "notebooks").iterdir()] == ["00_x_2.ipynb"]

    client = MlflowClient(tracking_uri=uri)
    new = client.get_run(data["run_id"])
    assert (new.data.tags["role"], new.data.tags["rerun_of"]) == ("rerun", row["run_id"])
    assert new.data.metrics == {"score": 25.0}
    [kid] = data["measured"]
    assert client.get_run(kid["run_id"]).data.params["y"] == "5"

    nb.unlink()  # a missing notebook is refused in one line
    with pytest.raises(SystemExit) as e:
        cli.main(["rerun", row["run_id"], "--tracking-uri", uri])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"workbench rerun: notebook ('{nb}') of sweep point {row['run_id']} is not a file; "
        "restore it there to rerun the point")
