"""The KV cache's shape and memory arithmetic, the engine's half of the old `calc.py` (vLLM's
`cdiv` and `kv_cache_utils`): pure Python, no torch, beside the KV cache manager.

    cdiv(a, b)                       ceiling division
    KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes
    bytes per block    = KV bytes per token x block_size
    blocks             = floor(budget / bytes per block)     (the null block is one of them)
    max concurrency    = usable blocks / blocks one max_model_len request needs
    fp8 KV scale       = amax(|x|) / 448                     (e4m3's largest finite value)
    KV heads per rank  = kv_heads / tp (sharded) or 1 (replicated, tp > kv_heads)
    KIVI (int8/int4/int2) block bytes per layer = codes 2 x bs x kv_heads x head_dim x bits / 8
                       + key scale, zero (fp16) 2 x kv_heads x head_dim x 2   (per block)
                       + value scale, zero      2 x bs x kv_heads x head_dim / group x 2
                       plus a fixed full-precision residual pool (kivi_residual_bytes)

The worker sizes its KV tensors and the pool with these; the layers shard KV heads with them;
the attention backends scale an fp8 KV cache with them. The planning calculator
(`workbench.planning`, `workbench calc`) builds on them. Bad arguments raise ValueError naming
the argument and its value.
"""

from __future__ import annotations

import math

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value
KV_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1}  # "auto" = the model dtype's bytes
KIVI_KV_BITS = {"int8": 8, "int4": 4, "int2": 2}  # KIVI low-bit KV (kernels.quant.kv_kivi)
KIVI_SCALE_BYTES = 2  # float16 scales and zero points


