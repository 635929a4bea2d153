"""The memory table `LLM.memory_readout()` prints: the worker's weights, KV pool and budget
(`kv_cache_sizing.py`), with its CUDA-graph, compilation, linear-backend and CPU set-up
status (huge pages, pinned OpenMP threads). Rank 0's view under tensor parallelism
(`MultiprocModelRunner.memory_per_rank` has every rank's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.core.kv_cache.utils import max_concurrency
from workbench.layers.linear_autotune import linear_backend_report
from workbench.worker import cpu_threads, hugepages
from workbench.worker.kv_cache_sizing import (
    AvailableKVMemory,
    pool_bytes_per_block,
    pool_packed_weight_bytes,
    pool_residual_bytes,
)

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.worker.model_runner import ModelRunner

NOT_CPU = "n/a (not a CPU run)"


def cpu_setup_status(runner: ModelRunner) -> dict[str, str]:
    """CPU: 2 MB pages for the KV cache and torch's large buffers (`hugepages`), and whether
    the forward's OpenMP threads are pinned (`cpu_threads`); n/a on other devices."""
    cpu = runner.device.type == "cpu"
    return {"huge_pages": hugepages.status() if cpu else NOT_CPU,
            "cpu_threads": cpu_threads.status() if cpu else NOT_CPU}


def memory_readout(
    runner: ModelRunner, memory: AvailableKVMemory, num_blocks: int, config: EngineConfig,
) -> dict[str, Any]:
    """The memory table. budget_bytes / activation_peak_bytes / reserve_bytes /
    non_torch_bytes are None unless the pool was sized from a budget; then
    weight_bytes + kv_bytes + activation_peak_bytes + reserve_bytes <= budget_bytes, short
    of it by less than one block (kv_bytes counts the null block: it is allocated, and a KIVI
    cache's full-precision residual pool, `kv_residual_bytes`). A KIVI cache's
    kv_bytes_per_token is bytes_per_block / block_size (codes, scales and zeros; a float when
    it does not divide)."""
    cc = config.cache_config
    bs = cc.block_size
    kc = cc.kv_compression_config
    max_model_len = config.model_config.max_model_len
    assert max_model_len is not None
    usable = num_blocks - 1
    bpb = pool_bytes_per_block(runner)
    draft = runner.draft_runner
    draft_weights = draft.weight_bytes if draft is not None else 0
    return {
        "weight_bytes": runner.weight_bytes + draft_weights,
        "draft_weight_bytes": draft_weights,
        "kv_cache_dtype": cc.kv_cache_dtype,
        "kv_bytes": num_blocks * bpb + pool_residual_bytes(runner),
        "kv_residual_bytes": pool_residual_bytes(runner),
        "bytes_per_block": bpb,
        "kv_bytes_per_token": bpb // bs if bpb % bs == 0 else bpb / bs,
        "block_size": bs,
        "num_blocks": usable,
        "kv_token_capacity": usable * bs,
        "max_model_len": max_model_len,
        "max_concurrency": max_concurrency(usable, bs, max_model_len),
        # KV compression: the policy, and the blocks a decoding request holds at most with
        # budget_tokens (None for budget_ratio: it depends on the prompt); a prefill chunk
        # may hold more until its next step (docs/kv_compression.md)
        "kv_compression": None if kc is None else kc.to_dict(),
        "kv_budget_blocks_per_request": (None if kc is None or kc.budget_tokens is None
                                         else -(-kc.budget_tokens // bs)),
        "kv_pool_source": memory.source,
        "budget_bytes": memory.budget_bytes,
        "activation_peak_bytes": memory.activation_peak_bytes,
        "reserve_bytes": memory.reserve_bytes,
        "non_torch_bytes": memory.non_torch_bytes,
        "cuda_graphs": runner.cudagraph_status,
        # compilation_config: mode, graphs, compile seconds, cache hits (workbench.compilation)
        "compilation": runner.compilation_status,
        # counted in reserve_bytes when the pool was sized from a budget
        "cudagraph_estimate_bytes": memory.cudagraph_estimate_bytes,
        "cudagraph_bytes": runner.cudagraph_bytes,  # measured after the real capture
        # CPU fp32 packed GEMM weights; counted in reserve_bytes when sized from a budget
        "packed_weight_bytes": pool_packed_weight_bytes(runner),
        # CPU fp32: the linear backend per weight shape and row count, and where it came
        # from (autotuned now / cache / forced); rank 0's shards (layers.linear_autotune)
        "linear_backends": linear_backend_report(
            *[r.model for r in (runner, draft) if r is not None]),
        **cpu_setup_status(runner),
    }
