"""Sweep points measured inside the CPU watch: a disturbed point is flagged (row, stderr line,
MLflow tag and metric) and run again on --resume; the watch is injected, never the real one."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.sweeps.test_sweep import _tiny_notebook
from workbench.harness.validity import FixedCpuWatch
from workbench.sweeps.cli import main
from workbench.sweeps.driver import sweep


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


def test_a_busy_machine_is_named_before_the_first_point(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    kw = dict(uri=f"sqlite:///{tmp_path / 'm.db'}", out_dir=tmp_path / "out", progress=False,
              cpu_watch=FixedCpuWatch(0.0))
    sweep(nb, "x", [1], load_watch=FixedCpuWatch(0.6), **kw)
    err = capsys.readouterr().err.splitlines()
    warning = ("workbench sweep: other processes already use 60% of the CPUs (threshold 25%): "
               "runs measured now will likely be INVALID; wait for a quieter machine, or "
               "raise --max-other-cpu-share")
    assert warning in err
    sweep(nb, "x", [1], load_watch=FixedCpuWatch(0.2), **kw)
    assert "already use" not in capsys.readouterr().err


def test_retry_invalid_runs_disturbed_points_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    rows = sweep(nb, "x", [1, 3], uri=uri, out_dir=tmp_path / "out", progress=False,
                 cpu_watch=FixedCpuWatch(0.7, 0.05, 0.0), retry_invalid=2)
    assert [(r["status"], r["valid"], r["other_cpu_share"]) for r in rows] == [
        ("FINISHED", True, 0.0), ("FINISHED", True, 0.05)]
    err = capsys.readouterr().err.splitlines()
    assert "workbench sweep: 1 INVALID point(s) run again (retry 1 of 2)" in err
    assert not any("retry 2 of 2" in line for line in err)  # nothing left to retry
    assert rows[0]["output_path"].endswith("00_x=1_retry1.ipynb")
    client = MlflowClient(tracking_uri=uri)
    kids = client.search_runs([client.get_run(rows[0]["run_id"]).info.experiment_id],
                              "tags.kind = 'sweep-point'")
    assert sorted(k.data.tags["run_valid"] for k in kids) == ["false", "true", "true"]
    with pytest.raises(ValueError, match=r"retry_invalid \(-1\) must be an integer >= 0"):
        sweep(nb, "x", [1], uri=uri, out_dir=tmp_path / "out", progress=False,
              retry_invalid=-1)


def test_cli_ends_with_what_to_do_when_points_are_invalid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    monkeypatch.setenv("WORKBENCH_OTHER_CPU_SHARE", "0.5")  # every point disturbed
    args = [str(nb), "-p", "x", "1", "3", "--tracking-uri", f"sqlite:///{tmp_path / 'c.db'}",
            "--results-dir", str(tmp_path / "o"), "--no-progress"]
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("workbench sweep: 2/2 invalid: rerun on a quieter machine, or raise "
                       "--max-other-cpu-share (--retry-invalid N runs them again at once; "
                       "--resume later reruns only them)")
    note = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'c.db'}").search_runs(
        ["1"], "tags.kind = 'sweep'")[0].data.tags["mlflow.note.content"]
    assert note.split("\n\n")[1] == (
        "2 points: 2 finished, 0 failed; **2 INVALID** (disturbed: their numbers are not "
        "read). 2/2 invalid: rerun on a quieter machine, or raise --max-other-cpu-share "
        "(`--retry-invalid N` runs them again at once; `--resume` reruns only them).")
    assert main([*args, "--max-other-cpu-share", "0.6"]) == 0
    assert "invalid:" not in capsys.readouterr().err


def test_validity_advice_helpers() -> None:
    from workbench.harness.validity import (
        CpuSample,
        CpuWatch,
        busy_machine_line,
        invalid_advice,
        load_before_start,
    )

    samples = iter([CpuSample(0.0, 10.0, 1.0), CpuSample(1.0, 11.5, 1.5)])
    waited: list[float] = []
    watch = CpuWatch(read=lambda roots: next(samples), cpus=2)
    assert load_before_start(watch, 1.0, wait=waited.append) == 0.5  # (1.5 - 0.5) / 2
    assert waited == [1.0]
    assert load_before_start(FixedCpuWatch(0.3), wait=waited.append) == 0.3
    assert waited == [1.0]  # a stated share needs no window
    assert busy_machine_line(0.25, 0.25) is None and busy_machine_line(float("nan"), 0) is None
    assert busy_machine_line(0.5, 0.25, "--flag").endswith("or raise --flag")
    assert invalid_advice(0, 3) is None
    assert invalid_advice(3, 3) == ("3/3 invalid: rerun on a quieter machine, or raise "
                                    "--max-other-cpu-share")
