"""Ctrl-C (SIGINT) and SIGTERM during `workbench run`: the run in flight and the parent end
KILLED in MLflow (never FINISHED with no metrics, never left RUNNING), one line says so, and
`--resume` measures them again. A run without its objective metric never enters a verdict."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from workbench.experiments import runner
from workbench.experiments.executors.base import Done, Executor, new_attempt
from workbench.experiments.interrupts import Interrupted, Terminated, killed_reason
from workbench.experiments.template import parse_template
from workbench.tracking.mlflow_store import Store

TEMPLATE: dict[str, Any] = {
    "name": "tiny-interrupt",
    "question": "Does the budget matter on two chat requests?",
    "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
    "slo": {"p95_ttft_ms": 60000, "max_error_rate": 0.0},
    "workload": {"fixture": "balanced-chat", "seed": 3,
                 "params": {"num_requests": 2, "output_len": 4}},
    "arrivals": {"mode": "closed", "concurrency": 1},
    "baseline": {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4,
                 "max_num_batched_tokens": 256},
    "variable": {"name": "max_num_batched_tokens", "values": [64]},
    "repeats": 2,
    "warmup_requests": 0,
}
PARENT_TAG = "mlflow.parentRunId"


def children(client: MlflowClient, parent: str) -> dict[tuple[str, str], Any]:
    """(value, repeat) -> the child run, of the runs not superseded."""
    exp = client.get_run(parent).info.experiment_id
    runs = client.search_runs([exp], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")
    return {(r.data.tags["value"], r.data.tags["repeat"]): r for r in runs
            if "superseded" not in r.data.tags}


def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(label, repeat) of every run the runner measures from now on."""
    calls: list[tuple[str, int]] = []
    real = runner.run_one

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append((args[1], args[3]))  # label, repeat (after the RunContext)
        return real(*args, **kw)

    monkeypatch.setattr(runner, "run_one", counting)
    return calls


def interrupt_second_run(monkeypatch: pytest.MonkeyPatch, exc: KeyboardInterrupt) -> None:
    """The harness's second measured run raises `exc` while it runs (as Ctrl-C would)."""
    from workbench.harness import replay as harness

    real, count = harness.run, [0]

    def run(*args: Any, **kw: Any) -> Any:
        count[0] += 1
        if count[0] == 2:
            raise exc
        return real(*args, **kw)

    monkeypatch.setattr(harness, "run", run)


@pytest.mark.parametrize(("exc", "name", "signum"), [
    (KeyboardInterrupt(), "SIGINT", 2), (Terminated(), "SIGTERM", 15)])
def test_an_interrupted_run_and_its_parent_end_killed_and_resume_redoes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: KeyboardInterrupt, name: str,
        signum: int) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    template = parse_template(TEMPLATE)
    interrupt_second_run(monkeypatch, exc)
    with pytest.raises(Interrupted) as e:
        runner.run_experiment(template, uri=uri, progress=False, check=False)
    client = MlflowClient(tracking_uri=uri)
    store = Store(template.name, uri)
    (parent,) = client.search_runs([store.experiment_id], "tags.kind = 'experiment'")
    pid = parent.info.run_id
    assert e.value.signum == signum
    assert str(e.value) == (f"interrupted ({name}): experiment run {pid} and 1 run(s) in "
                            "flight marked KILLED in MLflow; rerun the same command with "
                            "--resume to measure what is missing")
    assert parent.info.status == "KILLED" and parent.data.tags["error"] == killed_reason(exc)
    kids = children(client, pid)
    assert {k: r.info.status for k, r in kids.items()} == {
        ("baseline", "0"): "FINISHED", ("64", "0"): "KILLED"}
    killed = kids[("64", "0")]
    assert killed.data.tags["error"] == (
        f"killed: interrupted ({name}) before the run finished; `workbench run TEMPLATE "
        "--resume` measures it again")
    assert "p95_itl_ms" not in killed.data.metrics

    monkeypatch.undo()
    calls = measured(monkeypatch)
    again = runner.run_experiment(template, uri=uri, progress=False, check=False, resume=True)
    assert again.parent_run_id == pid
    assert calls == [("64", 0), ("baseline", 1), ("64", 1)]  # the killed run measured again
    assert client.get_run(pid).info.status == "FINISHED"
    assert again.verdicts and again.verdicts[0].valid_runs == 2
    assert again.runs[0].run_id == kids[("baseline", "0")].info.run_id  # kept
    assert client.get_run(killed.info.run_id).info.status == "KILLED"  # stays, not judged
    assert killed.info.run_id not in {r.run_id for r in again.runs}
    assert sorted(r.info.run_name for r in client.search_runs(
        [store.experiment_id], f"tags.`{PARENT_TAG}` = '{pid}' and "
                               "attributes.status = 'FINISHED'")) == [
        "baseline (256) r1", "baseline (256) r2", "budget=64 r1", "budget=64 r2"]


