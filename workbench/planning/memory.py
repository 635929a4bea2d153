"""Memory and blocks for planning: KV capacity in tokens, prefix-cache hits, weight bytes
(plain and quantized) and the split of a device budget into weights, KV, activations and
reserves (seeds 000 and 001).

    device memory = weights + KV + activations + graph reserve + headroom
    KV tokens     = KV pool blocks x block_size
    KV bytes      = per block for any kv_cache_dtype, KIVI's scales and residual included
                    (`kv_cache_bytes`, `workbench calc kv --kv-cache-dtype int4`)

The per-token and per-block KV bytes come from the engine's own arithmetic
(`workbench.core.kv_cache.utils`).
"""

from __future__ import annotations

import math

from workbench.core.kv_cache.utils import (
    KIVI_KV_BITS,
    blocks_needed,
    kivi_bytes_per_block,
    kivi_residual_bytes,
    kivi_residual_slots,
    kv_bytes_per_block,
    kv_cache_dtype_bytes,
    max_concurrency,
)
from workbench.planning.checks import need_int, need_num

GiB = 1 << 30


def last_block_free_slots(num_tokens: int, block_size: int) -> int:
    """blocks_needed x block_size - num_tokens: the empty slots (not the filled ones) at the end."""
    return blocks_needed(num_tokens, block_size) * block_size - num_tokens


def kv_token_capacity(num_blocks: int, block_size: int) -> int:
    """num_blocks x block_size (vLLM's "GPU KV cache size: N tokens" counts every block)."""
    need_int("num_blocks", num_blocks, 0)
    need_int("block_size", block_size, 1)
    return num_blocks * block_size


def theoretical_concurrency(kv_token_capacity_tokens: int, tokens_per_active_request: int) -> int:
    """floor(kv_token_capacity / tokens_per_active_request): an upper bound, not a promise."""
    need_int("kv_token_capacity_tokens", kv_token_capacity_tokens, 0)
    need_int("tokens_per_active_request", tokens_per_active_request, 1)
    return kv_token_capacity_tokens // tokens_per_active_request


