"""Secrets never reach logs, MLflow or the results folder: a template whose server runs with
`--api-key` and whose `target.api_key` holds the key, run end to end; then every param, tag,
artifact, results file, the MLflow database's bytes and the captured logs and console are
searched for the key. And the redaction rules themselves, exactly."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from workbench.config.named_models import bundled_checkpoint
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import load_template, parse_template
from workbench.harness.redact import (
    REDACTED,
    is_secret_name,
    redact,
    redact_argv,
    redact_text,
    secret_values,
)
from workbench.harness.server_process import ServerProcess
from workbench.tracking.mlflow_store import Store, artifact_location, artifact_name

SECRET = "sk-redact-me-4242"


@pytest.mark.parametrize("name", ["api_key", "--api-key", "OPENAI_API_KEY", "target.api_key",
                                  "apikey", "hf_token", "--hf-token", "HF_TOKEN", "token",
                                  "client_secret", "secret_key", "password", "db_passwd"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_tokens", "num_speculative_tokens", "tokenizer",
                                  "prompt_token_ids", "bos_token", "eos_token", "pad_token",
                                  "api", "key", "max_num_batched_tokens", "--port", "name"])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_mappings_argv_and_text() -> None:
    raw = {"name": "x", "target": {"api_key": SECRET, "command": [
        "workbench", "serve", "--api-key", SECRET, "--port", "8000"], "hf_token": None},
        "baseline": {"max_tokens": 5}}
    assert redact(raw) == {"name": "x", "target": {"api_key": REDACTED, "command": [
        "workbench", "serve", "--api-key", REDACTED, "--port", "8000"], "hf_token": None},
        "baseline": {"max_tokens": 5}}
    assert raw["target"]["api_key"] == SECRET  # a copy
    assert secret_values(raw) == {SECRET}
    assert secret_values(["serve", "--api-key=abc1", "--hf-token", "t0k3n"]) == {"abc1", "t0k3n"}
    assert redact_argv(["serve", "--api-key=abc1", "--hf-token", "t0k3n", "--max-tokens", "5"]) \
        == ["serve", f"--api-key={REDACTED}", "--hf-token", REDACTED, "--max-tokens", "5"]
    assert redact_text(f"ran serve --api-key {SECRET} --max-tokens 5") == \
        f"ran serve --api-key {REDACTED} --max-tokens 5"
    assert redact_text(f"api_key: {SECRET}\nmodel: m\n", {SECRET}) == \
        f"api_key: {REDACTED}\nmodel: m\n"
    assert redact_text("a key abc in text", {"abc"}) == "a key abc in text"  # too short


def test_artifact_names_stay_inside_the_run(tmp_path: Path) -> None:
    for bad in ("../x.txt", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(ValueError, match="must be a relative path inside the run"):
            artifact_name(bad)
    assert artifact_name("plots/a.png") == "plots/a.png"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert artifact_location(uri, "..") == (tmp_path / "artifacts" / "_..").as_uri()
    assert artifact_location(uri, "a/../../b") == (tmp_path / "artifacts" / "a_.._.._b").as_uri()


def test_server_process_logs_and_describes_the_command_redacted(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", f"print('got {SECRET}'); raise SystemExit(3)",
           "--api-key", SECRET]
    proc = ServerProcess(cmd, "http://127.0.0.1:9", ready_timeout_s=30,
                         env={"HF_TOKEN": SECRET}, log_path=tmp_path / "s.log")
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError) as e:
        proc.start()
    assert SECRET not in str(e.value) and "--api-key ***" in str(e.value)
    assert "got ***" in str(e.value)  # the log tail too
    assert SECRET not in caplog.text and "--api-key ***" in caplog.text
    assert SECRET not in str(proc.describe())


def test_store_redacts_params_tags_files_and_descriptions(tmp_path: Path) -> None:
    store = Store("redact", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = store.create_run("r", tags={"cmd": f"serve --api-key {SECRET}"})
    store.log_params(run, {"template": {"target": {"api_key": SECRET, "model": "m"}}})
    store.set_tags(run, {"error": f"failed with key {SECRET}", "spec": {"token": SECRET}})
    store.set_description(run, f"the key is {SECRET}")
    store.log_files(run, {"template.yaml": f"target:\n  api_key: {SECRET}\n"})
    (tmp_path / "notes.md").write_text(f"key {SECRET}\n")
    store.log_artifact(run, tmp_path / "notes.md")
    got = MlflowClient(store.uri).get_run(run)
    assert got.data.params == {"template.target.api_key": REDACTED,
                               "template.target.model": "m"}
    assert got.data.tags["cmd"] == f"serve --api-key {REDACTED}"
    assert got.data.tags["error"] == f"failed with key {REDACTED}"
    assert got.data.tags["spec"] == '{"token": "***"}'
    assert got.data.tags["mlflow.note.content"] == f"the key is {REDACTED}"
    out = Path(MlflowClient(store.uri).download_artifacts(run, "", str(tmp_path / "dl")))
    assert (out / "template.yaml").read_text() == f"target:\n  api_key: {REDACTED}\n"
    assert (out / "notes.md").read_text() == f"key {REDACTED}\n"


def _grep(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_an_experiment_with_an_api_key_logs_it_nowhere(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).parents[2]
    raw = load_template(root / "experiments" / "chunked_prefill_budget_http.yaml").raw
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw["target"].update(
        base_url=f"http://127.0.0.1:{port}/v1", poll_interval_s=0.05, api_key=SECRET,
        command=[sys.executable, "-m", "workbench.server.serve", "--model",
                 str(bundled_checkpoint()), "--port", str(port), "--log-level", "warning",
                 "--api-key", SECRET])
    raw["workload"]["params"] = {"num_requests": 2}
    raw.update(name="redaction-check", repeats=1, max_repeats=1, warmup_requests=0,
               variable={"name": "max_num_batched_tokens", "values": [64]})
    mlruns = tmp_path / "mlruns"
    mlruns.mkdir()
    uri = f"sqlite:///{mlruns / 'mlflow.db'}"
    with caplog.at_level(logging.DEBUG):
        result = run_experiment(parse_template(raw), uri=uri, progress=True,
                                results_dir=tmp_path / "results")
    assert [r.error for r in result.runs] == [None, None]  # the key let the client in
    client = MlflowClient(tracking_uri=uri)
    runs = [client.get_run(result.parent_run_id), *(client.get_run(r.run_id)
                                                    for r in result.runs)]
    for run in runs:
        assert SECRET not in str(run.data.params) and SECRET not in str(run.data.tags)
    assert runs[1].data.params["target.api_key"] == REDACTED
    assert runs[0].data.params["template.target.api_key"] == REDACTED
    assert "--api-key" in runs[1].data.params["target.command"]
    for run in runs:
        client.download_artifacts(run.info.run_id, "", str(tmp_path / "dl" / run.info.run_id))
    assert _grep(tmp_path / "dl", SECRET) == []
    assert _grep(tmp_path / "results", SECRET) == []
    assert _grep(mlruns, SECRET) == []  # the database's bytes and every artifact
    out, err = capfd.readouterr()
    assert SECRET not in out + err
    assert SECRET not in caplog.text
