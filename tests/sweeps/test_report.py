"""A sweep ends like an experiment (parent description, per-point metrics, summary.md and
sweep.png on the parent and in the results folder, the declared metrics); every value is
checked against the notebook's declared parameter types before the first point; --kernel is
honoured for a notebook without a kernelspec."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from mlflow.tracking import MlflowClient

from workbench.notebook_params import NotebookParameterError
from workbench.sweeps.cli import main
from workbench.sweeps.driver import sweep
from workbench.sweeps.inputs import declared_parameters
from workbench.sweeps.notebook_specs import declared_specs, sweep_metrics, value_problems
from workbench.sweeps.report import key_metrics, metric_steps

ROOT = Path(__file__).resolve().parents[2]
PARENT_TAG = "mlflow.parentRunId"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def metrics_notebook(path: Path, kernelspec: bool = True) -> Path:
    """Parameters x (int >= 1) and y (>= x); the point logs speedup_c1 = 1 + x / 10 and two
    metrics that sort before it, into its own run; SWEEP_METRICS declares speedup_c*."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'x = 1\ny = 4\nfigures_dir = ""\nmlflow_uri = ""\nmlflow_parent_run_id = ""\n'
        'mlflow_experiment = ""')
    params.metadata["tags"] = ["parameters"]
    check = nbformat.v4.new_code_cell(
        "from workbench.notebook_params import TRACKING, Int, check_params\n\n"
        "check_params(globals(), x=Int(min=1),\n"
        "             y=Int(min=1, at_least='x', why='y is a cap on x'), **TRACKING)\n"
        'SWEEP_METRICS = ["speedup_c*"]')
    log = nbformat.v4.new_code_cell(
        "if mlflow_parent_run_id:\n"
        "    from mlflow.tracking import MlflowClient\n"
        "    c = MlflowClient(tracking_uri=mlflow_uri)\n"
        "    for k, v in {'speedup_c1': 1 + x / 10, 'acceptance_rate_c1': 0.5,\n"
        "                 'a_first': 3.0}.items():\n"
        "        c.log_metric(mlflow_parent_run_id, k, v)")
    nb.cells = [params, check, log]
    if kernelspec:
        nb.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(nb, path)
    return path


def test_a_sweep_parent_reads_like_an_experiment(tmp_path: Path) -> None:
    nb = metrics_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rows = sweep(nb, "x", [1, 3], experiment="s", uri=uri, results_dir=tmp_path / "r",
                 progress=False)
    assert [r["status"] for r in rows] == ["FINISHED", "FINISHED"]
    client = MlflowClient(tracking_uri=uri)
    parent = rows[0]["parent_run_id"]
    run = client.get_run(parent)
    folder = Path(rows[0]["results_dir"])
    text = run.data.tags["mlflow.note.content"]
    head, counts, table, _ = text.split("\n\n")
    assert head == "**Sweep** of `x` over 1, 3 in `tiny.ipynb`."
    assert counts == "2 points: 2 finished, 0 failed."
    assert table == (folder / "summary.md").read_text().strip()
    assert text.endswith(f"Table: `summary.md`; plot: `sweep.png` (this run's artifacts, and "
                         f"`{folder}`). Metrics of this run: `speedup_c1` per valid point, "
                         "step = the swept value; each point is a child run.")
    # per-point metrics on the parent: step = the value; only the declared metric
    history = client.get_metric_history(parent, "speedup_c1")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.1), (3, 1.3)]
    assert set(run.data.metrics) == {"speedup_c1"}
    assert run.data.tags["sweep_step"] == "the swept value"
    assert {a.path for a in client.list_artifacts(parent)} == {"summary.md", "sweep.png"}
    assert {p.name for p in folder.iterdir()} >= {"summary.md", "sweep.png", "runs.csv"}
    summary = (folder / "summary.md").read_text().splitlines()
    assert [c.strip() for c in summary[0].split("|")[1:-1]] == [
        "x", "status", "speedup_c1", "run", "notebook"]  # declared, not a_first/acceptance
    assert [c.strip() for c in summary[2].split("|")[1:4]] == ["1", "FINISHED", "1.1"]
    assert [c.strip() for c in summary[3].split("|")[1:4]] == ["3", "FINISHED", "1.3"]


