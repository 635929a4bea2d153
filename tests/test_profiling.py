"""Profiling ranges: free when off, and in a torch trace (from any thread) when on."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from workbench import LLM, SamplingParams, profiling
from workbench.config.named_models import bundled_checkpoint


def test_range_is_a_shared_null_context_when_nothing_listens() -> None:
    assert profiling.range("a") is profiling.range("b")


def test_torch_trace_captures_engine_ranges_from_a_background_thread(tmp_path: Path) -> None:
    llm = LLM(bundled_checkpoint(), dtype="float32", max_model_len=256)
    trace = tmp_path / "trace.json"
    with profiling.torch_trace(str(trace)):
        t = threading.Thread(target=lambda: llm.generate(
            [[11, 12, 13]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)))
        t.start()
        t.join()
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"engine.step", "scheduler.schedule", "scheduler.update",
            "model_runner.prepare_inputs", "model_runner.sample"} <= names
    assert "model_runner.forward prefill=3 decode=0" in names
    assert "model_runner.forward prefill=0 decode=1" in names
    assert profiling.range("after") is profiling.range("off again")


def test_gzip_trace_is_valid_json_and_kineto_says_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import gzip

    import torch

    trace = tmp_path / "t.json.gz"
    with profiling.torch_trace(trace), profiling.range("matmul-range"):
        torch.ones(8, 8) @ torch.ones(8, 8)
    err = capfd.readouterr().err
    assert "USDT" not in err and "STAGE" not in err
    with gzip.open(trace, "rt") as f:  # gzip, then JSON
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert "matmul-range" in names


def test_quiet_stderr_keeps_other_lines(capfd: pytest.CaptureFixture[str]) -> None:
    import os

    with profiling.quiet_stderr():
        os.write(2, b"USDT:x profiler_start\nreal problem\n")
    assert capfd.readouterr().err == "real problem\n"


def test_run_trace_goes_to_mlflow_and_the_results_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.experiments.child_run import TRACE_NAME, _keep_trace

    logged: list[Path] = []

    class Store:
        def log_artifact(self, run_id: str, path: Path) -> None:
            logged.append(path)

    trace = tmp_path / TRACE_NAME
    trace.write_bytes(b"\x1f\x8b")
    _keep_trace(Store(), "r1", trace, tmp_path / "out", "64_r0", say=True)
    local = tmp_path / "out" / "traces" / "64_r0.json.gz"
    assert logged == [trace] and local.read_bytes() == b"\x1f\x8b"
    assert capsys.readouterr().out.strip().endswith(
        f"MLflow run r1 artifact torch_trace.json.gz and {local}")
