"""workbench.sweep: one papermill run per value, MLflow child runs, failures recorded, resume."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from mlflow.tracking import MlflowClient

from workbench.sweep import main, parse_value, sweep

PARENT_TAG = "mlflow.parentRunId"


def _tiny_notebook(path: Path) -> Path:
    """Parameters cell + an assert that fails for x == 2 unless the `flag` file exists."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'x = 1\ny = 5\nflag = ""\nmlflow_uri = ""\nmlflow_parent_run_id = ""\n'
        'mlflow_experiment = ""'
    )
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell(
            "from pathlib import Path\n"
            "assert x != 2 or Path(flag).exists(), f'x={x} is refused'\n"
            "print('ran', x, mlflow_parent_run_id)"
        ),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def _children(client: MlflowClient, parent: str) -> list:
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")


def test_sweep_records_failures_and_resume_reruns_only_them(tmp_path: Path) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    flag = tmp_path / "flag"
    kw = dict(fixed={"flag": str(flag)}, experiment="sweep-test", uri=uri,
              out_dir=tmp_path / "out", progress=False)
    rows = sweep(nb, "x", [1, 2, 3], **kw)
    assert [r["status"] for r in rows] == ["FINISHED", "FAILED", "FINISHED"]
    assert "AssertionError" in rows[1]["error"] and "x=2 is refused" in rows[1]["error"]
    assert all(Path(r["output_path"]).is_file() for r in rows)  # the failed one too

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(rows[0]["run_id"]).data.tags[PARENT_TAG]
    assert client.get_run(parent).info.status == "FAILED"
    kids = {r.info.run_id: r for r in _children(client, parent)}
    assert sorted(r.info.status for r in kids.values()) == ["FAILED", "FINISHED", "FINISHED"]
    failed = kids[rows[1]["run_id"]]
    assert "x=2 is refused" in failed.data.tags["error"]
    assert failed.data.params["x"] == "2" and failed.data.params["flag"] == str(flag)
    assert failed.data.params["y"] == "5"  # declared defaults are logged as params ...
    assert "mlflow_uri" not in failed.data.params  # ... the injected plumbing is not
    arts = {a.path for a in client.list_artifacts(rows[1]["run_id"])}
    assert {"error.txt", Path(rows[1]["output_path"]).name} <= arts
    executed = nbformat.read(rows[0]["output_path"], as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert f"ran 1 {rows[0]['run_id']}" in text  # mlflow_parent_run_id was injected

    flag.write_text("now x=2 passes")
    again = sweep(nb, "x", [1, 2, 3], resume=True, **kw)
    assert [r["status"] for r in again] == ["SKIPPED", "FINISHED", "SKIPPED"]
    assert again[0]["run_id"] == rows[0]["run_id"] and again[1]["run_id"] != rows[1]["run_id"]
    kids = _children(client, parent)
    assert len(kids) == 4
    assert sorted(r.info.status for r in kids) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    assert client.get_run(parent).info.status == "FINISHED"


def test_sweep_rejects_undeclared_parameter(tmp_path: Path) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    with pytest.raises(ValueError, match="not declared"):
        sweep(nb, "z", [1], uri=f"sqlite:///{tmp_path / 'm.db'}", out_dir=tmp_path,
              progress=False)


def test_cli_parses_values_and_fixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_value("8") == 8 and parse_value("[1, 2]") == [1, 2]
    assert parse_value("abc") == "abc" and parse_value("true") is True
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    code = main([str(nb), "-p", "x", "1", "3", "--set", "flag=none", "--tracking-uri",
                 f"sqlite:///{tmp_path / 'cli.db'}", "--out-dir", str(tmp_path / "o"),
                 "--no-progress", "--resume"])  # nothing to resume yet: a new sweep
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("FINISHED") == 2 and "x=1" in out and "x=3" in out
