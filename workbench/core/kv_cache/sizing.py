"""The KV pool's size in blocks, from the bytes the worker found for it (vLLM's
`kv_cache_utils.get_kv_cache_config` + `check_enough_kv_cache_memory`, for one uniform pool).

    num_blocks = num_gpu_blocks_override, or floor(available_bytes / bytes_per_block)

The null block (block 0) is one of them, so a pool holds num_blocks - 1 usable blocks, and
at least one request of max_model_len must fit in them. Torch-free: the worker measures
(`workbench.worker.kv_cache_sizing.determine_available_memory`), this only divides.
"""

from __future__ import annotations

from workbench.core.kv_cache.utils import cdiv

DEFAULT_CPU_KV_BYTES = 4 << 30  # like vLLM-CPU's VLLM_CPU_KVCACHE_SPACE default (4 GiB)


def default_num_blocks(max_num_seqs: int, max_model_len: int, block_size: int,
                       bytes_per_block: int, cap_bytes: int = DEFAULT_CPU_KV_BYTES) -> int:
    """The engine's pool when no knob sizes it (the worker's "default budget"): room for
    max_num_seqs requests of max_model_len plus the null block, at most `cap_bytes`."""
    want = (max_num_seqs * cdiv(max_model_len, block_size) + 1) * bytes_per_block
    return min(want, cap_bytes) // bytes_per_block


def check_enough_kv_cache_memory(
    num_blocks: int, bytes_per_block: int, block_size: int, max_model_len: int, source: str,
) -> None:
    """ValueError when the pool's usable blocks hold less than one max_model_len request."""
    usable = num_blocks - 1  # block 0 is the null block
    needed = cdiv(max_model_len, block_size)
    if usable < needed:
        raise ValueError(
            f"the KV cache from {source} has {usable} usable blocks ({usable * block_size} "
            f"tokens at block_size {block_size}, {bytes_per_block} bytes per block), fewer "
            f"than one request of max_model_len ({max_model_len}) needs ({needed} blocks); "
            "give the pool more memory/blocks or lower max_model_len"
        )


def get_num_blocks(
    available_bytes: int | None,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    num_gpu_blocks_override: int | None = None,
    source: str = "the available memory",
) -> int:
    """Blocks of the KV pool, the null block included: the override when given, else as many
    blocks of bytes_per_block as available_bytes holds. `source` names the knob in the error."""
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    elif available_bytes is None:
        raise ValueError("available_bytes is None and no num_gpu_blocks_override is given")
    else:
        if available_bytes < 0 or bytes_per_block < 1:
            raise ValueError(f"available_bytes ({available_bytes}) must be >= 0 and "
                             f"bytes_per_block ({bytes_per_block}) >= 1")
        num_blocks = available_bytes // bytes_per_block
    check_enough_kv_cache_memory(num_blocks, bytes_per_block, block_size, max_model_len, source)
    return num_blocks
