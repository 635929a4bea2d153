"""The memory budget: under one fixed `cpu_memory_budget_bytes`, quantized weights (int8, int4)
and an FP8 KV cache move memory from weights to KV (seed 001), exactly as `workbench.planning`
predicts; the readout; the profile run's activation peak; bad budgets and knobs.

Tiny llama (tiny_checkpoint seed 0: hidden 64, 2 layers, 2 KV heads x 16, vocab 1024), fp32,
block 16, max_model_len 128, max_num_batched_tokens 256, under a 4 MiB budget. Measured:

    mode          weights   KV bytes  bytes/block  blocks  KV tokens  activation peak
    none          836,864  2,564,096        8,192     312      4,992          788,736
    int8          619,776  2,785,280        8,192     339      5,424          788,736
    int4 (G=32)   597,248  2,801,664        8,192     341      5,456          788,736
    fp8 KV        836,864  2,568,192        2,048   1,253     20,048          788,736

(measured before the CPU packed-GEMM copies; they now come off the KV as part of the reserve:
557,056 bytes unquantized, 262,144 quantized, where only the LM head is packed.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.config import EngineConfig
from workbench.core.kv_cache.utils import (
    budget_num_blocks,
    cdiv,
    kv_bytes_per_block,
    kv_cache_dtype_bytes,
    max_concurrency,
)
from workbench.layers.linear import LinearBase
from workbench.layers.linear_backend import BACKEND_ENV, available_backends
from workbench.planning import quantized_weight_bytes
from workbench.testing import tiny_checkpoint
from workbench.worker.memory_profile import LiveTensorPeak

BUDGET = 4 << 20
BS, MAX_LEN = 16, 128
ENGINE = {"dtype": "float32", "max_model_len": MAX_LEN, "block_size": BS,
          "max_num_batched_tokens": 256, "max_num_seqs": 16, "enable_prefix_caching": False}
MODES: dict[str, dict[str, Any]] = {
    "none": {},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4", "quantization_group_size": 32},
    "fp8_kv": {"kv_cache_dtype": "fp8"},
    "int4+fp8_kv": {"quantization": "int4", "quantization_group_size": 32,
                    "kv_cache_dtype": "fp8"},
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("budget") / "llama", arch="llama", seed=0)


@pytest.fixture(scope="module", autouse=True)
def _every_linear_packed() -> Iterator[None]:
    """Every fp32 linear packed, whatever this machine's autotune would choose (a shape whose
    timings favour plain torch keeps no packed copy), so the byte counts here stay exact."""
    backend = next((b for b in ("onednn", "mkl") if b in available_backends()), None)
    if backend is None:
        pytest.skip("this torch build has no packed CPU linear backend")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(BACKEND_ENV, backend)
        yield


@pytest.fixture(scope="module")
def readouts(ckpt: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for mode, kwargs in MODES.items():
        llm = LLM(ckpt, **ENGINE, cpu_memory_budget_bytes=BUDGET, **kwargs)
        r = llm.memory_readout()
        greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        r["generated"] = len(llm.generate([[5, 6, 7] * 20], greedy)[0].outputs[0].token_ids)
        if mode == "none":
            model = llm.engine.runner.model
            linears = [(m.input_size, m.output_size) for m in model.modules()
                       if isinstance(m, LinearBase)]
            r["linear_params"] = sum(i * o for i, o in linears)
            r["linear_rows"] = sum(o for _, o in linears)
        out[mode] = r
        del llm
    return out


def predicted_weight_bytes(readouts: dict[str, dict[str, Any]], mode: str) -> int:
    """calc: the fp32 model's weights with its linear layers stored as `mode` says."""
    base = readouts["none"]
    n, rows = base["linear_params"], base["linear_rows"]
    kwargs = MODES[mode]
    rest = base["weight_bytes"] - quantized_weight_bytes(n, rows, None, dtype_bytes=4)
    return rest + quantized_weight_bytes(
        n, rows, kwargs.get("quantization"), kwargs.get("quantization_group_size", 128),
        dtype_bytes=4,
    )


@pytest.mark.parametrize("mode", list(MODES))
def test_budget_is_spent_within_one_block(readouts: dict[str, Any], mode: str) -> None:
    r = readouts[mode]
    assert r["budget_bytes"] == BUDGET and r["kv_pool_source"] == "cpu_memory_budget_bytes"
    # CPU fp32: the MKL-packed weight copies are the reserve (memory_reserve_bytes is 0)
    assert r["reserve_bytes"] == r["packed_weight_bytes"] and r["non_torch_bytes"] == 0
    assert r["activation_peak_bytes"] > 0
    spent = r["weight_bytes"] + r["kv_bytes"] + r["activation_peak_bytes"] + r["reserve_bytes"]
    assert BUDGET - r["bytes_per_block"] < spent <= BUDGET
    assert r["generated"] == 4  # the engine serves after the profile run


