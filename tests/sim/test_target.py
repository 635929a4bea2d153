"""`target: {kind: simulated}`: a template's knobs on simulated instances through the one
experiment runner; the KV pool from the GPU's memory; refusals by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench.errors import TemplateError
from workbench.experiments import runner
from workbench.experiments.template import parse_template
from workbench.experiments.validate import check_template
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.model_shapes import model_shape
from workbench.sim.target import make_instances, num_gpu_blocks, run_simulated

TARGET = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM"}


def _template(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "sim-budget", "question": "does a smaller budget cut p95 ITL (simulated)?",
        "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
        "workload": {"fixture": "long-prefill", "seed": 0, "params": {"num_requests": 16}},
        "arrivals": {"mode": "poisson", "rate": 40.0, "seed": 0},
        "target": dict(TARGET),
        "baseline": {"max_model_len": 1024, "max_num_seqs": 32, "max_num_batched_tokens": 512},
        "variable": {"name": "max_num_batched_tokens", "values": [64]},
        "repeats": 2,
    }
    data.update(over)
    return data


def test_the_kv_pool_is_what_the_gpu_memory_holds_after_the_weights() -> None:
    cost = AnalyticCostModel("Llama-3-8B", "H100-SXM")
    shape = model_shape("Llama-3-8B")
    params = shape.num_layers * shape.layer_matmul_params() + 2 * shape.vocab_size * 4096
    free = cost.hardware.memory_bytes * 0.9 - params * 2
    per_block = 2 * 32 * 8 * 128 * 2 * 16  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert num_gpu_blocks(TARGET, {}, cost, 16) == int(free // per_block)
    assert num_gpu_blocks(TARGET, {"num_gpu_blocks_override": 77}, cost, 16) == 77
    cost_tp2 = AnalyticCostModel("Llama-3-8B", "H100-SXM", tensor_parallel_size=2)
    assert num_gpu_blocks(TARGET, {}, cost_tp2, 16) > 2 * num_gpu_blocks(TARGET, {}, cost, 16)


def test_a_run_is_a_run_result_with_the_cost_model_named_and_repeats_differ() -> None:
    wl = Workload("w", 0, {}, tuple(BenchRequest(f"r{i}", list(range(100 * i, 100 * i + 64)),
                                                 8) for i in range(6)))
    arrival = ArrivalSpec(mode="poisson", rate=50.0, seed=1)
    a = run_simulated(TARGET, {"max_num_batched_tokens": 256}, wl, arrival, repeat=0)
    b = run_simulated(TARGET, {"max_num_batched_tokens": 256}, wl, arrival, repeat=1)
    again = run_simulated(TARGET, {"max_num_batched_tokens": 256}, wl, arrival, repeat=0)
    assert [r.output_tokens for r in a.records] == [8] * 6 and a.validity.valid
    assert a.target["kind"] == "simulated" and a.target["step_noise"] == 0.02
    assert a.target["cost_model"]["source"].startswith("analytic")
    assert [r.end_s for r in a.records] == [r.end_s for r in again.records]
    assert [r.end_s for r in a.records] != [r.end_s for r in b.records]
    assert a.step_trace[0]["step"] == 0 and a.step_trace[0]["duration_s"] > 0
    assert a.server_delta["vllm:generation_tokens"] == 48.0
    m = a.metrics()
    assert m["completed"] == 6 and m["median_ttft_ms"] > 0


def test_deterministic_with_no_step_noise() -> None:
    wl = Workload("w", 0, {}, (BenchRequest("r", list(range(64)), 4),))
    target = {**TARGET, "step_noise": 0}
    runs = [run_simulated(target, {}, wl, ArrivalSpec(mode="closed", concurrency=1), repeat=r)
            for r in (0, 1)]
    assert runs[0].records[0].chunk_times_s == runs[1].records[0].chunk_times_s


def test_a_template_runs_simulated_through_the_experiment_runner(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = runner.run_experiment(parse_template(_template()), uri=uri, progress=False)
    budgets = {r.label: r for r in result.runs}
    assert len(result.runs) == 4 and all(r.error is None and r.valid for r in result.runs)
    # a 64-token budget interleaves the long prefills with the decodes: lower p95 ITL
    base = [r.metrics["p95_itl_ms"] for r in result.runs if r.value is None]
    small = [r.metrics["p95_itl_ms"] for r in result.runs if r.value == 64]
    assert max(small) < min(base)
    assert "64" in budgets


def test_refusals_name_the_field() -> None:
    with pytest.raises(TemplateError) as e:
        check_template(_template(target={**TARGET, "profile": "x.json", "gpus": 8}))
    text = str(e.value)
    assert "unknown simulated target key 'gpus'" in text
    assert "exactly one of target.hardware" in text
    with pytest.raises(TemplateError, match="engine knob 'quantization' is not modelled"):
        check_template(_template(baseline={"quantization": "int8"}))
    with pytest.raises(TemplateError, match="speculative_config needs target.acceptance_rate"):
        check_template(_template(baseline={"speculative_config": {
            "method": "ngram", "num_speculative_tokens": 3}}))
    with pytest.raises(ValueError, match=r"router_policy \('x'\) must be one of"):
        make_instances({**TARGET, "router_policy": "x"}, {})


def test_a_cpu_profile_gets_the_pool_the_cpu_engine_would_give() -> None:
    from workbench.sim.calibrated import PROFILE_FORMAT, CalibratedCostModel
    from workbench.sim.linear_fit import TERMS

    shape = model_shape("bundled")
    cost = CalibratedCostModel({"format": PROFILE_FORMAT,
                                "coefficients_s": dict.fromkeys(TERMS, 1e-3),
                                "model": {"shape": shape.as_dict()},
                                "engine": {"dtype": "float32"}})
    config = {"max_num_seqs": 4, "max_model_len": 256}
    # room for 4 requests of 256 tokens (16 blocks each) and the null block, under 4 GiB
    assert num_gpu_blocks(TARGET, config, cost, 16) == 4 * 16 + 1
    per_block = 2 * shape.num_layers * shape.kv_size * 4 * 16  # K and V in fp32
    big = {"max_num_seqs": 10**6, "max_model_len": 256}
    assert num_gpu_blocks(TARGET, big, cost, 16) == (4 << 30) // per_block
