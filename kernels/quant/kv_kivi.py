"""KIVI low-bit KV blocks in plain PyTorch: layout, pack/unpack, quantize and dequantize.

The torch twin of the paged-decode kernels' KIVI path (`kernels.cpu.paged_decode`,
`kernels.triton.paged_decode`) and the write path of `workbench.attention.kivi_cache`.
KIVI (Liu et al. 2024) quantizes keys per channel and values per token, asymmetrically
(a scale and a zero point, min/max), b = 8, 4 or 2 bits:

    keys    one group = one block of block_size tokens, per KV head, per channel:
            k_scale, k_zero [num_blocks, Hkv, D]        (the block's tokens share them)
    values  one group = one token, per KV head, per `group_size` channels:
            v_scale, v_zero [num_blocks, block_size, Hkv, D / group_size]

    zero  = min, rounded down to float16                 (so zero <= every value)
    scale = (max - zero) / (2^b - 1), rounded up to float16   (so max fits)
    q     = clamp(round((x - zero) / scale), 0, 2^b - 1)      (0 when scale is 0)
    x'    = q * scale + zero  (float32)   =>   |x - x'| <= scale / 2 (+ fp32 rounding)

Codes are packed along the head dim, 8 / b per byte, the lowest bits first:

    int4: byte[j] = q[2j] | q[2j+1] << 4           int2: byte[j] = q[4j] | q[4j+1] << 2 | ...
    int8: byte[j] = q[j]

Bytes of one block (all KV heads, one layer), float16 scales and zeros:

    K and V codes     2 x block_size x Hkv x D x b / 8
    K scale + zero    2 x Hkv x D x 2                     (per block: / block_size per token)
    V scale + zero    2 x block_size x Hkv x (D / group_size) x 2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KIVI_BITS = {"int8": 8, "int4": 4, "int2": 2}
SCALE_DTYPE = torch.float16  # scales and zero points, as KIVI keeps them
SCALE_BYTES = 2


@dataclass(frozen=True)
class KiviLayout:
    """The shape of one layer's quantized blocks."""

    bits: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    group_size: int  # value channels per scale / zero (divides head_dim)

    def __post_init__(self) -> None:
        if self.bits not in (8, 4, 2):
            raise ValueError(f"bits ({self.bits}) must be 8, 4 or 2")
        if self.head_dim % (8 // self.bits):
            raise ValueError(
                f"head_dim ({self.head_dim}) must be a multiple of {8 // self.bits} to pack "
                f"{self.bits}-bit codes {8 // self.bits} per byte"
            )
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 1 or self.head_dim % g:
            raise ValueError(
                f"kv_quant_group_size ({g!r}) must be a positive divisor of head_dim "
                f"({self.head_dim})"
            )

    @property
    def per_byte(self) -> int:
        return 8 // self.bits

    @property
    def packed_dim(self) -> int:
        return self.head_dim // self.per_byte

    @property
    def levels(self) -> int:
        return (1 << self.bits) - 1

    @property
    def num_groups(self) -> int:
        return self.head_dim // self.group_size

    def code_bytes(self) -> int:
        """K and V codes of one block."""
        return 2 * self.block_size * self.num_kv_heads * self.packed_dim

    def key_meta_bytes(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * SCALE_BYTES

    def value_meta_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.num_groups * SCALE_BYTES

    def block_bytes(self) -> int:
        """Bytes of one quantized block of one layer (codes + scales + zeros)."""
        return self.code_bytes() + self.key_meta_bytes() + self.value_meta_bytes()


# ---------------------------------------------------------------------------- pack / unpack
def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., D] (each < 2^bits) -> uint8 [..., D * bits / 8], lowest bits first."""
    per = 8 // bits
    if per == 1:
        return q.to(torch.uint8)
    q = q.to(torch.uint8).reshape(*q.shape[:-1], q.shape[-1] // per, per)
    out = q[..., 0].clone()
    for i in range(1, per):
        out |= q[..., i] << (bits * i)
    return out


def unpack(p: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., Dp] -> uint8 codes [..., Dp * 8 / bits] (the inverse of `pack`)."""
    per = 8 // bits
    if per == 1:
        return p
    mask = (1 << bits) - 1
    parts = [(p >> (bits * i)) & mask for i in range(per)]
    return torch.stack(parts, dim=-1).view(*p.shape[:-1], p.shape[-1] * per)


# ---------------------------------------------------------------------------- scales
def half_toward(x: torch.Tensor, down: bool) -> torch.Tensor:
    """float32 -> float16 rounded toward -inf (down) or +inf (up) instead of to nearest
    (finite inputs within float16's range)."""
    h = x.to(SCALE_DTYPE)
    hf = h.float()
    wrong = hf > x if down else hf < x
    if not bool(wrong.any()):
        return h
    bits = h.view(torch.int16).to(torch.int32)
    # float16 bits are sign-magnitude: as int16 a negative value's pattern is negative, and
    # +-1 on the pattern moves one ulp away from / toward zero.
    neg = bits < 0
    if down:  # one ulp toward -inf: smaller magnitude if positive, larger if negative
        step = torch.where(neg, bits + 1, bits - 1)
        step = torch.where(hf == 0, torch.full_like(bits, -32767), step)  # -> -min subnormal
    else:
        step = torch.where(neg, bits - 1, bits + 1)
        step = torch.where(hf == 0, torch.ones_like(bits), step)  # -> +min subnormal
    fixed = step.to(torch.int16).view(SCALE_DTYPE)
    return torch.where(wrong, fixed, h)


def quant_params(
    lo: torch.Tensor, hi: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) float16 for groups with minimum `lo` and maximum `hi` (float32): zero = lo
    rounded down, scale = (hi - zero) / (2^bits - 1) rounded up."""
    zero = half_toward(lo.float(), down=True)
    span = (hi.float() - zero.float()).clamp_(min=0)
    scale = half_toward(span / ((1 << bits) - 1), down=False)
    return scale, zero


def quantize_codes(
    x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int
) -> torch.Tensor:
    """clamp(round((x - zero) / scale), 0, 2^bits - 1) as uint8 (0 where scale is 0); scale and
    zero broadcast against x."""
    s = scale.float()
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = ((x.float() - zero.float()) / safe).round_().clamp_(0, (1 << bits) - 1)
    q = torch.where(s > 0, q, torch.zeros_like(q))
    return q.to(torch.uint8)


def dequantize_codes(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """q * scale + zero in float32 (scale and zero broadcast against q)."""
    return q.float().mul_(scale.float()).add_(zero.float())


# ---------------------------------------------------------------------------- keys
def quantize_keys(
    k: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full blocks of keys [n, block_size, Hkv, D] -> (codes [n, block_size, Hkv, D*b/8] uint8,
    scale [n, Hkv, D], zero [n, Hkv, D] float16): per block, head and channel (KIVI's
    per-channel keys, the block being the token group)."""
    kf = k.float()
    scale, zero = quant_params(kf.amin(dim=1), kf.amax(dim=1), bits)
    q = quantize_codes(kf, scale[:, None], zero[:, None], bits)
    return pack(q, bits), scale, zero


def dequantize_keys(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int
) -> torch.Tensor:
    """(codes [n, bs, Hkv, Dp], scale/zero [n, Hkv, D]) -> float32 keys [n, bs, Hkv, D]."""
    return dequantize_codes(unpack(codes, bits), scale[:, None], zero[:, None])


# ---------------------------------------------------------------------------- values
def quantize_values(
    v: torch.Tensor, bits: int, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Value rows [..., Hkv, D] -> (codes [..., Hkv, D*b/8] uint8, scale [..., Hkv, D/G],
    zero [..., Hkv, D/G] float16): per token, head and group of G channels."""
    d = v.shape[-1]
    vf = v.float().reshape(*v.shape[:-1], d // group_size, group_size)
    scale, zero = quant_params(vf.amin(dim=-1), vf.amax(dim=-1), bits)
    q = quantize_codes(vf, scale[..., None], zero[..., None], bits).reshape(v.shape)
    return pack(q, bits), scale, zero


def dequantize_values(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int
) -> torch.Tensor:
    """(codes [..., Hkv, Dp], scale/zero [..., Hkv, D/G]) -> float32 values [..., Hkv, D]."""
    q = unpack(codes, bits)
    d, ng = q.shape[-1], scale.shape[-1]
    q = q.reshape(*q.shape[:-1], ng, d // ng)
    return dequantize_codes(q, scale[..., None], zero[..., None]).reshape(*q.shape[:-2], d)
