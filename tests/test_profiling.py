"""Profiling ranges: free when off, and in a torch trace (from any thread) when on."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from workbench import LLM, SamplingParams, profiling
from workbench.demo import bundled_checkpoint


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