def _need_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: -(-a // b)."""
    return -(-a // b)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """2 x num_layers x num_kv_heads x head_dim x dtype_bytes (K and V of every layer)."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("dtype_bytes", dtype_bytes)):
        _need_int(name, value, 1)
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, block_size: int
) -> int:
    """kv_bytes_per_token x block_size (an FP8 KV cache halves it against bf16)."""
    _need_int("block_size", block_size, 1)
    return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * block_size


def kv_cache_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per stored K/V element: the model dtype's for "auto", 1 for "fp8"/"fp8_e4m3".

    So an FP8 KV cache halves bytes per block against bf16/fp16 and quarters it against fp32
    (the per-layer k_scale/v_scale floats are not per block and are not counted).
    """
    _need_int("model_dtype_bytes", model_dtype_bytes, 1)
    if kv_cache_dtype == "auto":
        return model_dtype_bytes
    if kv_cache_dtype in KV_CACHE_DTYPE_BYTES:
        return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    if kv_cache_dtype in KIVI_KV_BITS:
        raise ValueError(
            f"kv_cache_dtype ({kv_cache_dtype!r}) stores less than a byte per element plus "
            "scales: use kivi_bytes_per_block"
        )
    raise ValueError(
        f"kv_cache_dtype ({kv_cache_dtype!r}) must be 'auto', 'fp8' or 'fp8_e4m3'"
    )


def kivi_bits(kv_cache_dtype: str) -> int:
    """8 / 4 / 2 for "int8" / "int4" / "int2"."""
    if kv_cache_dtype not in KIVI_KV_BITS:
        raise ValueError(
            f"kv_cache_dtype ({kv_cache_dtype!r}) must be one of 'int8', 'int4', 'int2'"
        )
    return KIVI_KV_BITS[kv_cache_dtype]


def kivi_bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, bits: int, block_size: int,
    group_size: int,
) -> int:
    """Bytes of one quantized KIVI block over all layers (see the module docstring): codes,
    per-channel key scales and zeros (one set per block), per-token value scales and zeros
    (one per `group_size` channels). Per token: divide by block_size."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("block_size", block_size),
                        ("group_size", group_size)):
        _need_int(name, value, 1)
    if bits not in (8, 4, 2) or head_dim % (8 // bits) or head_dim % group_size:
        raise ValueError(
            f"bits ({bits}) must be 8, 4 or 2 and head_dim ({head_dim}) a multiple of "
            f"{8 // bits if bits in (8, 4, 2) else '8 / bits'} and of group_size ({group_size})"
        )
    codes = 2 * block_size * num_kv_heads * head_dim * bits // 8
    key_meta = 2 * num_kv_heads * head_dim * KIVI_SCALE_BYTES
    value_meta = 2 * block_size * num_kv_heads * (head_dim // group_size) * KIVI_SCALE_BYTES
    return num_layers * (codes + key_meta + value_meta)


def kivi_residual_slots(max_num_seqs: int, residual_tokens: int, block_size: int) -> int:
    """Full-precision blocks the KIVI residual pool holds: max_num_seqs x (ceil(R / bs) + 2):
    per running request the block being filled and the ceil(R / bs) blocks of its last R
    tokens, plus one spare per request (blocks of preempted requests wait there until reused)."""
    _need_int("max_num_seqs", max_num_seqs, 1)
    _need_int("residual_tokens", residual_tokens, 0)
    _need_int("block_size", block_size, 1)
    return max_num_seqs * (cdiv(residual_tokens, block_size) + 2)


def kivi_residual_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, block_size: int,
    num_slots: int,
) -> int:
    """Bytes of the KIVI full-precision residual pool: num_slots blocks of K and V in the
    model dtype, per layer (a fixed cost, not per block of the quantized pool)."""
    _need_int("num_slots", num_slots, 0)
    return num_slots * kv_bytes_per_block(num_layers, num_kv_heads, head_dim, dtype_bytes,
                                          block_size)


def fp8_kv_scale(amax: float) -> float:
    """The calibrated scale of an FP8 KV cache: amax(|x|) / 448, so the largest value seen maps
    to e4m3's largest finite value (1.0 when amax is 0: nothing to scale). vLLM's
    calculate_kv_scales divides by K_SCALE_CONSTANT=200 / V_SCALE_CONSTANT=100 instead, leaving
    headroom for later, larger values; here later values beyond amax saturate at 448 x scale."""
    if isinstance(amax, bool) or not isinstance(amax, int | float) or not amax >= 0:
        raise ValueError(f"amax must be a number >= 0.0, got {amax!r}")
    if not math.isfinite(amax):
        raise ValueError(f"amax must be finite, got {amax!r}")
    return amax / FP8_E4M3_MAX if amax > 0 else 1.0


def tp_kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each TP rank stores: kv_heads / tp when tp divides them (sharded); 1 when
    tp > kv_heads and kv_heads divides tp (each head replicated tp / kv_heads times)."""
    _need_int("num_kv_heads", num_kv_heads, 1)
    _need_int("tp_size", tp_size, 1)
    if tp_size <= num_kv_heads and num_kv_heads % tp_size == 0:
        return num_kv_heads // tp_size
    if tp_size > num_kv_heads and tp_size % num_kv_heads == 0:
        return 1
    raise ValueError(
        f"num_kv_heads ({num_kv_heads}) and tp_size ({tp_size}): one must divide the other to "
        "shard (tp <= kv_heads) or replicate (tp > kv_heads) the KV heads"
    )


def num_blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """floor(budget_bytes / bytes_per_block); the null block included: it is a real block."""
    _need_int("budget_bytes", budget_bytes, 0)
    _need_int("bytes_per_block", bytes_per_block, 1)
    return budget_bytes // bytes_per_block


def budget_num_blocks(
    budget_bytes: int,
    weight_bytes: int,
    activation_bytes: int,
    reserve_bytes: int,
    bytes_per_block: int,
) -> int:
    """KV blocks (null block included) a whole-process budget leaves:
    floor((budget - weights - activation peak - reserve) / bytes_per_block), 0 when negative.

    Under a fixed budget, weights + KV + activations + reserve stays within one block of the
    budget, so every byte quantization takes off the weights (or an FP8 KV cache takes off each
    block) comes back as KV capacity (seed 001)."""
    for name, value in (("budget_bytes", budget_bytes), ("weight_bytes", weight_bytes),
                        ("activation_bytes", activation_bytes),
                        ("reserve_bytes", reserve_bytes)):
        _need_int(name, value, 0)
    _need_int("bytes_per_block", bytes_per_block, 1)
    return max(0, budget_bytes - weight_bytes - activation_bytes - reserve_bytes) // bytes_per_block


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): prompt and output fill one block table left to right."""
    _need_int("num_tokens", num_tokens, 0)
    _need_int("block_size", block_size, 1)
    return cdiv(num_tokens, block_size)


def max_concurrency(num_usable_blocks: int, block_size: int, max_model_len: int) -> float:
    """num_usable_blocks / ceil(max_model_len / block_size): max_model_len-long requests held."""
    _need_int("num_usable_blocks", num_usable_blocks, 0)
    _need_int("max_model_len", max_model_len, 1)
    return num_usable_blocks / blocks_needed(max_model_len, block_size)
