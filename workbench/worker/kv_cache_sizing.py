"""KV-pool sizing, the worker's half (vLLM's `Worker.determine_available_memory`): the bytes
the KV cache may take on this device, measured where the model lives. The engine turns them
into blocks (`workbench.core.kv_cache.sizing.get_num_blocks`).

The KV pool is num_gpu_blocks_override blocks, or kv_cache_memory_bytes of KV, or the rest of
a whole-process budget,

    KV = budget - weights - activation peak - reserve
    budget  = cpu_memory_budget_bytes            (CPU)
            = gpu_memory_utilization x total device memory    (CUDA)
    activation peak = measured by a profile run (ModelRunner.profile_run: a dummy forward of
                      max_num_batched_tokens tokens; the draft model's too, the larger counts)
    reserve = memory_reserve_bytes (+ on CUDA the device memory used outside torch's
              allocator: CUDA context, other processes, and one CUDA-graph capture; + on CPU
              in fp32 the MKL-packed weight copies, `packed_weight_bytes`)

or else a default (max_num_seqs requests of max_model_len, at most 4 GiB; on CUDA also at
most 90% of the free device memory). Under one budget, smaller weights (quantization) or
smaller blocks (fp8 KV) become KV capacity. The target and a draft model share block ids, so
one block costs both models' bytes.

A KIVI KV cache (kv_cache_dtype int8 / int4 / int2) has, besides its smaller blocks, a fixed
full-precision residual pool (`ModelRunner.kv_residual_bytes`): it comes out of
kv_cache_memory_bytes or the budget before the rest is cut into blocks (`residual_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from workbench.core.kv_cache.sizing import DEFAULT_CPU_KV_BYTES, default_num_blocks
from workbench.core.kv_cache.utils import cdiv

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.worker.model_runner import ModelRunner



@dataclass(frozen=True)
class AvailableKVMemory:
    """What the worker measured for the KV pool. `available_bytes` is None when
    num_gpu_blocks_override gives blocks, not bytes; the budget fields are set only when the
    pool is sized from a whole-process budget."""

    source: str  # the knob that sized the pool (the memory readout's kv_pool_source)
    available_bytes: int | None
    budget_bytes: int | None = None
    activation_peak_bytes: int | None = None
    reserve_bytes: int | None = None  # memory_reserve_bytes + graphs + packed + non-torch
    non_torch_bytes: int | None = None
    cudagraph_estimate_bytes: int | None = None  # one capture, counted in reserve_bytes
    residual_bytes: int = 0  # KIVI's full-precision residual pool, not in available_bytes


def _runners(runner: ModelRunner) -> list[ModelRunner]:
    draft = runner.draft_runner
    return [runner] + ([draft] if draft is not None else [])


def pool_bytes_per_block(runner: ModelRunner) -> int:
    """KV bytes one block id costs: the target's layers, plus the draft model's."""
    return sum(r.bytes_per_block for r in _runners(runner))


def pool_residual_bytes(runner: ModelRunner) -> int:
    """KIVI's full-precision residual pool (0 for other KV dtypes), target + draft."""
    return sum(r.kv_residual_bytes for r in _runners(runner))


def pool_weight_bytes(runner: ModelRunner) -> int:
    """Weight bytes in device memory: the target's, plus the draft model's."""
    return sum(r.weight_bytes for r in _runners(runner))


def pool_packed_weight_bytes(runner: ModelRunner) -> int:
    """MKL-packed weight copies (CPU fp32, `workbench.layers.cpu_gemm`), target + draft."""
    return sum(r.packed_weight_bytes for r in _runners(runner))


