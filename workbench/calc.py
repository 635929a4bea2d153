"""Memory arithmetic for the paged KV cache (seed 000/001 formulas).

    KV bytes per token  = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes
    bytes per block     = KV bytes per token x block_size
    max concurrency     = usable blocks / blocks one max_model_len request needs
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, block_size: int
) -> int:
    return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * block_size


def num_blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """Blocks that fit in a byte budget (the null block included: it is a real block)."""
    return budget_bytes // bytes_per_block


def blocks_per_request(num_tokens: int, block_size: int) -> int:
    return cdiv(num_tokens, block_size)


def max_concurrency(num_usable_blocks: int, block_size: int, max_model_len: int) -> float:
    """How many max_model_len-long requests the pool holds at once."""
    return num_usable_blocks / blocks_per_request(max_model_len, block_size)