def prefix_cache_hit_tokens(
    shared_prefix_tokens: int, block_size: int, prompt_tokens: int | None = None
) -> int:
    """Tokens served from the prefix cache: full blocks only, floor(shared / bs) x bs.

    A partly filled block is never hashed, so 1,530 shared tokens at block 16 hit 1,520. With
    `prompt_tokens`, vLLM's cap applies: at most prompt_tokens - 1 tokens may hit (the last
    prompt token is recomputed to get logits), again rounded down to full blocks:
    min(shared // bs, (prompt - 1) // bs) x bs.
    """
    need_int("shared_prefix_tokens", shared_prefix_tokens, 0)
    need_int("block_size", block_size, 1)
    full = shared_prefix_tokens // block_size
    if prompt_tokens is not None:
        need_int("prompt_tokens", prompt_tokens, 1)
        if shared_prefix_tokens > prompt_tokens:
            raise ValueError(
                f"shared_prefix_tokens ({shared_prefix_tokens}) cannot exceed prompt_tokens "
                f"({prompt_tokens})"
            )
        full = min(full, (prompt_tokens - 1) // block_size)
    return full * block_size


def weight_bytes(num_params: int, bytes_per_param: float) -> int:
    """ceil(num_params x bytes_per_param): 14B at bf16 (2) is 28 GB, at 4 bit (0.5) 7 GB."""
    need_int("num_params", num_params, 0)
    need_num("bytes_per_param", bytes_per_param, 0.0)
    return math.ceil(num_params * bytes_per_param)


def memory_budget(
    available_bytes: int,
    weight_bytes: int,
    bytes_per_token: int,
    block_size: int,
    *,
    activation_bytes: int = 0,
    graph_reserve_bytes: int = 0,
    headroom_bytes: int = 0,
    max_model_len: int | None = None,
) -> dict[str, int | float | None]:
    """Split a device budget: available = weights + KV + activations + graph + headroom.

    KV gets what is left: kv = available - (weights + activations + graph + headroom); the pool
    is floor(kv / block bytes) blocks. So with a fixed budget a smaller (quantized) weight
    footprint becomes KV capacity: weights + KV stays constant (seed 001, Qwen3-14B AWQ).
    Returns bytes, GiB, kv_num_blocks, kv_token_capacity (all blocks, as vLLM logs it) and
    max_concurrency (None without max_model_len).
    """
    need_int("available_bytes", available_bytes, 0)
    need_int("weight_bytes", weight_bytes, 0)
    need_int("activation_bytes", activation_bytes, 0)
    need_int("graph_reserve_bytes", graph_reserve_bytes, 0)
    need_int("headroom_bytes", headroom_bytes, 0)
    need_int("bytes_per_token", bytes_per_token, 1)
    need_int("block_size", block_size, 1)
    fixed = weight_bytes + activation_bytes + graph_reserve_bytes + headroom_bytes
    kv = available_bytes - fixed
    if kv <= 0:
        raise ValueError(
            f"weights + activations + graph reserve + headroom ({fixed / GiB:.4f} GiB) leave no "
            f"KV cache in available_bytes ({available_bytes / GiB:.4f} GiB); raise the budget "
            "or shrink the weights (quantize) or the reserves"
        )
    block_bytes = bytes_per_token * block_size
    blocks = kv // block_bytes
    conc = None if max_model_len is None else max_concurrency(blocks, block_size, max_model_len)
    return {
        "available_bytes": available_bytes,
        "weight_bytes": weight_bytes,
        "kv_cache_bytes": kv,
        "activation_bytes": activation_bytes,
        "graph_reserve_bytes": graph_reserve_bytes,
        "headroom_bytes": headroom_bytes,
        "weight_gib": weight_bytes / GiB,
        "kv_cache_gib": kv / GiB,
        "weight_plus_kv_gib": (weight_bytes + kv) / GiB,
        "kv_bytes_per_token": bytes_per_token,
        "kv_bytes_per_block": block_bytes,
        "kv_num_blocks": blocks,
        "kv_token_capacity": blocks * block_size,
        "max_concurrency": conc,
    }


QUANT_SCALE_BYTES = 4  # float32 scales (and int4 zeros), as workbench.layers.quantization stores


def quantized_weight_bytes(
    num_params: int,
    num_output_channels: int,
    quantization: str | None,
    group_size: int = 128,
    dtype_bytes: int = 2,
) -> int:
    """Bytes of linear-layer weights stored in `quantization`; sum the arguments over layers.

    num_params = sum of out x in, num_output_channels = sum of out (scale rows):

        None   num_params x dtype_bytes
        int8   num_params x 1 + num_output_channels x 4       int8 + f32 scale per row
        fp8    num_params x 1 + num_output_channels x 4       e4m3 + f32 scale per row
        int4   num_params / 2 + num_params / group_size x 8   2 per byte + f32 scale and zero
                                                              per group (every in % G == 0)

    Against bf16 (2 bytes) int4 at G=128 is 0.5625 / 2 = 28%, against fp32 14%. Embeddings,
    lm_head, norms and biases are not quantized: count them at dtype_bytes separately.
    """
    need_int("num_params", num_params, 0)
    need_int("num_output_channels", num_output_channels, 0)
    need_int("dtype_bytes", dtype_bytes, 1)
    if quantization is None:
        return num_params * dtype_bytes
    if quantization in ("int8", "fp8"):
        return num_params + num_output_channels * QUANT_SCALE_BYTES
    if quantization == "int4":
        need_int("group_size", group_size, 2)
        if num_params % group_size or group_size % 2:
            raise ValueError(
                f"num_params ({num_params}) must be a multiple of group_size ({group_size}), "
                "an even number: every layer's in_features divides by it"
            )
        return num_params // 2 + (num_params // group_size) * 2 * QUANT_SCALE_BYTES
    raise ValueError(
        f"quantization ({quantization!r}) must be None or one of 'int8', 'int4', 'fp8'"
    )


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    block_size: int,
    kv_cache_dtype: str = "auto",
    group_size: int | None = None,
    residual_tokens: int = 32,
    max_num_seqs: int = 256,
) -> dict[str, int | float]:
    """KV bytes per block and per token for any kv_cache_dtype (`workbench calc kv`).

    auto / fp8 / fp8_e4m3: `kv_bytes_per_block` (dtype_bytes, or 1 for fp8), no residual.
    int8 / int4 / int2 (KIVI): codes + float16 scales and zeros (`kivi_bytes_per_block`; keys
    per block and channel, values per token and `group_size` channels, default head_dim), and
    the full-precision residual pool, a fixed cost: `kivi_residual_slots(max_num_seqs,
    residual_tokens, block_size)` blocks at dtype_bytes. kv_bytes_per_token is
    bytes_per_block / block_size, a float when it does not divide; per layer likewise.
    """
    need_int("num_layers", num_layers, 1)
    need_int("block_size", block_size, 1)
    if kv_cache_dtype in KIVI_KV_BITS:
        g = head_dim if group_size is None else group_size
        bits = KIVI_KV_BITS[kv_cache_dtype]
        block = kivi_bytes_per_block(num_layers, num_kv_heads, head_dim, bits, block_size, g)
        codes = num_layers * 2 * block_size * num_kv_heads * head_dim * bits // 8
        slots = kivi_residual_slots(max_num_seqs, residual_tokens, block_size)
        residual = kivi_residual_bytes(num_layers, num_kv_heads, head_dim, dtype_bytes,
                                       block_size, slots)
    else:
        elem = kv_cache_dtype_bytes(kv_cache_dtype, dtype_bytes)
        block = codes = kv_bytes_per_block(num_layers, num_kv_heads, head_dim, elem, block_size)
        slots = residual = 0

    def per(n: int, d: int) -> int | float:
        return n // d if n % d == 0 else n / d

    return {
        "kv_bytes_per_block": block,
        "kv_bytes_per_token": per(block, block_size),
        "kv_bytes_per_token_per_layer": per(block, block_size * num_layers),
        "kv_scale_bytes_per_block": block - codes,  # scales and zero points (KIVI)
        "kv_residual_slots": slots,
        "kv_residual_bytes": residual,
    }