def test_cli_prints_the_parent_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = metrics_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main([str(nb), "-p", "x", "2", "--tracking-uri", uri, "--results-dir",
                 str(tmp_path / "r"), "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    (parent,) = MlflowClient(tracking_uri=uri).search_runs(["1"], "tags.kind = 'sweep'")
    assert (f"sweep (the parent run's summary and plot): http://127.0.0.1:5000/#/experiments/1/"
            f"runs/{parent.info.run_id}/artifacts/summary.md?workflowType=machine_learning"
            ) in out


def test_key_metrics_follow_the_declaration() -> None:
    rows = [{"metrics": {"acceptance_rate_c1": 0.5, "acceptance_rate_c4": 0.5,
                         "speedup_c4": 1.2, "speedup_c1": 1.5, "predicted_speedup_c1": 1.9}}]
    assert key_metrics(rows) == ["acceptance_rate_c1", "acceptance_rate_c4",
                                 "predicted_speedup_c1", "speedup_c1", "speedup_c4"]
    assert key_metrics(rows, declared=["speedup_c*", "predicted_speedup_c*"]) == [
        "speedup_c1", "speedup_c4", "predicted_speedup_c1"]
    assert key_metrics(rows, declared=["nothing*"])[0] == "acceptance_rate_c1"  # fallback
    assert metric_steps([0, 3, 5]) == ([0, 3, 5], "the swept value")
    assert metric_steps(["a", "b"]) == ([0, 1], "the point's index in sweep_values")


def test_values_are_checked_before_the_first_point(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = metrics_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with pytest.raises(NotebookParameterError) as err:
        sweep(nb, "x", [4, "eight"], uri=uri, results_dir=tmp_path / "r", progress=False)
    assert str(err.value) == ("tiny.ipynb: notebook parameter x ('eight', a str) must be an "
                              "integer >= 1; nothing ran")
    with pytest.raises(NotebookParameterError, match=r"y \(2, a int\) must be >= x \(3\): "
                                                     "y is a cap on x; nothing ran"):
        sweep(nb, "x", [3], fixed={"y": 2}, uri=uri, results_dir=tmp_path / "r",
              progress=False)
    assert not (tmp_path / "r").exists()  # nothing ran, no folder
    assert MlflowClient(tracking_uri=uri).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=uri).search_experiments()]) == []
    args = [str(nb), "-p", "x", "eight", "4", "--tracking-uri", uri, "--no-progress"]
    capsys.readouterr()
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err == ("workbench sweep: tiny.ipynb: notebook parameter x ('eight', a "
                            "str) must be an integer >= 1; nothing ran\n")
    assert captured.out == ""


def test_every_notebook_declares_specs_for_its_parameters_and_sweep_metrics() -> None:
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        specs = declared_specs(nb)
        params = set(declared_parameters(nb))
        assert params <= set(specs), (nb.name, sorted(params - set(specs)))
        assert sweep_metrics(nb), nb.name
    assert sweep_metrics(ROOT / "notebooks" / "07_speculative_decoding.ipynb") == [
        "speedup_c*", "predicted_speedup_c*"]


def test_notebook_01_budget_below_max_num_seqs_is_refused_up_front() -> None:
    nb = ROOT / "notebooks" / "01_quickstart.ipynb"
    specs, defaults = declared_specs(nb), declared_parameters(nb)
    assert defaults["max_num_seqs"] == 256
    assert value_problems(specs, defaults, "max_num_batched_tokens", [64, 512], {}) == [
        "max_num_batched_tokens (64, a int) must be >= max_num_seqs (256): vLLM refuses a "
        "step budget below max_num_seqs; lower max_num_seqs too (--set max_num_seqs=N)"]
    assert value_problems(specs, defaults, "max_num_batched_tokens", [64, 512],
                          {"max_num_seqs": 64}) == []
    assert value_problems(specs, defaults, "max_num_seqs", [512], {}) == [
        "max_num_batched_tokens (256, a int) must be >= max_num_seqs (512): vLLM refuses a "
        "step budget below max_num_seqs; lower max_num_seqs too (--set max_num_seqs=N)"]
    assert '"max_num_seqs": max_num_seqs' in (ROOT / "notebooks" / "01_quickstart.py"
                                              ).read_text()  # and the engine gets it


def test_kernel_is_honoured_for_a_notebook_without_kernelspec(tmp_path: Path) -> None:
    nb = metrics_notebook(tmp_path / "bare.ipynb", kernelspec=False)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    kw = dict(uri=uri, results_dir=tmp_path / "r", progress=False)
    rows = sweep(nb, "x", [2], kernel_name="python3", **kw)
    assert [r["status"] for r in rows] == ["FINISHED"], rows[0]["error"]
    with pytest.raises(ValueError, match=r"^notebook bare.ipynb has no kernelspec in its "
                                         r"metadata: give --kernel NAME \(installed kernels: "):
        sweep(nb, "x", [2], **kw)
    with pytest.raises(ValueError, match=r"^--kernel \('nope'\) is not an installed Jupyter "
                                         "kernel; installed: "):
        sweep(nb, "x", [2], kernel_name="nope", **kw)


def test_a_failed_report_still_ends_the_parent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.sweeps.report as report_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_module, "report", broken)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    rows = sweep(metrics_notebook(tmp_path / "tiny.ipynb"), "x", [1], uri=uri,
                 results_dir=tmp_path / "r", progress=False)
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(rows[0]["run_id"]).data.tags[PARENT_TAG]
    assert client.get_run(parent).info.status == "FINISHED"
    assert ("workbench sweep: the sweep's report was not written: RuntimeError: disk full"
            in capsys.readouterr().err.splitlines())
    assert main([str(tmp_path / "tiny.ipynb"), "-p", "x", "2", "--tracking-uri", uri,
                 "--results-dir", str(tmp_path / "r"), "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| x ") and out[-1].startswith("results folder: ")
