"""Dequantizing matmuls for weight-only W8A16 and W4A16, each beside its plain-PyTorch twin.

    y [M, N] = x [M, K] @ dequant(W) [N, K].T (+ bias [N])

x is fp16/bf16/fp32 (leading dims are flattened here), the products accumulate in fp32 and y
comes back in x's dtype. The weight never exists in full precision in memory: each program
loads a [BLOCK_N, BLOCK_K] tile of the quantized weight, dequantizes it in registers and feeds
it to `tl.dot`. Formats (kernels/quant/int8.py and int4.py define them):

    int8   qweight int8 [N, K], scale f32 [N]         W' = q * scale[n]
    int4   qweight uint8 [N, K/2], scales, zeros f32 [N, K/G]
           W'[n, k] = q[n, k] * scales[n, k // G] + zeros[n, k // G]
           byte qweight[n, j] = q[n, 2j] | q[n, 2j + 1] << 4   (low nibble = even column)

Tiling (grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), one program per output tile):

            K ->  k0      k0+BLOCK_K
      x   [ ....|########|.... ]  BLOCK_M rows        acc[BLOCK_M, BLOCK_N] (fp32)
      W'  [ ....|########|.... ]  BLOCK_N rows          += x_tile @ W'_tile.T
                 one K tile per loop step

int4 groups and K tiles (the choice): BLOCK_K is the largest of 64, 32, 16 that divides the
group size G, so every K tile lies inside one group and the tile needs one scale and one zero
per output row (GROUP_ALIGNED). A group size none of them divides (G = 8, 24, ...), or a
caller's block_k that does not divide G, takes the general path (default BLOCK_K = 32): each of
the tile's columns looks up its own group, k // G, so a tile may straddle any number of groups.
Both paths are tested against the twin.

Precision: int8 applies the per-channel scale once, to the fp32 accumulator (x @ q.T) * scale,
as gpt-fast does; int4 rounds W' to x's dtype before the dot, as its twin does. fp32 inputs use
`input_precision="ieee"` (no TF32). Under TRITON_INTERPRET=1 (CPU) the dot operands are upcast
to fp32: products of fp16 values are exact in fp32, so this matches the GPU's fp16 dot up to
summation order (the interpreter computes bf16 wrongly, so CPU tests use fp32/fp16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.quant import int4, int8
from kernels.triton import INTERPRETED
from kernels.triton.paged_decode import interpret_triton_stdlib

interpret_triton_stdlib()  # triton may have been imported before TRITON_INTERPRET was set

SUPPORTED_DTYPES = int8.TRITON_DTYPES  # fp16, bf16, fp32 activations
_BLOCK_K_CHOICES = (64, 32, 16)  # tl.dot needs every tile dim >= 16


# --------------------------------------------------------------------------- plain-torch twins


def w8a16_matmul_torch(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference: dequantize to x's dtype, then F.linear (what Int8Method runs on CPU)."""
    return F.linear(x, int8.dequantize(qweight, scale, x.dtype), bias)


def w4a16_matmul_torch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference: dequantize to x's dtype, then F.linear (what Int4Method runs on CPU)."""
    _check_int4(x, qweight, scales, zeros, group_size)
    return F.linear(x, int4.dequantize(qweight, scales, zeros, x.dtype), bias)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _w8a16_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        # x tile [BLOCK_M, BLOCK_K]; masked lanes are 0 so they add nothing
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=m_ok[:, None] & k_ok[None, :], other=0.0,
        )
        # weight tile read transposed, [BLOCK_K, BLOCK_N]: q values -127..127 are exact in
        # fp16 and bf16, so converting them loses nothing; the scale comes after the loop
        q = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
            mask=k_ok[:, None] & n_ok[None, :], other=0,
        )
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), q.to(tl.float32), input_precision="ieee")
        else:
            acc = tl.dot(x, q.to(x.dtype), acc)
    # per-output-channel scale: sum_k x[m, k] q[n, k] s[n] = s[n] * (x @ q.T)[m, n]
    acc = acc * tl.load(scale_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn,
        acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :],
    )


