"""When runs come back INVALID, `workbench run` says what to do: a warning when the machine is
already busy before the first run, one advice line at the end, and `--retry-invalid N`
measures a disturbed run again (recorded in MLflow; --resume keeps the retry, not the run it
replaced). The CPU watch is injected (`FixedCpuWatch`) or stated (WORKBENCH_OTHER_CPU_SHARE):
nothing depends on the machine's load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.experiments.test_interrupt import TEMPLATE, children, dead_pid, measured
from workbench import cli
from workbench.experiments import runner
from workbench.experiments.template import parse_template
from workbench.harness.validity import FixedCpuWatch


def test_retry_invalid_measures_a_disturbed_run_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    template = parse_template(TEMPLATE)
    # Runs in order: baseline r1, 64 r1, baseline r2, 64 r2, then the retry of 64 r1.
    watch = FixedCpuWatch(0.0, 0.6, 0.0, 0.0, 0.0)
    result = runner.run_experiment(template, uri=uri, progress=False, cpu_watch=watch,
                                   check=False, retry_invalid=2)
    assert watch.calls == 5
    assert [(r.label, r.repeat, r.valid) for r in result.runs] == [
        ("baseline", 0, True), ("64", 0, True), ("baseline", 1, True), ("64", 1, True)]
    assert result.advice is None and result.verdicts[0].valid_runs == 2
    out, err = capsys.readouterr()
    assert "retry 1/2: measuring 1 disturbed run(s) again" in out
    assert "warning: other processes already use" not in out + err

    client = MlflowClient(tracking_uri=uri)
    retried = client.get_run(result.runs[1].run_id)
    old_id = retried.data.tags["retry_of"]
    assert retried.info.run_name == "budget=64 r1 retry 1"
    assert retried.data.tags["retry"] == "1" and retried.data.tags["run_valid"] == "true"
    old = client.get_run(old_id)
    assert old.data.tags["run_valid"] == "false" and old.data.tags["retried_by"] == \
        retried.info.run_id
    assert old.data.tags["superseded"] == f"disturbed; retried as run {retried.info.run_id}"
    parent = client.get_run(result.parent_run_id)
    assert parent.data.tags["retried_runs"] == "1"
    assert parent.data.tags["disturbed_runs"] == "0"
    assert "invalid_advice" not in parent.data.tags

    # --resume keeps the retry, never the disturbed run it replaced
    client.update_run(result.parent_run_id, status="RUNNING")
    client.set_tag(result.parent_run_id, "driver_pid", str(dead_pid()))
    calls = measured(monkeypatch)
    again = runner.run_experiment(template, uri=uri, progress=False, check=False, resume=True)
    assert calls == [] and [r.run_id for r in again.runs] == [r.run_id for r in result.runs]
    assert children(client, result.parent_run_id)[("64", "0")].info.run_id == \
        retried.info.run_id


def test_a_busy_machine_is_named_before_and_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every run disturbed (other processes stated at 60%): a warning before the first run,
    the advice as the last line, exit 0 (an inconclusive verdict is an answer)."""
    monkeypatch.setenv("WORKBENCH_OTHER_CPU_SHARE", "0.6")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**TEMPLATE, "repeats": 1}))
    cli.main(["run", str(path), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    out, err = capsys.readouterr()
    assert err.splitlines().count(
        "warning: other processes already use 60% of the CPUs (threshold 25%): runs measured "
        "now will likely be INVALID; wait for a quieter machine, or raise "
        "--max-other-cpu-share") == 1
    lines = out.strip().splitlines()
    assert lines[-1] == "2/2 invalid: rerun on a quieter machine, or raise --max-other-cpu-share"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    (parent,) = client.search_runs(
        [client.get_experiment_by_name(TEMPLATE["name"]).experiment_id],
        "tags.kind = 'experiment'")
    assert parent.data.tags["invalid_advice"] == lines[-1]
    assert parent.data.tags["other_cpu_share_before"] == "0.600"


def test_retries_that_stay_disturbed_end_with_the_advice(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    template = parse_template({**TEMPLATE, "repeats": 1})
    result = runner.run_experiment(template, uri=uri, progress=False, check=False,
                                   cpu_watch=FixedCpuWatch(0.0, 0.9), retry_invalid=1)
    assert [(r.label, r.disturbed) for r in result.runs] == [("baseline", False), ("64", True)]
    assert result.advice == ("1/2 invalid: rerun on a quieter machine, or raise "
                             "--max-other-cpu-share")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(result.runs[1].run_id).info.run_name == "budget=64 r1 retry 1"


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_retry_invalid_is_checked_before_any_run(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match=r"retry_invalid \(.*\) must be an integer >= 0"):
        runner.run_experiment(parse_template(TEMPLATE), uri=f"sqlite:///{tmp_path / 'm.db'}",
                              progress=False, retry_invalid=bad)
    assert not (tmp_path / "m.db").exists()


def test_retry_invalid_flag_refuses_a_negative_count(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "experiments/ngram_speculation.yaml", "--retry-invalid", "-1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "workbench run: error: --retry-invalid (-1) must be >= 0 (the times a disturbed run "
        "is measured again)")
