"""reshape_and_cache: write each new token's K and V rows into the paged KV cache (vLLM's name).

The flat batch's token t goes to slot slot_mapping[t] = block * block_size + offset:

    key [T, Hkv, D]                  key_cache [num_blocks, block_size, Hkv, D]
      t=0 ──slot 37──────────────▶     block 2 (37 // 16), offset 5 (37 % 16)
      t=1 ──slot -1 (padding)──╳       nothing written: the old contents stay
      t=2 ──slot 80──────────────▶     block 5, offset 0

One Triton program per token copies all of its KV heads ([Hkv, D] for K, then for V).
FP8 cache (dtype float8_e4m3fn): the stored value is e4m3(clamp(x / scale, -448, 448)), round to
nearest even, with the layer's k_scale / v_scale read by the kernel from 1-element float32
device tensors (so a CUDA graph that captured the launch sees later scale updates). The division
is IEEE (`tl.div_rn`, like torch's) and the rounding is spelled out in `round_to_e4m3` before the
cast: Triton's interpreter truncates in fp32 -> fp8 casts, so the CPU tests could not otherwise
check the bytes against torch; on a GPU the final cast of an already-rounded value is exact.

`reshape_and_cache_ref` is the plain-PyTorch twin: it defines what the kernel must write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value (core/kv_cache/utils.FP8_E4M3_MAX)
FP8_DTYPE = torch.float8_e4m3fn


@triton.jit
def round_to_e4m3(x):
    """fp32 x with |x| <= 448 -> the nearest float8_e4m3fn value, ties to even, still as fp32.

    e4m3 keeps 3 mantissa bits: for |x| >= 2^-6 (normal) drop the low 20 of fp32's 23 mantissa
    bits with round-half-to-even (the carry may bump the exponent, which is right); below 2^-6
    the grid is the subnormal step 2^-9, rounded with the add-and-subtract-1.5*2^23 trick.
    """
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    a = tl.abs(x)
    bits = a.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0xFFF00000).to(tl.float32, bitcast=True)
    subnormal = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
    rounded = tl.where(a < 0.015625, subnormal, normal)
    return (rounded.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [T, Hkv, D]
    value_ptr,  # [T, Hkv, D]
    key_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    value_cache_ptr,  # same shape and strides as key_cache
    slot_mapping_ptr,  # [T] int, -1 = padding
    k_scale_ptr,  # [1] float32 (read only when IS_FP8)
    v_scale_ptr,
    stride_k_tok, stride_k_head, stride_k_d,
    stride_v_tok, stride_v_head, stride_v_d,
    stride_c_block, stride_c_slot, stride_c_head, stride_c_d,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,  # next power of two >= NUM_KV_HEADS (tl.arange needs one)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    IS_FP8: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:  # a padding token: write nothing
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    cache_offs = (
        block * stride_c_block + offset * stride_c_slot
        + heads[:, None] * stride_c_head + dims[None, :] * stride_c_d
    )  # fmt: skip
    row = heads[:, None]
    col = dims[None, :]
    k = tl.load(key_ptr + tok * stride_k_tok + row * stride_k_head + col * stride_k_d, mask=mask)
    v = tl.load(value_ptr + tok * stride_v_tok + row * stride_v_head + col * stride_v_d, mask=mask)
    if IS_FP8:  # e4m3(clamp(x / scale, -448, 448)), the division IEEE-rounded like torch's
        k = tl.clamp(tl.div_rn(k.to(tl.float32), tl.load(k_scale_ptr)), -448.0, 448.0)
        v = tl.clamp(tl.div_rn(v.to(tl.float32), tl.load(v_scale_ptr)), -448.0, 448.0)
        k = round_to_e4m3(k)
        v = round_to_e4m3(v)
    tl.store(key_cache_ptr + cache_offs, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + cache_offs, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def _check(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(
            f"key {tuple(key.shape)} and value {tuple(value.shape)} must both be [T, Hkv, D]"
        )
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} must "
            "both be [num_blocks, block_size, Hkv, D]"
        )
    if key_cache.stride() != value_cache.stride() or key_cache.dtype != value_cache.dtype:
        raise ValueError("key_cache and value_cache must have the same strides and dtype")
    if tuple(key.shape[1:]) != tuple(key_cache.shape[2:]):
        raise ValueError(
            f"key rows [Hkv, D] = {list(key.shape[1:])} do not match the cache's "
            f"{list(key_cache.shape[2:])}"
        )
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping {tuple(slot_mapping.shape)} must be [T] with T = {key.shape[0]}"
        )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """key/value [T, Hkv, D] -> key_cache/value_cache [num_blocks, block_size, Hkv, D] at
    slot_mapping[t] (-1 = skip). An fp8 cache needs k_scale / v_scale: 1-element float32
    tensors on the cache's device. No host sync, grid = (T,): capturable in a CUDA graph."""
    _check(key, value, key_cache, value_cache, slot_mapping)
    is_fp8 = key_cache.dtype == FP8_DTYPE
    if is_fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale (1-element float32 tensors)")
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    # Unused pointers when not fp8 (IS_FP8 compiles the loads away): any tensor will do.
    k_scale_arg = k_scale if k_scale is not None else slot_mapping
    v_scale_arg = v_scale if v_scale is not None else slot_mapping
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, k_scale_arg, v_scale_arg,
        *key.stride(), *value.stride(), *key_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=key_cache.shape[1],
        IS_FP8=is_fp8,
    )  # fmt: skip


def quantize_fp8_ref(x: torch.Tensor, scale: float) -> torch.Tensor:
    """e4m3(clamp(float(x) / scale, -448, 448)): the FP8 KV numerics (round to nearest even)."""
    return (x.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)


def reshape_and_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> None:
    """The twin: cache.view(-1, Hkv, D)[slot_mapping[t]] = key[t] for every t with a slot >= 0
    (quantized with the layer's scale for an fp8 cache; 1.0 when a scale is None)."""
    _check(key, value, key_cache, value_cache, slot_mapping)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    for cache, new, scale in ((key_cache, key, k_scale), (value_cache, value, v_scale)):
        flat = cache.view(-1, *cache.shape[2:])  # [num_blocks * block_size, Hkv, D]
        rows = new[valid]
        if cache.dtype == FP8_DTYPE:
            s = 1.0 if scale is None else float(scale)
            # CPU torch has no fp8 index_put_: write the bytes through uint8 views
            flat.view(torch.uint8)[slots] = quantize_fp8_ref(rows, s).view(torch.uint8)
        else:
            flat[slots] = rows.to(cache.dtype)
