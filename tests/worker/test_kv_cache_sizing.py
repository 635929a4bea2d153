"""KV-pool sizing: the worker's available bytes (`determine_available_memory`, on a fake CPU
runner with fixed sizes) and the blocks they make (`get_num_blocks`), exact numbers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from workbench.core.kv_cache.sizing import get_num_blocks
from workbench.core.kv_cache.utils import kv_bytes_per_block
from workbench.worker.kv_cache_sizing import (
    AvailableKVMemory,
    determine_available_memory,
    pool_bytes_per_block,
)

# 2 layers x 2 KV heads x head_dim 8 x fp32 x block_size 4: 2 x 2 x 2 x 8 x 4 x 4 bytes
BPB = kv_bytes_per_block(num_layers=2, num_kv_heads=2, head_dim=8, dtype_bytes=4, block_size=4)


def test_bytes_per_block_of_the_shape() -> None:
    assert BPB == 1024


@pytest.mark.parametrize(("available", "num_blocks"), [
    (10_000, 9),  # floor(10000 / 1024): 8 usable blocks = 32 tokens = one max_model_len
    (1 << 20, 1024),
    (9 * 1024, 9),
])
def test_blocks_from_bytes(available: int, num_blocks: int) -> None:
    assert get_num_blocks(available, BPB, block_size=4, max_model_len=32) == num_blocks


def test_the_override_wins_and_too_few_blocks_name_the_source() -> None:
    assert get_num_blocks(None, BPB, 4, 32, num_gpu_blocks_override=19) == 19
    with pytest.raises(ValueError, match=(
            r"^the KV cache from kv_cache_memory_bytes has 7 usable blocks \(28 tokens at "
            r"block_size 4, 1024 bytes per block\), fewer than one request of max_model_len "
            r"\(32\) needs \(8 blocks\)")):
        get_num_blocks(9 * 1024 - 1, BPB, 4, 32, source="kv_cache_memory_bytes")
    with pytest.raises(ValueError, match="num_gpu_blocks_override has 4 usable blocks"):
        get_num_blocks(None, BPB, 4, 32, 5, source="num_gpu_blocks_override")


class FakeRunner:
    """What sizing reads from a model runner, with fixed sizes (CPU, no CUDA graphs)."""

    device = torch.device("cpu")
    kv_residual_bytes = 0  # no KIVI residual pool

    def __init__(self, bytes_per_block: int, weight_bytes: int, activation: int,
                 packed: int = 0, draft: FakeRunner | None = None) -> None:
        self.bytes_per_block, self.weight_bytes = bytes_per_block, weight_bytes
        self.packed_weight_bytes, self.activation = packed, activation
        self.draft_runner = draft
        self.profiled: list[tuple[int, int]] = []

    def profile_run(self, num_tokens: int, max_num_seqs: int) -> int:
        self.profiled.append((num_tokens, max_num_seqs))
        return self.activation

    def profile_cudagraph_memory(self) -> int:
        return 0


def _config(**cache: Any) -> Any:
    cc = {"block_size": 4, "num_gpu_blocks_override": None, "kv_cache_memory_bytes": None,
          "cpu_memory_budget_bytes": None, "gpu_memory_utilization": None,
          "memory_reserve_bytes": 0, **cache}
    return SimpleNamespace(
        cache_config=SimpleNamespace(**cc),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64, max_num_seqs=4),
        model_config=SimpleNamespace(max_model_len=32),
    )


def test_a_cpu_budget_leaves_budget_minus_weights_activation_and_reserve() -> None:
    draft = FakeRunner(256, weight_bytes=4_000, activation=12_000)
    runner = FakeRunner(BPB, weight_bytes=40_000, activation=10_000, packed=500, draft=draft)
    mem = determine_available_memory(
        runner, _config(cpu_memory_budget_bytes=100_000, memory_reserve_bytes=1_000))  # type: ignore[arg-type]
    # 100000 - (40000 + 4000) - max(10000, 12000) - (1000 + 500 packed + 0 graphs)
    assert mem == AvailableKVMemory(
        "cpu_memory_budget_bytes", 42_500, budget_bytes=100_000, activation_peak_bytes=12_000,
        reserve_bytes=1_500, non_torch_bytes=0, cudagraph_estimate_bytes=0)
    assert runner.profiled == draft.profiled == [(64, 4)]
    assert pool_bytes_per_block(runner) == 1280  # target + draft share block ids
    assert get_num_blocks(mem.available_bytes, 1280, 4, 32) == 33  # floor(42500 / 1280)


def test_a_budget_too_small_names_the_least_that_fits() -> None:
    runner = FakeRunner(BPB, weight_bytes=40_000, activation=10_000)
    # one max_model_len request: 8 blocks + the null block = 9 x 1024 on top of 50000
    with pytest.raises(ValueError, match=r"^cpu_memory_budget_bytes \(59000\) must be >= 59216"):
        determine_available_memory(runner, _config(cpu_memory_budget_bytes=59_000))  # type: ignore[arg-type]
    mem = determine_available_memory(runner, _config(cpu_memory_budget_bytes=59_216))  # type: ignore[arg-type]
    assert mem.available_bytes == 9 * 1024


def test_other_sources_measure_nothing() -> None:
    runner = FakeRunner(BPB, weight_bytes=40_000, activation=10_000)
    assert determine_available_memory(runner, _config(num_gpu_blocks_override=19)) == (  # type: ignore[arg-type]
        AvailableKVMemory("num_gpu_blocks_override", None))
    assert determine_available_memory(runner, _config(kv_cache_memory_bytes=1 << 20)) == (  # type: ignore[arg-type]
        AvailableKVMemory("kv_cache_memory_bytes", 1 << 20))
    # the default: max_num_seqs requests of max_model_len (+ the null block), under 4 GiB
    assert determine_available_memory(runner, _config()) == (  # type: ignore[arg-type]
        AvailableKVMemory("the default budget", (4 * 8 + 1) * BPB))
    assert runner.profiled == []