@pytest.mark.parametrize("mode", list(MODES))
def test_capacity_is_what_calc_predicts(readouts: dict[str, Any], mode: str) -> None:
    r = readouts[mode]
    weights = predicted_weight_bytes(readouts, mode)
    assert r["weight_bytes"] == weights
    kv = MODES[mode].get("kv_cache_dtype", "auto")
    bpb = kv_bytes_per_block(2, 2, 16, kv_cache_dtype_bytes(kv, 4), BS)
    assert r["bytes_per_block"] == bpb
    # packed copies: every fp32 linear (none when quantized) and the LM head (vocab x hidden)
    packed = 4 * (1024 * 64 + (0 if "quantization" in MODES[mode] else
                               readouts["none"]["linear_params"]))
    assert r["packed_weight_bytes"] == packed
    blocks = budget_num_blocks(BUDGET, weights, r["activation_peak_bytes"], packed, bpb)
    assert r["num_blocks"] == blocks - 1  # block 0 is the null block
    assert r["kv_bytes"] == blocks * bpb
    assert r["kv_token_capacity"] == (blocks - 1) * BS
    assert r["max_concurrency"] == max_concurrency(blocks - 1, BS, MAX_LEN)


def test_quantization_moves_memory_from_weights_to_kv(readouts: dict[str, Any]) -> None:
    base = readouts["none"]
    for mode in MODES:
        r = readouts[mode]
        # weights + packed copies + KV stays constant within a block, the activation peak
        # accounted for
        moved = ((r["weight_bytes"] + r["kv_bytes"] + r["packed_weight_bytes"])
                 - (base["weight_bytes"] + base["kv_bytes"] + base["packed_weight_bytes"]))
        act_delta = base["activation_peak_bytes"] - r["activation_peak_bytes"]
        assert abs(moved - act_delta) < max(r["bytes_per_block"], base["bytes_per_block"])
    cap = {m: readouts[m]["kv_token_capacity"] for m in MODES}
    w = {m: readouts[m]["weight_bytes"] for m in MODES}
    assert w["int4"] < w["int8"] < w["none"] == w["fp8_kv"]
    assert cap["none"] < cap["int8"] < cap["int4"] < cap["fp8_kv"] < cap["int4+fp8_kv"]
    # fp32 -> fp8 KV: a quarter of the bytes per block, so about 4x the tokens in the same KV
    assert readouts["fp8_kv"]["bytes_per_block"] * 4 == base["bytes_per_block"]
    # (in blocks with the null block: floor(4 KV / b) is 4 floor(KV / b) + 0..3)
    total = {m: readouts[m]["num_blocks"] + 1 for m in ("none", "fp8_kv")}
    assert 4 * total["none"] <= total["fp8_kv"] <= 4 * total["none"] + 3


def test_reserve_comes_off_the_kv(ckpt: Path, readouts: dict[str, Any]) -> None:
    reserve = 100_000
    r = LLM(ckpt, **ENGINE, cpu_memory_budget_bytes=BUDGET,
            memory_reserve_bytes=reserve).memory_readout()
    assert r["reserve_bytes"] == reserve + r["packed_weight_bytes"]
    act = r["activation_peak_bytes"]
    assert r["num_blocks"] + 1 == budget_num_blocks(BUDGET, r["weight_bytes"], act,
                                                    r["reserve_bytes"], r["bytes_per_block"])
    assert r["num_blocks"] < readouts["none"]["num_blocks"]


def test_readout_without_a_budget(ckpt: Path) -> None:
    r = LLM(ckpt, **ENGINE, num_gpu_blocks_override=20).memory_readout()
    assert r["num_blocks"] == 19 and r["kv_pool_source"] == "num_gpu_blocks_override"
    for key in ("budget_bytes", "activation_peak_bytes", "reserve_bytes", "non_torch_bytes"):
        assert r[key] is None
    assert r["kv_cache_dtype"] == "auto"


