"""The studies' templates: what each notebook's question becomes before the runner sees it.
Pure (no run): every template parses, changes exactly the knob it names, and keeps the
notebook's numbers; bad input is refused before anything runs."""

from __future__ import annotations

import sys

import pytest

from workbench.analysis.notebook import override_template, raw_template
from workbench.experiments.studies import layouts, pd_disaggregation, quantization, targets
from workbench.experiments.studies.kv_tiers import host_tier, tiers_template
from workbench.experiments.studies.speculation import spec_config, spec_template
from workbench.experiments.template import parse_template
from workbench.harness.pd_capacity import PDCapacityConfig


def test_spec_template_is_off_against_k_at_one_concurrency() -> None:
    raw = spec_template("demo", "ngram", 3, 4, num_requests=5, seed=2, runs=2, port=8311)
    t = parse_template(raw)
    assert t.name == "speculation-ngram-c4"
    assert t.workload == {"fixture": "repetitive", "seed": 2, "params": {"num_requests": 8}}
    assert t.arrivals == {"mode": "closed", "concurrency": 4}
    assert t.baseline["speculative_config"] is None and t.baseline["max_num_seqs"] == 4
    assert t.variable_name == "speculative_config"
    assert t.variable_values == [spec_config("ngram", 3)]
    assert t.repeats == 2 and t.max_repeats is None
    assert t.quality_gate is not None and t.quality_gate["min_token_agreement"] == 1.0
    assert t.target["kind"] == "http" and t.target["base_url"] == "http://127.0.0.1:8311/v1"
    assert t.target["command"][:4] == [sys.executable, "-m", "workbench.cli", "serve"]
    assert t.target["model"] == t.target["tokenizer"] == "demo"
    with pytest.raises(ValueError, match="k .0. must be >= 1"):
        spec_template("demo", "ngram", 0, 1, num_requests=2)
    with pytest.raises(ValueError, match="method .'medusa'. must be"):
        spec_template("demo", "medusa", 2, 1, num_requests=2)


def test_serve_target_picks_a_free_port_and_local_target_keeps_the_rest() -> None:
    a = targets.serve_target("bundled")
    port = int(a["base_url"].rsplit(":", 1)[1].split("/")[0])
    assert 0 < port < 65536 and a["command"][a["command"].index("--port") + 1] == str(port)
    spec = {"kind": "http", "base_url": "http://127.0.0.1:1/v1", "model": "demo",
            "command": ["workbench", "router", "--port", "1", "--num-replicas", "2"]}
    out = targets.local_target(spec, port=9, num_replicas=3)
    assert out["command"] == [sys.executable, "-m", "workbench.cli", "router", "--port", "9",
                              "--num-replicas", "3"]
    assert out["base_url"] == "http://127.0.0.1:9/v1" and spec["command"][0] == "workbench"


def test_quant_groups_hold_one_knob_each() -> None:
    from workbench.analysis.tables import variant_configs

    groups = quantization.quant_groups(variant_configs(["full", "int8", "int4", "fp8-kv"]))
    assert [(g.name, g.variable, g.values, g.baseline_extra, g.reference) for g in groups] == [
        ("weights", "quantization", {"int8": "int8", "int4": "int4"}, {}, "full"),
        ("kv-cache", "kv_cache_dtype", {"fp8-kv": "fp8"}, {}, "full")]
    groups = quantization.quant_groups(variant_configs(["full", "int4"], int4_group_size=64))
    assert [(g.name, g.variable, g.values, g.baseline_extra, g.reference) for g in groups] == [
        ("int4-g64", "quantization_group_size", {"int4": 64}, {"quantization": "int4"},
         "int4 (group 128)")]
    with pytest.raises(ValueError, match="at least one besides 'full'"):
        quantization.quant_groups({"full": {}})
    with pytest.raises(ValueError, match="changes one knob"):
        quantization.quant_groups({"x": {"quantization": "int8", "kv_cache_dtype": "fp8"}})


