"""KV transfer against prefill recompute, with link and GPU presets.

A KV cache tier (host memory, another GPU, a store shared by replicas) pays off when moving a
prefix's KV is faster than computing it again (seed 003, PD disaggregation and shared pools:
"80 layers, 8 KV heads, head_dim 128, FP16: about 320 KB per token; an 8K prompt about
2.6 GB; over a 400 Gb/s link (about 50 GB/s) a little over 50 ms; fine against a prefill of
hundreds of ms, but on short prompts the transfer overhead eats the gain").

  transfer_s  = KV bytes / bandwidth + latency
  prefill     = 2 x params x n                      (every token through every weight)
              + 4 x layers x heads x head_dim x n(n+1)/2   (causal QK^T and AV: pairs)
  recompute_s = prefill FLOPs / (peak FLOP/s x efficiency)

Recompute grows as n^2 and transfer as n, so past a break-even length the transfer wins.
"""

from __future__ import annotations

import math
from typing import TypedDict

from workbench.core.kv_cache.utils import kv_bytes_per_token
from workbench.planning.checks import need_int, need_num, need_pos


def _pcie_x16(gt_per_s: float) -> float:
    """Bytes/s one way of a x16 PCIe link at `gt_per_s` with 128b/130b encoding."""
    return gt_per_s * 16 * 128 / 130 / 8


# Link presets: bandwidth one way in bytes/s (theoretical peaks; measured copies get less).
LINKS: dict[str, tuple[float, str]] = {
    "pcie4-x16": (_pcie_x16(16e9), "PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8, one way"),
    "pcie5-x16": (_pcie_x16(32e9), "PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 / 8, one way"),
    "nvlink-h100": (450e9, "NVLink 4, H100 SXM: 900 GB/s total = 450 GB/s each way"),
    "nvlink-h200": (450e9, "NVLink 4, H200 SXM: 900 GB/s total = 450 GB/s each way"),
    "100gbe": (12.5e9, "100 Gb/s Ethernet (or IB EDR-class NIC) line rate / 8"),
    "400gbe": (50e9, "400 Gb/s Ethernet (or IB NDR NIC) line rate / 8: seed 003's 50 GB/s"),
    "host-dram": (153.6e9, "host memcpy bound: 8 x DDR5-4800 channels (38.4 GB/s each) / 2, "
                           "a copy reads and writes every byte"),
}


# Dense BF16/FP16 tensor-core peaks in FLOP/s (the datasheets' "with sparsity" figure / 2).
GPU_PEAK_FLOPS: dict[str, float] = {"h100-sxm": 989e12, "h200": 989e12, "a100": 312e12}


DEFAULT_EFFICIENCY = 0.5  # prefill MFU: the share of the peak a long prefill sustains


def link_bandwidth(name: str) -> float:
    """The preset link's one-way bandwidth in bytes/s (LINKS)."""
    if name not in LINKS:
        raise ValueError(f"link ({name!r}) must be one of {sorted(LINKS)}")
    return LINKS[name][0]


def gpu_peak_flops(name: str) -> float:
    """The preset GPU's dense BF16 peak in FLOP/s (GPU_PEAK_FLOPS)."""
    if name not in GPU_PEAK_FLOPS:
        raise ValueError(f"gpu ({name!r}) must be one of {sorted(GPU_PEAK_FLOPS)}")
    return GPU_PEAK_FLOPS[name]


