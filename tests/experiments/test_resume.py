"""`workbench run --resume`: an experiment an interrupted driver left behind is finished, not
redone. Its FINISHED runs are kept as they are (same run ids, same metrics), a run left
RUNNING is marked KILLED and measured again, a FAILED or missing (value, repeat) is measured;
the verdict reads all of them in the interleaved order. A parent whose driver is still alive
is refused; a rate sweep is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from workbench.errors import UserError
from workbench.experiments import runner
from workbench.experiments.template import parse_template
from workbench.tracking.mlflow_store import Store

TEMPLATE: dict[str, Any] = {
    "name": "tiny-resume",
    "question": "Does the budget matter on two chat requests?",
    "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
    "slo": {"p95_ttft_ms": 60000, "max_error_rate": 0.0},
    "workload": {"fixture": "balanced-chat", "seed": 3, "params": {"num_requests": 2}},
    "arrivals": {"mode": "closed", "concurrency": 1},
    "baseline": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 4,
                 "max_num_batched_tokens": 256},
    "variable": {"name": "max_num_batched_tokens", "values": [64]},
    "repeats": 2,
    "warmup_requests": 0,
}


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(label, repeat) of every run the runner measures from now on."""
    calls: list[tuple[str, int]] = []
    real = runner.run_one

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append((args[1], args[3]))  # label, repeat (after the RunContext)
        return real(*args, **kw)

    monkeypatch.setattr(runner, "run_one", counting)
    return calls


def test_resume_keeps_finished_runs_and_measures_the_rest(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    template = parse_template(TEMPLATE)
    first = runner.run_experiment(template, uri=uri, progress=False, check=False)
    client = MlflowClient(tracking_uri=uri)
    by_key = {(r.label, r.repeat): r for r in first.runs}
    assert list(by_key) == [("baseline", 0), ("64", 0), ("baseline", 1), ("64", 1)]
    # the driver "died": the parent and one child left RUNNING, one run failed, one missing
    parent = first.parent_run_id
    client.update_run(parent, status="RUNNING")
    client.set_tag(parent, "driver_pid", str(dead_pid()))
    client.update_run(by_key[("64", 0)].run_id, status="RUNNING")
    client.update_run(by_key[("baseline", 1)].run_id, status="FAILED")
    client.delete_run(by_key[("64", 1)].run_id)

    calls = measured(monkeypatch)
    second = runner.run_experiment(template, uri=uri, progress=True, check=False, resume=True)
    assert second.parent_run_id == parent
    assert calls == [("64", 0), ("baseline", 1), ("64", 1)]  # in the interleaved order
    assert [(r.label, r.repeat) for r in second.runs] == list(by_key)
    kept = second.runs[0]
    assert kept.run_id == by_key[("baseline", 0)].run_id
    assert kept.metrics == by_key[("baseline", 0)].metrics and kept.valid is True
    assert kept.fingerprint == by_key[("baseline", 0)].fingerprint
    assert all(r.run_id not in {b.run_id for b in first.runs} for r in second.runs[1:])
    killed = client.get_run(by_key[("64", 0)].run_id)
    assert killed.info.status == "KILLED"
    assert killed.data.tags["error"].startswith("killed: the experiment's driver ended")
    assert second.verdicts and second.verdicts[0].value == 64
    p = client.get_run(parent)
    assert p.info.status == "FINISHED" and p.data.tags["resumed"] == "true"
    assert p.data.tags["driver_pid"] == str(os.getpid())

    # everything finished now: a second resume measures nothing and gives the same verdict
    calls.clear()
    third = runner.run_experiment(template, uri=uri, progress=False, check=False, resume=True)
    assert calls == [] and [r.run_id for r in third.runs] == [r.run_id for r in second.runs]
    assert third.table == second.table


def test_resume_without_an_earlier_run_starts_one(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    calls = measured(monkeypatch)
    changed = {**TEMPLATE, "repeats": 1}  # another template: nothing of it to resume
    runner.run_experiment(parse_template(changed), uri=uri, progress=True, check=False,
                          resume=True)
    assert calls == [("baseline", 0), ("64", 0)]
    assert "nothing to resume for 'tiny-resume'" in capsys.readouterr().out


def test_a_parent_whose_driver_is_alive_is_refused(tmp_path: Any) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    template = parse_template(TEMPLATE)
    from workbench.experiments import resume

    store = Store(template.name, uri)
    parent = store.create_run("tiny-resume", tags={
        "kind": "experiment", "template_sha": resume.template_sha(template),
        "workload_checksum": "abc", "driver_pid": str(os.getppid()),
        "driver_host": resume.driver_tags()["driver_host"]})
    with pytest.raises(UserError) as e:
        resume.find_parent(store, template, "abc")
    assert str(e.value) == (f"experiment run {parent} of 'tiny-resume' is still running in "
                            f"process {os.getppid()} on this host; wait for it or stop it "
                            "before --resume")
    assert resume.find_parent(store, template, "other workload") is None


def test_a_rate_sweep_cannot_resume() -> None:
    raw = {k: v for k, v in TEMPLATE.items() if k not in ("objective", "slo", "arrivals")}
    raw["rate_sweep"] = {"rates": [2, 8], "slo": {"ttft_ms": 600000, "tpot_ms": 600000}}
    with pytest.raises(UserError, match=r"is a rate sweep \(rate_sweep\): --resume finishes "
                                        "plain experiments"):
        runner.run_experiment(parse_template(raw), progress=False, check=False, resume=True)
