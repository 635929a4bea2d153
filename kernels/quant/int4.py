"""int4 W4A16: 4-bit weights, asymmetric per group of `group_size` input features.

    group k of row o:  W[o, k*G : (k+1)*G]                 (G = group_size, in % G == 0)
    scale[o, k] = (max - min) / 15                         (1 for a constant group)
    zero[o, k]  = min                                      the value q = 0 stands for
    q           = clamp(round((W - zero) / scale), 0, 15)
    W'          = q * scale + zero                         so |W - W'| <= (max - min) / 30

Scales and zeros are float32 [out, in / G] (a float zero, as gpt-fast's int4 keeps it, so a
group that does not straddle 0 loses nothing). Two values per byte, along the input dim:

    qweight[o, j] = q[o, 2j] | q[o, 2j + 1] << 4           low nibble = even column
    q row [3, 10, 0, 15, 1, 2]  ->  bytes [0xA3, 0xF0, 0x21]

Storage per layer: out * in / 2 bytes + 8 * out * in / G bytes (scales + zeros).
"""

from __future__ import annotations

import torch

QMAX = 15
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # activations the kernel takes


def check_group_size_value(group_size: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or (
        group_size % 2
    ):
        raise ValueError(f"group_size ({group_size!r}) must be an even integer >= 2")


def check_group_size(in_features: int, group_size: int) -> None:
    check_group_size_value(group_size)
    if in_features % group_size:
        raise ValueError(
            f"in_features ({in_features}) is not divisible by group_size ({group_size})"
        )


def pack(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [out, in] with values 0..15 (in even) -> uint8 [out, in / 2], low nibble first."""
    if q.shape[-1] % 2:
        raise ValueError(f"in_features ({q.shape[-1]}) must be even to pack two per byte")
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in / 2] -> uint8 [out, in] (the inverse of `pack`)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def quantize(
    w: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] -> (qweight uint8 [out, in/2], scales f32 [out, in/G], zeros f32 [out, in/G])."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    check_group_size(in_f, group_size)
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scales = torch.where(hi > lo, (hi - lo) / QMAX, torch.ones_like(lo))
    zeros = lo
    q = torch.round((g - zeros[..., None]) / scales[..., None]).clamp_(0, QMAX)
    return pack(q.reshape(out_f, in_f).to(torch.uint8)), scales, zeros


def dequantize(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """q * scale + zero per group, computed in float32 and cast to `dtype`; [out, in]."""
    q = unpack(qweight).float()
    out_f, in_f = q.shape
    num_groups = scales.shape[-1]
    g = q.reshape(out_f, num_groups, in_f // num_groups)
    return (g * scales[..., None] + zeros[..., None]).reshape(out_f, in_f).to(dtype)
