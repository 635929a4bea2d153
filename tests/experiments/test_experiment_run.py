"""An experiment end to end on the bundled checkpoint, logged to a temporary MLflow store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from workbench.errors import TemplateError, UserError
from workbench.experiments.promote import promote_from_mlflow, promoted_template, write_promoted
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template
from workbench.tracking.mlflow_store import Store

TEMPLATE: dict[str, Any] = {
    "name": "tiny-budget",
    "question": "Does the budget matter on six chat requests?",
    "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
    "slo": {"p95_ttft_ms": 60000, "max_error_rate": 0.0},
    "workload": {"fixture": "balanced-chat", "seed": 3, "params": {"num_requests": 6}},
    "arrivals": {"mode": "closed", "concurrency": 2},
    "baseline": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
                 "max_num_batched_tokens": 256},
    # 4 < max_num_seqs: the up-front check refuses it (tests/experiments/test_validate.py);
    # with check=False the engine refuses it run by run: those runs fail, the sweep goes on.
    "variable": {"name": "max_num_batched_tokens", "values": [64, 4]},
    "repeats": 2,
    "warmup_requests": 1,
    "quality_gate": {"min_token_agreement": 1.0, "num_prompts": 2, "max_tokens": 4},
}


CONSOLE: dict[str, str] = {}  # what the module's experiment printed (progress=True)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    import contextlib
    import io

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = run_experiment(parse_template(TEMPLATE), uri=uri, progress=True, check=False,
                                results_dir=tmp_path_factory.mktemp("results"))
    CONSOLE["out"] = buf.getvalue()
    return result, uri


def test_results_folder(experiment: tuple[Any, str]) -> None:
    import csv

    result, _ = experiment
    folder = result.results_dir
    assert folder.parent.name == "tiny-budget" and folder.name.endswith("Z")
    assert sorted(p.name for p in folder.iterdir()) == [
        "VERDICT.md", "runs.csv", "runs.json", "sweep.png"]
    with (folder / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:9] == ["variable", "value", "repeat", "run_id", "status", "valid",
                                 "disturbed", "other_cpu_share", "error"]
    assert "p95_itl_ms" in rows[0]
    assert [(r["value"], r["repeat"], r["status"]) for r in rows] == [
        ("baseline", "1", "FINISHED"), ("64", "1", "FINISHED"), ("4", "1", "FAILED"),
        ("baseline", "2", "FINISHED"), ("64", "2", "FINISHED"), ("4", "2", "FAILED")]
    data = json.loads((folder / "runs.json").read_text())
    assert len(data) == 6 and data[1]["completed"] == 6
    assert result.table in (folder / "VERDICT.md").read_text()


def test_progress_lines_have_times_and_eta(experiment: tuple[Any, str]) -> None:
    import re

    lines = CONSOLE["out"].splitlines()
    runs = [line for line in lines if line.startswith("[")]
    assert len(runs) == 6
    assert re.fullmatch(r"\[1/6\] baseline \(256\) repeat 1/2: \d+\.\d s  "
                        r"\(elapsed \d+:\d\d, ETA \d+:\d\d\)", runs[0]), runs[0]
    assert runs[2].startswith("[3/6] budget=4 repeat 1/2: ")  # value labels, as MLflow names
    assert "  FAILED  (elapsed" in runs[2] and runs[5].endswith("ETA 0:00)")
    gate = [line for line in lines if line.startswith("quality gate: ")]
    assert "quality gate: reference: 2 greedy prompt(s) x 4 tokens ..." in gate
    assert any(re.fullmatch(r"quality gate: candidate budget=64: 2 greedy prompt\(s\) x 4 tokens: "
                            r"\d+\.\d s", line) for line in gate), gate


def test_runs_interleaved_and_logged(experiment: tuple[Any, str]) -> None:
    result, uri = experiment
    assert [(r.label, r.repeat) for r in result.runs] == [
        ("baseline", 0), ("64", 0), ("4", 0), ("baseline", 1), ("64", 1), ("4", 1)]
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["variable"] == "max_num_batched_tokens"
    assert parent.data.tags["workload_checksum"] == result.workload_checksum
    assert parent.data.params["template.workload.params.num_requests"] == "6"
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{result.parent_run_id}'")
    assert len(children) == 6
    status = sorted((c.data.tags["value"], c.info.status) for c in children)
    assert status == [("4", "FAILED"), ("4", "FAILED"), ("64", "FINISHED"), ("64", "FINISHED"),
                      ("baseline", "FINISHED"), ("baseline", "FINISHED")]
    ok = next(c for c in children if c.data.tags["value"] == "64")
    assert ok.data.params["max_num_batched_tokens"] == "64"
    assert ok.data.metrics["completed"] == 6 and ok.data.metrics["failed"] == 0
    arts = {a.path for a in client.list_artifacts(ok.info.run_id)}
    assert {"requests.csv", "summary.json", "step_trace.csv"} <= arts
    assert len(client.get_metric_history(ok.info.run_id, "step.running")) > 3
    bad = next(c for c in children if c.data.tags["value"] == "4")
    assert "error.txt" in {a.path for a in client.list_artifacts(bad.info.run_id)}
    failed = [r for r in result.runs if r.error]
    assert all("max_num_batched_tokens (4) must be >= max_num_seqs (8)" in r.error
               for r in failed)


def test_verdicts_and_gates(experiment: tuple[Any, str]) -> None:
    result, _ = experiment
    by = {v.value: v for v in result.verdicts}
    assert by[4].failed_runs == 2 and not by[4].adopted and by[4].reason == "2 run(s) failed"
    assert by[64].quality_failures == []  # scheduling knobs keep greedy output identical
    assert "| budget=64 |" in result.table and "reject" in result.table


def test_promote(tmp_path: Path, experiment: tuple[Any, str]) -> None:
    result, uri = experiment
    template = parse_template(TEMPLATE)
    raw = promoted_template(template, 64, "abc")
    assert raw["baseline"]["max_num_batched_tokens"] == 64
    assert raw["variable"] == {"name": "max_num_batched_tokens", "values": [256, 4]}
    parse_template(raw)  # the promoted template is itself valid
    # A parent run that adopted 64 (written by hand): promote rebuilds the template, and
    # checks it first: 4 (< max_num_seqs) would fail every run of the next experiment.
    store = Store("promote-test", uri)
    run_id = store.create_run("p", tags={"adopted": "64"})
    store.log_files(run_id, {"template.yaml": yaml.safe_dump(TEMPLATE),
                             "verdicts.json": json.dumps([{"value": 4, "adopted": False},
                                                          {"value": 64, "adopted": True}])})
    with pytest.raises(TemplateError, match=r"variant max_num_batched_tokens=4: "):
        promote_from_mlflow(run_id, tmp_path / "next.yaml", uri)
    assert not (tmp_path / "next.yaml").exists()
    ok = {**TEMPLATE, "variable": {"name": "max_num_batched_tokens", "values": [64, 128]}}
    run_id = store.create_run("p", tags={"adopted": "64"})
    store.log_files(run_id, {"template.yaml": yaml.safe_dump(ok),
                             "verdicts.json": json.dumps([{"value": 64, "adopted": True}])})
    out = promote_from_mlflow(run_id, tmp_path / "next.yaml", uri)
    assert out is not None
    assert yaml.safe_load(out.read_text())["baseline"]["max_num_batched_tokens"] == 64
    if result.adopted is None:
        assert promote_from_mlflow(result.parent_run_id, tmp_path / "x.yaml", uri) is None


def test_fingerprint_change_warns(tmp_path: Path) -> None:
    from workbench.experiments.stages.resume import fingerprint_warning

    store = Store("fp", f"sqlite:///{tmp_path / 'm.db'}")
    assert fingerprint_warning(store, "aaa") is None  # nothing to compare with
    store.create_run("old", tags={"kind": "experiment", "hardware_fingerprint": "aaa"})
    assert fingerprint_warning(store, "aaa") is None
    with pytest.warns(RuntimeWarning, match=r"fingerprint bbb differs .*\(aaa, run "):
        assert fingerprint_warning(store, "bbb") is not None


def test_http_experiment_starts_a_server_per_run(tmp_path: Path) -> None:
    """The shipped HTTP template, shrunk: `workbench serve` per run, knob as a flag."""
    import socket
    import sys

    from workbench.config.named_models import bundled_checkpoint
    from workbench.experiments.template import load_template

    root = Path(__file__).parents[2]
    raw = load_template(root / "experiments" / "chunked_prefill_budget_http.yaml").raw
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw["target"].update(
        base_url=f"http://127.0.0.1:{port}/v1", poll_interval_s=0.05,
        command=[sys.executable, "-m", "workbench.server.serve", "--model",
                 str(bundled_checkpoint()), "--port", str(port), "--log-level", "warning"])
    raw["workload"]["params"] = {"num_requests": 4}
    raw.update(repeats=1, max_repeats=1, warmup_requests=1,
               variable={"name": "max_num_batched_tokens", "values": [64]})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_experiment(parse_template(raw), uri=uri, progress=False)
    assert [r.error for r in result.runs] == [None, None]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(result.runs[1].run_id)
    assert run.data.params["max_num_batched_tokens"] == "64"
    assert run.data.metrics["completed"] == 4
    # Server-side histogram deltas (seed 002's Δsum/Δcount) beside the client metrics.
    assert run.data.metrics["server.vllm/e2e_request_latency_seconds_count"] == 4
    assert run.data.metrics["server.vllm/e2e_request_latency_seconds/mean_delta"] > 0
    summary = Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path)))
    client_tokens = json.loads(summary.read_text())["metrics"]["total_output_tokens"]
    assert run.data.metrics["server.vllm/generation_tokens_total"] == client_tokens
    assert run.data.tags["server_count_check"] == "ok"
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"client_server_join.csv", "server_delta.json", "requests.csv"} <= arts


def test_parent_run_artifacts_verdict_first(experiment: tuple[Any, str]) -> None:
    """No folders on the parent (MLflow's tree lists folders first), capitals sort before
    lowercase: VERDICT.md is the first artifact a researcher sees."""
    result, uri = experiment
    client = MlflowClient(tracking_uri=uri)
    arts = client.list_artifacts(result.parent_run_id)
    assert not [a.path for a in arts if a.is_dir]
    assert sorted(a.path for a in arts)[0] == "VERDICT.md"
    assert {"sweep.png", "verdicts.json", "template.yaml"} <= {a.path for a in arts}


def test_a_dict_valued_variable_runs_gates_and_promotes(tmp_path: Path) -> None:
    """speculative_config on/off (a dict value): runs, quality gate, verdict and promotion."""

    spec = {"method": "draft_model", "model": "bundled", "num_speculative_tokens": 2}
    template = parse_template({
        "name": "spec-on-off",
        "question": "Does a self-draft keep greedy output identical?",
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "workload": {"fixture": "repetitive", "seed": 0, "params": {"num_requests": 2}},
        "arrivals": {"mode": "closed", "concurrency": 1},
        "target": {"kind": "in-process", "model": "bundled"},
        "baseline": {"dtype": "float32", "max_model_len": 512, "speculative_config": None},
        "variable": {"name": "speculative_config", "values": [spec]},
        "repeats": 1,
        "warmup_requests": 0,
        "quality_gate": {"min_token_agreement": 1.0, "num_prompts": 2, "max_tokens": 6},
    })
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_experiment(template, uri=uri, progress=False)
    (verdict,) = result.verdicts
    assert verdict.value == spec and verdict.quality_failures == []
    assert verdict.failed_runs == 0
    # promotion of the dict value, whatever the verdict (throughput may or may not beat the
    # noise band): the old baseline value was null, so the same question has nothing left to
    # try and the next one must be named
    assert result.adopted in (None, spec)
    with pytest.raises(UserError, match="no speculative_config value left to try"):
        promoted_template(template, spec, result.parent_run_id)
    raw = promoted_template(template, spec, result.parent_run_id,
                            next_variable=("max_num_seqs", [4, 8]))
    out = write_promoted(raw, tmp_path / "next.yaml")
    promoted = yaml.safe_load(out.read_text())
    assert promoted["baseline"]["speculative_config"] == spec
    assert promoted["variable"] == {"name": "max_num_seqs", "values": [4, 8]}