def determine_available_memory(runner: ModelRunner, config: EngineConfig) -> AvailableKVMemory:
    """The KV pool's bytes from the cache config's knobs (see the module docstring); profiles
    the forward only when a whole-process budget sizes the pool."""
    cc, sc = config.cache_config, config.scheduler_config
    if cc.num_gpu_blocks_override is not None:
        return AvailableKVMemory("num_gpu_blocks_override", None)
    residual = pool_residual_bytes(runner)
    if cc.kv_cache_memory_bytes is not None:
        if cc.kv_cache_memory_bytes < residual:
            raise ValueError(
                f"kv_cache_memory_bytes ({cc.kv_cache_memory_bytes}) must be >= the KIVI "
                f"residual pool ({residual} bytes) plus the blocks; raise it or lower "
                "kv_quant_residual_tokens or max_num_seqs")
        return AvailableKVMemory("kv_cache_memory_bytes", cc.kv_cache_memory_bytes - residual,
                                 residual_bytes=residual)
    if cc.cpu_memory_budget_bytes is not None or cc.gpu_memory_utilization is not None:
        return _from_budget(runner, config)
    max_model_len = config.model_config.max_model_len
    assert max_model_len is not None
    bpb = pool_bytes_per_block(runner)
    cap = DEFAULT_CPU_KV_BYTES
    if runner.device.type == "cuda":
        cap = min(cap, int(torch.cuda.mem_get_info()[0] * 0.9))
    blocks = default_num_blocks(sc.max_num_seqs, max_model_len, cc.block_size, bpb, cap)
    return AvailableKVMemory("the default budget", blocks * bpb, residual_bytes=residual)


def _from_budget(runner: ModelRunner, config: EngineConfig) -> AvailableKVMemory:
    """budget - weights - activation peak - reserve (>= 0); one ValueError naming the knob and
    the least budget that fits one max_model_len request when it is too small."""
    cc, sc = config.cache_config, config.scheduler_config
    max_model_len = config.model_config.max_model_len
    assert sc.max_num_batched_tokens is not None and max_model_len is not None
    weights, bpb = pool_weight_bytes(runner), pool_bytes_per_block(runner)
    activation = max(r.profile_run(sc.max_num_batched_tokens, sc.max_num_seqs)
                     for r in _runners(runner))
    # CUDA graphs: one capture of the largest decode size, measured (0 when graphs are off)
    graphs = runner.profile_cudagraph_memory()
    reserve = cc.memory_reserve_bytes + graphs + pool_packed_weight_bytes(runner)
    non_torch = 0
    dev = runner.device
    if cc.gpu_memory_utilization is not None:
        free, total = torch.cuda.mem_get_info(dev)
        # CUDA context, cuBLAS workspaces, other processes: used, but not by torch tensors
        non_torch = max(0, (total - free) - torch.cuda.memory_reserved(dev))
        budget = int(cc.gpu_memory_utilization * total)
        knob, value = "gpu_memory_utilization", cc.gpu_memory_utilization
    else:
        assert cc.cpu_memory_budget_bytes is not None
        budget = cc.cpu_memory_budget_bytes
        knob, value = "cpu_memory_budget_bytes", budget
    reserve += non_torch
    residual = pool_residual_bytes(runner)  # KIVI's full-precision residual pool
    available = max(0, budget - weights - activation - reserve - residual)
    num_blocks = available // bpb
    min_blocks = cdiv(max_model_len, cc.block_size) + 1  # + the null block
    if num_blocks < min_blocks:
        least = weights + activation + reserve + residual + min_blocks * bpb
        if knob == "gpu_memory_utilization":
            total = torch.cuda.mem_get_info(dev)[1]
            need = f"> {least / total:.4f} (of {total} bytes)"
        else:
            need = f">= {least}"
        raise ValueError(
            f"{knob} ({value}) must be {need}: the budget {budget} bytes has to hold the "
            f"weights ({weights}) + the activation peak ({activation}, profile run of "
            f"max_num_batched_tokens={sc.max_num_batched_tokens}) + the reserve "
            f"({reserve}) + the KIVI residual pool ({residual}) + KV for one max_model_len "
            f"({max_model_len}) request "
            f"({min_blocks} blocks of {bpb} bytes, null block included); raise it, "
            "quantize, lower max_model_len or max_num_batched_tokens"
        )
    if knob == "gpu_memory_utilization":
        free = torch.cuda.mem_get_info(dev)[0]
        if num_blocks * bpb > free:
            raise ValueError(
                f"gpu_memory_utilization ({value}) leaves {num_blocks * bpb} bytes of KV "
                f"but only {free} bytes are free on the device (other processes?); "
                "lower gpu_memory_utilization"
            )
    return AvailableKVMemory(knob, available, budget, activation, reserve, non_torch, graphs,
                             residual)
