"""Sweep points measured inside the CPU watch: a disturbed point is flagged (row, stderr line,
MLflow tag and metric) and run again on --resume; the watch is injected, never the real one."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.test_sweep import _tiny_notebook
from workbench.harness.validity import FixedCpuWatch
from workbench.sweep import main, sweep


def test_a_disturbed_point_is_flagged_and_rerun_on_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    kw = dict(experiment="sweep-validity", uri=uri, out_dir=tmp_path / "out", progress=False)
    rows = sweep(nb, "x", [1, 3], cpu_watch=FixedCpuWatch(0.05, 0.7), **kw)
    assert [(r["status"], r["valid"], r["other_cpu_share"]) for r in rows] == [
        ("FINISHED", True, 0.05), ("FINISHED", False, 0.7)]
    err = capsys.readouterr().err
    assert ("INVALID sweep point x=3: other processes used 70% of the CPUs (threshold 25%); "
            "not used for any result") in err.splitlines()

    client = MlflowClient(tracking_uri=uri)
    good, bad = (client.get_run(r["run_id"]) for r in rows)
    assert good.data.tags["run_valid"] == "true" and good.data.metrics["other_cpu_share"] == 0.05
    assert bad.data.tags["run_valid"] == "false" and bad.data.metrics["other_cpu_share"] == 0.7
    assert bad.data.metrics["valid"] == 0.0 and "70% of the CPUs" in bad.data.tags["validity"]

    again = sweep(nb, "x", [1, 3], resume=True, cpu_watch=FixedCpuWatch(0.0), **kw)
    assert [r["status"] for r in again] == ["SKIPPED", "FINISHED"]
    assert again[1]["valid"] and again[1]["run_id"] != rows[1]["run_id"]


def test_cli_threshold_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    monkeypatch.setenv("WORKBENCH_OTHER_CPU_SHARE", "0.3")  # stated, as the suite does with 0
    args = [str(nb), "-p", "x", "1", "--tracking-uri", f"sqlite:///{tmp_path / 'cli.db'}",
            "--results-dir", str(tmp_path / "o"), "--no-progress"]
    assert main(args) == 0
    assert "FINISHED INVALID (other processes 30% of the CPUs)" in capsys.readouterr().out
    assert main([*args, "--max-other-cpu-share", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "FINISHED" in out and "INVALID" not in out
    assert main([*args, "--max-other-cpu-share", "2"]) == 2
    assert "workbench sweep: max_other_cpu_share (2.0) must be in [0, 1]" in (
        capsys.readouterr().err)