def test_quant_template_measures_one_group_at_one_concurrency() -> None:
    group = quantization.QuantGroup("weights", "quantization", {"int8": "int8", "fp8": "fp8"})
    raw = quantization.quant_template(
        group, "demo", {"dtype": "float32", "max_num_seqs": 32}, 4, 8, workload="balanced-chat",
        workload_params={"input_len": {"kind": "fixed", "value": 16}}, seed=1, repeats=2,
        warmup_requests=2, quality_gate={"min_token_agreement": 0.5, "num_prompts": 2})
    t = parse_template(raw)
    assert t.name == "quant-weights-c4" and t.variable_values == ["int8", "fp8"]
    assert t.baseline == {"dtype": "float32", "max_num_seqs": 32}
    assert t.workload["params"] == {"input_len": {"kind": "fixed", "value": 16},
                                    "num_requests": 8}
    assert t.arrivals == {"mode": "closed", "concurrency": 4} and t.repeats == 2
    assert t.quality_gate == {"min_token_agreement": 0.5, "num_prompts": 2}
    without = quantization.quant_template(
        group, "demo", {}, 1, 4, workload="balanced-chat", workload_params={}, seed=0,
        repeats=1, warmup_requests=2, quality_gate=None)
    assert "quality_gate" not in without


def test_tiers_template_is_the_host_tier_against_none() -> None:
    configs = {"off": None, "host tier": host_tier(1 << 20)}
    raw = tiers_template("demo", {"max_num_seqs": 2, "num_gpu_blocks_override": 41},
                         {"num_users": 4, "num_turns": 3}, 4, configs, repeats=2, seed=5)
    t = parse_template(raw)
    assert t.baseline == {"max_num_seqs": 2, "num_gpu_blocks_override": 41,
                          "kv_transfer_config": None}
    assert t.variable_name == "kv_transfer_config"
    assert t.variable_values == [host_tier(1 << 20)]
    assert t.workload == {"fixture": "multi_turn_chat", "seed": 5,
                          "params": {"num_users": 4, "num_turns": 3}}
    assert t.arrivals == {"mode": "closed", "concurrency": 4}
    assert t.repeats == 2 and t.max_repeats is None and t.quality_gate is not None
    with pytest.raises(ValueError, match="must name one baseline"):
        tiers_template("demo", {}, {}, 1, {"a": host_tier(1), "b": host_tier(2)})


def test_layout_templates_derive_from_the_router_template() -> None:
    raw = override_template(raw_template("", "tp_vs_replicas.yaml"), name="tp", repeats=1)
    one = parse_template(layouts.one_worker_template(raw))
    assert one.name == "tp-one-worker" and one.variable_name == "num_workers"
    assert one.baseline["num_workers"] == 1 and one.baseline["tensor_parallel_size"] == 1
    assert one.variable_values == [2] and one.workload == parse_template(raw).workload
    late = parse_template(layouts.latency_template(raw, 3, 7))
    assert late.name == "tp-latency" and late.workload["seed"] == 7
    assert late.workload["params"]["num_requests"] == 3
    assert late.arrivals == {"mode": "closed", "concurrency": 1} and late.repeats == 1
    assert late.variable_name == "tensor_parallel_size"
    routing = raw_template("", "routing_policy.yaml")
    scale = parse_template(layouts.scaling_template(routing, 2, 16, 8, 0))
    assert scale.name == "routing-policy-scaling" and scale.variable_name == "num_replicas"
    assert scale.baseline["num_replicas"] == 1 and scale.variable_values == [2]
    assert scale.workload["fixture"] == "balanced-chat"
    assert scale.workload["params"]["num_requests"] == 16
    assert scale.objective.metric == "output_throughput" and scale.repeats == 1
    with pytest.raises(ValueError, match="num_replicas .1. must be >= 2"):
        layouts.scaling_template(routing, 1, 16, 8, 0)


def test_capacity_template_decodes_the_batch_against_half_of_it() -> None:
    cfg = pd_disaggregation.capacity_config("mixed", "demo", batch=8, repeats=2, seed=4)
    assert isinstance(cfg, PDCapacityConfig)
    t = parse_template(pd_disaggregation.capacity_template(cfg, "cap"))
    assert t.workload == {"fixture": "balanced-chat", "seed": 4, "params": {
        "num_requests": 8, "max_input_len": 272,
        "input_len": {"kind": "fixed", "value": 272},
        "output_len": {"kind": "fixed", "value": 72}}}
    assert t.arrivals == {"mode": "closed", "concurrency": 8}
    assert t.baseline == {"dtype": "float32", "enable_prefix_caching": False,
                          "max_num_seqs": 8, "max_model_len": 344}
    assert (t.variable_name, t.variable_values, t.repeats) == ("max_num_seqs", [4], 2)
    one = pd_disaggregation.capacity_config("mixed", "demo", batch=1)
    t1 = parse_template(pd_disaggregation.capacity_template(one, "cap1"))
    assert t1.variable_values == [2] and t1.arrivals["concurrency"] == 2
