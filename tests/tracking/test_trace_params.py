"""A run that replays a trace logs it under workload.trace.* (tracking.param_keys): the format,
the file and its sha256, every trace option with its default, the requests kept, the records
read and the drops; the experiment runner's parent and child runs both carry them."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from workbench.experiments import runner
from workbench.experiments.template import parse_template
from workbench.harness.traces import load_trace
from workbench.harness.traces.samples import FILES, SAMPLES_DIR
from workbench.harness.workloads import Workload
from workbench.tracking.param_keys import param_key, run_params, trace_keys

MOONCAKE = SAMPLES_DIR / FILES["mooncake"]
SHA = hashlib.sha256(MOONCAKE.read_bytes()).hexdigest()
OPTIONS = {"rate_scale": 4.0, "max_requests": 6, "max_model_len": 1024}


def test_trace_params_come_from_the_built_workload() -> None:
    built = load_trace("mooncake", MOONCAKE, seed=0, **OPTIONS)
    assert trace_keys(built) == {
        "workload.trace.format": "mooncake", "workload.trace.path": str(MOONCAKE),
        "workload.trace.sha256": SHA, "workload.trace.rate_scale": 4.0,
        "workload.trace.max_requests": 6, "workload.trace.start_s": 0.0,
        "workload.trace.duration_s": None, "workload.trace.max_model_len": 1024,
        "workload.trace.vocab_size": 32000, "workload.trace.block_size": 512,
        "workload.trace.records_read": 6, "workload.trace.dropped": {},
        "workload.trace.num_requests": 6}
    spec = {"trace": str(MOONCAKE), "format": "mooncake", "seed": 2, "params": OPTIONS}
    closed = {"mode": "closed", "concurrency": 2}
    # with the built workload: its resolved keys; without: the template's block as written
    assert run_params({}, spec, closed, built=built) == {
        "arrival_mode": "closed", "concurrency": 2, "workload_seed": 2, **trace_keys(built)}
    assert run_params({}, spec, closed, repeat=0) == {
        "arrival_mode": "closed", "concurrency": 2, "workload_seed": 2,
        "workload.trace.path": str(MOONCAKE), "workload.trace.format": "mooncake",
        "workload.trace.rate_scale": 4.0, "workload.trace.max_requests": 6,
        "workload.trace.max_model_len": 1024, "repeat": 0}
    # a fixture's keys are unchanged, and a built fixture adds nothing
    fixture = {"fixture": "balanced-chat", "seed": 1, "params": {"num_requests": 3}}
    assert run_params({}, fixture, closed, built=Workload("w", 0, {}, ())) == {
        "arrival_mode": "closed", "concurrency": 2, "workload": "balanced-chat",
        "workload_seed": 1, "num_requests": 3}
    assert [param_key(n) for n in ("workload.trace", "workload.format")] == [
        "workload.trace.path", "workload.trace.format"]


def _template() -> dict[str, Any]:
    return {
        "name": "sim-trace", "question": "does prefix caching cut median TTFT on the trace?",
        "objective": {"metric": "median_ttft_ms", "direction": "minimize"},
        "workload": {"trace": str(MOONCAKE), "format": "mooncake", "seed": 0,
                     "params": OPTIONS},
        "arrivals": {"mode": "trace"},
        "target": {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM",
                   "step_noise": 0},
        "baseline": {"enable_prefix_caching": False, "max_model_len": 1024},
        "variable": {"name": "enable_prefix_caching", "values": [True]},
        "repeats": 1,
    }


def test_the_runner_logs_the_trace_on_parent_and_children(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = runner.run_experiment(parse_template(_template()), uri=uri, progress=False)
    assert len(result.runs) == 2 and all(r.error is None for r in result.runs)
    client = MlflowClient(tracking_uri=uri)
    want = {"workload.trace.format": "mooncake", "workload.trace.path": str(MOONCAKE),
            "workload.trace.sha256": SHA, "workload.trace.rate_scale": "4.0",
            "workload.trace.max_requests": "6", "workload.trace.num_requests": "6",
            "workload.trace.records_read": "6", "workload.trace.dropped": "{}",
            "workload.trace.block_size": "512", "workload.trace.max_model_len": "1024",
            "workload.trace.start_s": "0.0", "workload.trace.duration_s": "null",
            "workload.trace.vocab_size": "32000"}
    for run_id in [result.parent_run_id, *(r.run_id for r in result.runs)]:
        params = client.get_run(run_id).data.params
        got = {k: v for k, v in params.items() if k.startswith("workload.trace.")}
        assert got == want, run_id
    child = client.get_run(result.runs[0].run_id).data.params
    assert child["arrival_mode"] == "trace" and child["workload_seed"] == "0"
    assert "trace" not in child and "format" not in child  # no bare keys any more
