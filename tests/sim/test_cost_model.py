"""The analytic cost model, the model shapes and the GPU profiles (workbench/sim/cost_model.py,
model_shapes.py, hardware.py): a hand-computed step, the TP/PP/MoE terms, the named data, and
the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.sim.batch import BatchComposition, CostModel
from workbench.sim.cost_model import AnalyticCostModel, dtype_bytes
from workbench.sim.hardware import NAMED_HARDWARE, HardwareProfile, hardware_profile
from workbench.sim.model_shapes import NAMED_SHAPES, ModelShape, from_hf_config, model_shape

# Round numbers so every term below is computed by hand: FLOP/s 1000, bytes/s 100, link 10
# bytes/s, every efficiency 1, 0.5 s per collective, 1 s per step, 0.25 s per sequence.
TOY_GPU = HardwareProfile("toy", peak_flops=1000.0, memory_bandwidth=100.0, memory_bytes=1.0,
                          link="toy link", link_bandwidth=10.0, matmul_efficiency=1.0,
                          memory_efficiency=1.0, link_efficiency=1.0, link_latency_s=0.5,
                          step_overhead_s=1.0, seq_overhead_s=0.25)
TOY_SHAPE = ModelShape("toy", hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                       head_dim=4, intermediate_size=16, vocab_size=32)
# 3 prefill tokens (6 causal pairs), one decode token reading 5 KV tokens, 2 rows sampled
BATCH = BatchComposition(prefill_tokens=3, prefill_attn_pairs=6, decode_tokens=1,
                         decode_context_tokens=5, num_seqs=2, sampled_rows=2)


def test_hand_computed_step() -> None:
    model = AnalyticCostModel(TOY_SHAPE, TOY_GPU, weight_dtype="bf16", kv_cache_dtype="fp8")
    # per layer (x2 layers), T = 4 tokens, GEMM = max(2mkn / 1000, (kn*2 + (mk + mn)*2) / 100):
    #   qkv 4x8 @ 8x16: max(1.024, (256 + 192) / 100 = 4.48)       -> 8.96
    #   o   4x8 @ 8x8:  max(0.512, (128 + 128) / 100 = 2.56)       -> 5.12
    #   gate_up 4x8 @ 8x32: max(2.048, (512 + 320) / 100 = 8.32)   -> 16.64
    #   down 4x16 @ 16x8: max(1.024, (256 + 192) / 100 = 4.48)     -> 8.96
    #   prefill attention: 4 x 6 pairs x 2 heads x 4 / 1000 = 0.192 -> 0.384
    #   decode attention: max(5 x 2 x 1 kv head x 4 x 1 byte / 100 = 0.4, 160 / 1000) -> 0.8
    # lm_head 2x8 @ 8x32: max(1.024, (512 + 160) / 100) = 6.72
    # sampling: 2 rows x 32 x 4 bytes x 3 passes / 100 = 7.68; overhead 1 + 2 x 0.25 = 1.5
    assert model.breakdown(BATCH) == pytest.approx({
        "overhead": 1.5, "qkv_proj": 8.96, "o_proj": 5.12, "gate_up_proj": 16.64,
        "down_proj": 8.96, "attention_prefill": 0.384, "attention_decode": 0.8,
        "tp_all_reduce": 0.0, "pp_send_recv": 0.0, "lm_head": 6.72, "logits_gather": 0.0,
        "sampling": 7.68})
    assert model.step_time_s(BATCH) == pytest.approx(56.764)


def test_tensor_and_pipeline_parallel_terms() -> None:
    model = AnalyticCostModel(TOY_SHAPE, TOY_GPU, tensor_parallel_size=2,
                              pipeline_parallel_size=2, kv_cache_dtype="fp8")
    parts = model.breakdown(BATCH)
    # all-reduce of 4 tokens x 8 x 2 bytes = 64 bytes: 2 (2-1)/2 x 64 / 10 + 0.5 = 6.9;
    # 2 per layer, 2 layers
    assert parts["tp_all_reduce"] == pytest.approx(4 * 6.9)
    assert parts["pp_send_recv"] == pytest.approx(64 / 10 + 0.5)  # one stage boundary
    # logits: 2 rows x 32 x 2 bytes, half from the other rank: 64 / 10 + 0.5
    assert parts["logits_gather"] == pytest.approx(6.9)
    # heads split 1 + 1 kv head (1 kv head replicated): qkv 4x8 @ 8x12,
    # max(0.768, (192 + (32 + 48) x 2) / 100 = 3.52), 2 layers
    assert parts["qkv_proj"] == pytest.approx(7.04)
    # the decode attention reads the one kv head's KV, as with tp 1
    assert parts["attention_decode"] == pytest.approx(0.8)


def test_moe_prices_the_touched_experts() -> None:
    moe = ModelShape("toy-moe", hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                     head_dim=4, intermediate_size=16, vocab_size=32, num_experts=4,
                     experts_per_token=2)
    parts = AnalyticCostModel(moe, TOY_GPU).breakdown(
        BatchComposition(decode_tokens=1, decode_context_tokens=5, num_seqs=1, sampled_rows=1))
    # one token touches 2 of 4 experts: gate_up rows 2, weights 2 x 8 x 32 x 2 = 1024 bytes,
    # activations (2 x 8 + 2 x 32) x 2 = 160: 11.84 per layer
    assert parts["gate_up_proj"] == pytest.approx(2 * 11.84)
    # router 1x8 @ 8x4: max(0.064, (64 + 24) / 100) per layer
    assert parts["router"] == pytest.approx(2 * 0.88)


def test_empty_batch_costs_the_overhead() -> None:
    model = AnalyticCostModel(TOY_SHAPE, TOY_GPU)
    assert model.step_time_s(BatchComposition()) == pytest.approx(1.0)


def test_named_gpu_profiles_order_decode_and_prefill() -> None:
    decode = BatchComposition(decode_tokens=8, decode_context_tokens=8 * 2000, num_seqs=8,
                              sampled_rows=8)
    times = {name: AnalyticCostModel("Llama-3-8B", name).step_time_s(decode)
             for name in NAMED_HARDWARE}
    # decode is bandwidth-bound: faster memory, faster step
    assert times["H200"] < times["H100-SXM"] < times["A100-80GB-SXM"] < times["L40S"]
    model: CostModel = AnalyticCostModel("Llama-3-8B", "H100-SXM")  # mypy: a CostModel
    assert model.describe()["source"] == "analytic"
    assert model.describe()["hardware"]["source"] == "analytic, uncalibrated"


def test_named_shapes_match_their_kv_footprint() -> None:
    assert NAMED_SHAPES["Llama-3-8B"].kv_bytes_per_token(2) == 131072  # 128 KiB
    assert NAMED_SHAPES["Llama-3-70B"].kv_bytes_per_token(2) == 327680  # 320 KiB
    assert NAMED_SHAPES["Llama-2-7B"].kv_bytes_per_token(2) == 524288  # MHA: 512 KiB
    qwen = NAMED_SHAPES["Qwen3-32B"]
    assert (qwen.q_size, qwen.hidden_size) == (8192, 5120)
    mixtral = NAMED_SHAPES["Mixtral-8x7B"]
    assert (mixtral.is_moe, mixtral.num_experts, mixtral.experts_per_token) == (True, 8, 2)


def test_shape_from_hf_configs(tmp_path: Path) -> None:
    bundled = model_shape("bundled")
    assert (bundled.hidden_size, bundled.num_layers, bundled.num_heads, bundled.num_kv_heads,
            bundled.head_dim, bundled.intermediate_size, bundled.vocab_size) == (
        64, 2, 4, 2, 16, 128, 1024)
    mixtral = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
               "num_local_experts": 8, "num_experts_per_tok": 2}
    assert from_hf_config(mixtral, name="Mixtral-8x7B") == NAMED_SHAPES["Mixtral-8x7B"]
    qwen_moe = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                "moe_intermediate_size": 768, "vocab_size": 151936, "num_experts": 128,
                "num_experts_per_tok": 8}
    shape = from_hf_config(qwen_moe)
    assert (shape.intermediate_size, shape.num_experts, shape.experts_per_token) == (768, 128, 8)
    (tmp_path / "config.json").write_text(json.dumps({"text_config": mixtral}))
    assert model_shape(tmp_path).num_experts == 8
    assert model_shape(tmp_path / "config.json").hidden_size == 4096


def test_refusals() -> None:
    with pytest.raises(ValueError) as e:
        hardware_profile("B200")
    assert str(e.value) == ("hardware ('B200') must be one of A100-80GB-SXM, H100-SXM, H200, "
                            "L40S")
    with pytest.raises(ValueError, match=r"model \('gpt-5'\) must be a named shape "
                       r"\(Llama-2-7B, Llama-3-70B, Llama-3-8B, Mixtral-8x7B, Qwen3-32B\)"):
        model_shape("gpt-5")
    with pytest.raises(ValueError, match="model config 'config' has no 'vocab_size'"):
        from_hf_config({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2,
                        "intermediate_size": 16})
    with pytest.raises(ValueError, match=r"dtype \('int3'\) must be one of bf16"):
        dtype_bytes("int3")
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(0\) must be an integer >= 1"):
        AnalyticCostModel("Llama-3-8B", "H100-SXM", tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size \(3\) must be at most"):
        AnalyticCostModel(TOY_SHAPE, TOY_GPU, pipeline_parallel_size=3)
    with pytest.raises(ValueError, match=r"matmul_efficiency \(1.5\) must be in \(0, 1\]"):
        NAMED_HARDWARE["H100-SXM"].with_efficiency(matmul_efficiency=1.5)
    with pytest.raises(ValueError, match="unknown factor"):
        NAMED_HARDWARE["H100-SXM"].with_efficiency(peak_flops=1.0)
    with pytest.raises(ValueError, match=r"experts_per_token \(3\) must be in 1..num_experts"):
        ModelShape("x", 8, 2, 2, 1, 4, 16, 32, num_experts=2, experts_per_token=3)
    assert NAMED_HARDWARE["H100-SXM"].with_efficiency(
        matmul_efficiency=0.5).effective_flops == pytest.approx(989.5e12 / 2)