def test_the_least_budget_fits_exactly_one_request(ckpt: Path) -> None:
    with pytest.raises(ValueError, match=r"cpu_memory_budget_bytes \(1000000\) must be >= "):
        LLM(ckpt, **ENGINE, cpu_memory_budget_bytes=1_000_000)
    with pytest.raises(ValueError) as e:
        LLM(ckpt, **ENGINE, cpu_memory_budget_bytes=800_000)  # smaller than the weights
    match = re.search(r"must be >= (\d+)", str(e.value))
    assert match is not None
    assert "weights (836864)" in str(e.value)
    least = int(match.group(1))
    r = LLM(ckpt, **ENGINE, cpu_memory_budget_bytes=least).memory_readout()
    assert r["num_blocks"] == cdiv(MAX_LEN, BS)
    assert r["max_concurrency"] == 1.0
    with pytest.raises(ValueError, match="cpu_memory_budget_bytes"):
        LLM(ckpt, **ENGINE, cpu_memory_budget_bytes=least - 1)


def test_the_profile_run_scales_with_the_token_budget(ckpt: Path) -> None:
    from workbench.worker.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig.from_kwargs(ckpt, **ENGINE))
    peaks = [runner.profile_run(n, 16) for n in (64, 256, 1024)]
    assert peaks[0] < peaks[1] < peaks[2]
    assert peaks == [runner.profile_run(n, 16) for n in (64, 256, 1024)]  # deterministic
    assert runner.kv_caches == []  # the temporary cache is gone


def test_live_tensor_peak_counts_new_storages_only() -> None:
    base = torch.zeros(1000)
    with LiveTensorPeak() as t:
        a = torch.empty(1000)  # 4,000 bytes
        b = torch.empty(2000)  # 8,000 bytes: 12,000 live
        a_view = a[10:].view(-1, 10)  # a view: no new storage
        base.add_(1)  # in place on an existing tensor: nothing new
        del a, a_view  # freed: 8,000 live
        c = torch.empty(500)  # 10,000 live
    assert t.peak == 12_000
    assert t.current == 10_000
    del b, c


def test_bad_knobs(ckpt: Path) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"kv_cache_dtype": "fp8_e5m2"}, r"kv_cache_dtype \('fp8_e5m2'\) must be one of"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),  # int8 / int4 / int2: KIVI
        ({"calculate_kv_scales": True}, r"calculate_kv_scales \(True\) only applies"),
        ({"kv_cache_dtype": "fp8", "calculate_kv_scales": 1}, "calculate_kv_scales"),
        ({"cpu_memory_budget_bytes": 0}, r"cpu_memory_budget_bytes \(0\) must be a positive"),
        ({"cpu_memory_budget_bytes": 1.5e6}, "cpu_memory_budget_bytes"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization \(1.5\) must be a number in"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.9, "device": "cpu"}, "is for device='cuda'"),
        ({"cpu_memory_budget_bytes": BUDGET, "device": "cuda"}, "is for device='cpu'"),
        ({"cpu_memory_budget_bytes": BUDGET, "kv_cache_memory_bytes": 1 << 20},
         "both size the KV pool"),
        ({"cpu_memory_budget_bytes": BUDGET, "num_gpu_blocks_override": 10},
         "both size the KV pool"),
        ({"memory_reserve_bytes": -1, "cpu_memory_budget_bytes": BUDGET},
         r"memory_reserve_bytes \(-1\) must be an integer >= 0"),
        ({"memory_reserve_bytes": 10}, "only applies with a budget"),
    ]
    for kwargs, pattern in bad:
        with pytest.raises(ValueError, match=pattern):
            EngineConfig.from_kwargs(ckpt, **kwargs)


def test_calc_helpers() -> None:
    from workbench.core.kv_cache.utils import fp8_kv_scale

    assert [kv_cache_dtype_bytes(d, 2) for d in ("auto", "fp8", "fp8_e4m3")] == [2, 1, 1]
    assert kv_cache_dtype_bytes("auto", 4) == 4
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_cache_dtype_bytes("fp8_e5m2", 2)
    assert fp8_kv_scale(448.0) == 1.0 and fp8_kv_scale(0.0) == 1.0
    with pytest.raises(ValueError, match="amax"):
        fp8_kv_scale(-1.0)
    # (budget - weights - activations - reserve) // bytes_per_block, never negative
    assert budget_num_blocks(1000, 100, 200, 50, 64) == 650 // 64
    assert budget_num_blocks(100, 200, 0, 0, 64) == 0
    with pytest.raises(ValueError, match="bytes_per_block"):
        budget_num_blocks(1000, 0, 0, 0, 0)
    # seed 001's reading: 18 GiB off the weights at 10 KiB per token (160 KiB per 16-token
    # block) come back as ~1.887M KV tokens, within one block
    gained = (budget_num_blocks(40 << 30, 10 << 30, 0, 0, 160 << 10)
              - budget_num_blocks(40 << 30, 28 << 30, 0, 0, 160 << 10)) * 16
    assert abs(gained - (18 << 30) / (10 << 10)) < 16