@triton.jit
def _w4a16_kernel(
    x_ptr, qw_ptr, scales_ptr, zeros_ptr, bias_ptr, y_ptr,
    M, N, K, group_size,
    stride_xm, stride_xk, stride_qn, stride_qk, stride_sn, stride_sg, stride_ym, stride_yn,
    HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr, GROUP_ALIGNED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        # packed tile [BLOCK_N, BLOCK_K / 2]: byte j holds columns k0 + 2j (low) and k0 + 2j + 1
        offs_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(
            qw_ptr + offs_n[:, None] * stride_qn + offs_p[None, :] * stride_qk,
            mask=n_ok[:, None] & (offs_p < K // 2)[None, :], other=0,
        )
        # unpack in registers: interleaving (low, high) along the last dim puts each nibble
        # back at its column, [BLOCK_N, BLOCK_K] with q[:, 2j] = low[:, j], q[:, 2j+1] = high[:, j]
        q = tl.interleave(packed & 0xF, packed >> 4).to(tl.float32)
        if GROUP_ALIGNED:
            # the whole K tile sits in group k0 // G: one scale and zero per row
            g = k0 // group_size
            s = tl.load(scales_ptr + offs_n * stride_sn + g * stride_sg, mask=n_ok, other=0.0)
            z = tl.load(zeros_ptr + offs_n * stride_sn + g * stride_sg, mask=n_ok, other=0.0)
            w = q * s[:, None] + z[:, None]
        else:
            # the tile may straddle groups: each column looks up its own group k // G
            sz_offs = offs_n[:, None] * stride_sn + (offs_k // group_size)[None, :] * stride_sg
            sz_ok = n_ok[:, None] & k_ok[None, :]
            s = tl.load(scales_ptr + sz_offs, mask=sz_ok, other=0.0)
            z = tl.load(zeros_ptr + sz_offs, mask=sz_ok, other=0.0)
            w = q * s + z
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=m_ok[:, None] & k_ok[None, :], other=0.0,
        )
        w = w.to(x.dtype)  # W' in the activation dtype, as the twin's dequantize(..., x.dtype)
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn,
        acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :],
    )


# --------------------------------------------------------------------------- launchers


def w8a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """x [..., K] @ (qweight int8 [N, K] * scale f32 [N, None]).T (+ bias [N]) -> [..., N]."""
    _check_x(x, qweight)
    n, k = qweight.shape
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be int8 [N, K], got {qweight.dtype} {tuple(qweight.shape)}")
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features but qweight [N, K] has K = {k}")
    if tuple(scale.shape) != (n,):
        raise ValueError(f"scale must have shape ({n},), got {tuple(scale.shape)}")
    x2, y, bias, grid, (bm, bn, bk) = _prepare(x, n, bias, block_m, block_n, block_k)
    if x2.shape[0]:
        _w8a16_kernel[grid](
            x2, qweight, scale.contiguous(), bias if bias is not None else y, y,
            x2.shape[0], n, k,
            x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1),
            y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, DOT_FP32=_dot_fp32(x),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        )  # fmt: skip
    return y.reshape(*x.shape[:-1], n)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int | None = None,
) -> torch.Tensor:
    """x [..., K] @ W'.T (+ bias [N]) -> [..., N], W' the int4 dequantization of
    (qweight uint8 [N, K/2], scales, zeros f32 [N, K/group_size]). block_k defaults to the
    largest of 64/32/16 dividing group_size (one group per K tile), else 32 (straddling)."""
    _check_int4(x, qweight, scales, zeros, group_size)
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if block_k is None:
        block_k = next((b for b in _BLOCK_K_CHOICES if group_size % b == 0), 32)
    x2, y, bias, grid, (bm, bn, bk) = _prepare(x, n, bias, block_m, block_n, block_k)
    if x2.shape[0]:
        _w4a16_kernel[grid](
            x2, qweight, scales, zeros, bias if bias is not None else y, y,
            x2.shape[0], n, k, group_size,
            x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1),
            scales.stride(0), scales.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, DOT_FP32=_dot_fp32(x),
            GROUP_ALIGNED=group_size % bk == 0,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        )  # fmt: skip
    return y.reshape(*x.shape[:-1], n)


# --------------------------------------------------------------------------- helpers


def _dot_fp32(x: torch.Tensor) -> bool:
    """fp32 dot operands: for fp32 activations, and always under the interpreter."""
    return INTERPRETED or x.dtype == torch.float32


def _check_x(x: torch.Tensor, qweight: torch.Tensor) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"x dtype ({x.dtype}) is not supported; allowed: {allowed}")
    if x.device != qweight.device:
        raise ValueError(f"x is on {x.device} but the weight is on {qweight.device}")


def _check_int4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
) -> None:
    _check_x(x, qweight)
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(
            f"qweight must be uint8 [N, K/2], got {qweight.dtype} {tuple(qweight.shape)}"
        )
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features but qweight [N, K/2] has K = {k}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size ({group_size!r}) must be an integer >= 2")
    if k % group_size:
        raise ValueError(f"in_features ({k}) is not divisible by group_size ({group_size})")
    want = (n, k // group_size)
    for name, t in (("scales", scales), ("zeros", zeros)):
        if tuple(t.shape) != want:
            raise ValueError(
                f"{name} must have shape {want} for K = {k} and group_size = {group_size}, "
                f"got {tuple(t.shape)}"
            )


def _prepare(
    x: torch.Tensor,
    n: int,
    bias: torch.Tensor | None,
    block_m: int | None,
    block_n: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, int], tuple[int, ...]]:
    """Flatten x to [M, K], allocate y [M, N] in x's dtype, pick BLOCK_M and the grid."""
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    if block_m is None:  # decode batches are small: do not pad M far past the batch
        block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    for name, b in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} ({b}) must be a power of two >= 16")
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    return x2, y, bias, grid, (block_m, block_n, block_k)