def kv_transfer_time_s(kv_bytes: float, bandwidth_bytes_per_s: float,
                       latency_s: float = 0.0) -> float:
    """kv_bytes / bandwidth + latency (a fixed per-transfer cost: setup, lookup, round trip)."""
    need_num("kv_bytes", kv_bytes, 0.0)
    need_pos("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    need_num("latency_s", latency_s, 0.0)
    return kv_bytes / bandwidth_bytes_per_s + latency_s


def prefill_flops(num_params: float, prompt_tokens: int, num_layers: int, num_heads: int,
                  head_dim: int) -> dict[str, float]:
    """FLOPs to prefill `prompt_tokens` from nothing: linear = 2 x num_params x n (num_params:
    the weights every token multiplies, embeddings left out); attention = 4 x layers x
    heads x head_dim x n(n+1)/2 (QK^T and AV over the causal pairs). Returns linear,
    attention and total."""
    need_pos("num_params", num_params)
    need_int("prompt_tokens", prompt_tokens, 1)
    for name, value in (("num_layers", num_layers), ("num_heads", num_heads),
                        ("head_dim", head_dim)):
        need_int(name, value, 1)
    linear = 2.0 * num_params * prompt_tokens
    attention = 4.0 * num_layers * num_heads * head_dim * prompt_tokens * (prompt_tokens + 1) / 2
    return {"linear": linear, "attention": attention, "total": linear + attention}


class BreakEven(TypedDict):
    """`kv_transfer_break_even`'s answer (a dict, typed)."""

    kv_bytes_per_token: int
    kv_bytes: int
    transfer_s: float
    linear_flops: float
    attention_flops: float
    prefill_flops: float
    recompute_s: float
    winner: str  # "transfer", "recompute" or "tie"
    speedup: float  # recompute_s / transfer_s
    break_even_bandwidth_bytes_per_s: float
    break_even_tokens: float


def kv_transfer_break_even(
    *,
    num_layers: int,
    num_kv_heads: int,
    num_heads: int,
    head_dim: int,
    dtype_bytes: int,
    num_params: float,
    prompt_tokens: int,
    bandwidth_bytes_per_s: float,
    peak_flops: float,
    efficiency: float = DEFAULT_EFFICIENCY,
    latency_s: float = 0.0,
) -> BreakEven:
    """Moving a `prompt_tokens` prefix's KV over a link against prefilling it again.

    Returns kv_bytes_per_token, kv_bytes, transfer_s, linear_flops, attention_flops,
    prefill_flops, recompute_s, winner ("transfer", "recompute" or "tie"), speedup
    (recompute_s / transfer_s), break_even_bandwidth_bytes_per_s (the slowest link for
    which the transfer still wins at this length; inf when latency alone exceeds the
    recompute) and break_even_tokens (the prompt length above which the transfer wins at this
    bandwidth: the positive root of recompute(n) = transfer(n); 0 when it wins at any length).
    """
    need_int("num_kv_heads", num_kv_heads, 1)
    need_int("num_heads", num_heads, 1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads}): each KV head serves num_heads / num_kv_heads")
    per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)
    flops = prefill_flops(num_params, prompt_tokens, num_layers, num_heads, head_dim)
    need_pos("peak_flops", peak_flops)
    if isinstance(efficiency, bool) or not isinstance(efficiency, int | float) or not (
            0 < efficiency <= 1):
        raise ValueError("efficiency must be a number in (0, 1] (the share of the peak FLOP/s "
                         f"a prefill sustains), got {efficiency!r}")
    kv = per_token * prompt_tokens
    transfer = kv_transfer_time_s(kv, bandwidth_bytes_per_s, latency_s)
    rate = peak_flops * efficiency
    recompute = flops["total"] / rate
    compute_left = recompute - latency_s
    # recompute(n) - transfer(n) = a n^2 + b n - latency; transfer wins above its root
    a = 2.0 * num_layers * num_heads * head_dim / rate
    b = 2.0 * num_params / rate + a - per_token / bandwidth_bytes_per_s
    root = (-b + math.sqrt(b * b + 4 * a * latency_s)) / (2 * a)
    winner = "tie" if math.isclose(transfer, recompute, rel_tol=1e-12) else (
        "transfer" if transfer < recompute else "recompute")
    return {
        "kv_bytes_per_token": per_token,
        "kv_bytes": kv,
        "transfer_s": transfer,
        "linear_flops": flops["linear"],
        "attention_flops": flops["attention"],
        "prefill_flops": flops["total"],
        "recompute_s": recompute,
        "winner": winner,
        "speedup": recompute / transfer if transfer > 0 else math.inf,
        "break_even_bandwidth_bytes_per_s": kv / compute_left if compute_left > 0 else math.inf,
        "break_even_tokens": root,
    }