class InterruptedCluster(Executor):
    """A cluster whose first job finishes; the second's run is RUNNING on its node when the
    driver is interrupted (as a Ray executor waiting on its tasks would be)."""

    kind = "local"

    def run(self, fn: Any, payloads: Any, **kw: Any) -> Any:
        yield Done(0, fn(payloads[0], new_attempt()), 0.0)
        label, value, repeat = payloads[1]
        store = Store(TEMPLATE["name"], os.environ["TEST_URI"])
        (parent,) = store.client.search_runs([store.experiment_id], "tags.kind = 'experiment'")
        store.create_run(f"{label} on node-1", parent_id=parent.info.run_id,
                         tags={"value": label, "repeat": str(repeat)})  # the node's run
        raise KeyboardInterrupt


def test_an_executor_interrupted_mid_run_leaves_child_and_parent_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.experiments.executors import factory

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TEST_URI", uri)
    monkeypatch.setattr(factory, "make_executor", lambda config: InterruptedCluster(config))
    template = parse_template({**TEMPLATE, "repeats": 1})
    with pytest.raises(Interrupted) as e:
        runner.run_experiment(template, uri=uri, progress=False, check=False)
    client = MlflowClient(tracking_uri=uri)
    (parent,) = client.search_runs([Store(template.name, uri).experiment_id],
                                   "tags.kind = 'experiment'")
    assert parent.info.status == "KILLED"
    kids = children(client, parent.info.run_id)
    assert {k: r.info.status for k, r in kids.items()} == {
        ("baseline", "0"): "FINISHED", ("64", "0"): "KILLED"}
    assert kids[("64", "0")].data.tags["error"] == killed_reason(KeyboardInterrupt())
    assert "and 1 run(s) in flight marked KILLED" in str(e.value)


def test_resume_measures_a_finished_run_without_its_objective_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the old code left: a child closed FINISHED with no metrics, the parent RUNNING."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    template = parse_template({**TEMPLATE, "repeats": 1})
    first = runner.run_experiment(template, uri=uri, progress=False, check=False)
    client = MlflowClient(tracking_uri=uri)
    pid = first.parent_run_id
    client.update_run(pid, status="RUNNING")
    client.set_tag(pid, "driver_pid", str(dead_pid()))
    client.delete_run(first.runs[1].run_id)
    store = Store(template.name, uri)
    empty = store.create_run("budget=64", parent_id=pid, tags={"value": "64", "repeat": "0"})
    store.finish(empty)

    calls = measured(monkeypatch)
    again = runner.run_experiment(template, uri=uri, progress=False, check=False, resume=True)
    assert calls == [("64", 0)]
    assert again.runs[1].run_id != empty and "p95_itl_ms" in again.runs[1].metrics
    assert client.get_run(empty).data.tags["superseded"] == (
        "FINISHED without p95_itl_ms: measured again on --resume")
    assert not again.verdicts[0].failed_runs
    calls.clear()  # the superseded run is never looked at again
    runner.run_experiment(template, uri=uri, progress=False, check=False, resume=True)
    assert calls == []


def test_a_run_without_its_objective_never_enters_a_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real = runner.run_one

    def without_objective(*args: Any, **kw: Any) -> Any:
        record = real(*args, **kw)
        if args[1] == "64":  # the label
            record.metrics.pop("p95_itl_ms")
        return record

    monkeypatch.setattr(runner, "run_one", without_objective)
    result = runner.run_experiment(parse_template({**TEMPLATE, "repeats": 1}), uri=uri,
                                   progress=False, check=False)
    assert result.runs[1].error == "objective p95_itl_ms not measured"
    (v,) = result.verdicts
    assert v.failed_runs == 1 and v.valid_runs == 0 and not v.adopted
    assert v.reason == "1 run(s) failed"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("sig", "code", "name"), [
    (signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_to_the_process_group_of_workbench_run(
        tmp_path: Path, sig: signal.Signals, code: int, name: str) -> None:
    """The real command in its own process group, signalled while a child run is RUNNING
    (a workload far longer than the poll): exit 128 + signal, one line, no traceback,
    the child and the parent KILLED."""
    data = {**TEMPLATE, "workload": {"fixture": "balanced-chat", "seed": 3,
                                     "params": {"num_requests": 400, "output_len": 64,
                                                "max_input_len": 128}}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(path),
                             "--tracking-uri", uri], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client, running = MlflowClient(tracking_uri=uri), None
        deadline = time.monotonic() + 120
        while running is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if not (tmp_path / "mlflow.db").exists():
                continue
            exp = client.get_experiment_by_name(TEMPLATE["name"])
            if exp is None:
                continue
            runs = client.search_runs([exp.experiment_id], f"tags.`{PARENT_TAG}` != '' and "
                                                           "attributes.status = 'RUNNING'")
            running = runs[0] if runs else None
        assert running is not None, proc.communicate()
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(
        f"workbench run: interrupted ({name}): experiment run ")
    assert client.get_run(running.info.run_id).info.status == "KILLED"
    parent = client.get_run(running.data.tags[PARENT_TAG])
    assert parent.info.status == "KILLED"
