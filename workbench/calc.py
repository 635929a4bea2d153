"""Serving arithmetic: KV memory, blocks, prefix hits, forward passes, speculation, TP, KV
transfer vs recompute, the prefill:decode split of a disaggregated deployment.

Pure Python, no torch: the engine sizes its KV pool with these functions and `workbench calc`
prints them. Units are in the names (`_bytes`, `_tokens`, `_s`). Formulas follow the seeds
(`/work/shared/seeds`, 000 quiz, 001 method chapter, 002 n-gram speculation report, 003
lecture notes):

    KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes
    bytes per block    = KV bytes per token x block_size
    max concurrency    = KV pool blocks / blocks one max_model_len request needs
    device memory      = weights + KV + activations + graph reserve + headroom
    KV transfer        = KV bytes / link bandwidth + latency, against
    prefill recompute  = (2 x params x n + 2 x layers x heads x head_dim x n(n+1)) / (peak x MFU)
    workload roofline  = sum over the engine's steps of max(FLOPs / peak, bytes / bandwidth)
                         (`schedule_roofline`, from workbench.roofline_schedule)

Bad arguments raise ValueError naming the argument and its value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# re-exported: the schedule-aware roofline of a whole workload (per step max(FLOPs / peak,
# bytes / bandwidth) over the engine's continuous-batching schedule), a leaf of its own
from workbench.roofline_schedule import DecoderShape as DecoderShape
from workbench.roofline_schedule import ScheduleRoofline as ScheduleRoofline
from workbench.roofline_schedule import StepCost as StepCost
from workbench.roofline_schedule import schedule_roofline as schedule_roofline

GiB = 1 << 30


def _need_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _need_num(name: str, value: float, low: float, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        bound = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: -(-a // b)."""
    return -(-a // b)


# ------------------------------------------------------------------ KV memory and blocks
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


def num_blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """floor(budget_bytes / bytes_per_block); the null block included: it is a real block."""
    _need_int("budget_bytes", budget_bytes, 0)
    _need_int("bytes_per_block", bytes_per_block, 1)
    return budget_bytes // bytes_per_block


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): prompt and output fill one block table left to right."""
    _need_int("num_tokens", num_tokens, 0)
    _need_int("block_size", block_size, 1)
    return cdiv(num_tokens, block_size)


def blocks_per_request(num_tokens: int, block_size: int) -> int:
    """Same as `blocks_needed` (the name the engine imports)."""
    return blocks_needed(num_tokens, block_size)


def last_block_free_slots(num_tokens: int, block_size: int) -> int:
    """blocks_needed x block_size - num_tokens: the empty slots (not the filled ones) at the end."""
    return blocks_needed(num_tokens, block_size) * block_size - num_tokens


def kv_token_capacity(num_blocks: int, block_size: int) -> int:
    """num_blocks x block_size (vLLM's "GPU KV cache size: N tokens" counts every block)."""
    _need_int("num_blocks", num_blocks, 0)
    _need_int("block_size", block_size, 1)
    return num_blocks * block_size


def max_concurrency(num_usable_blocks: int, block_size: int, max_model_len: int) -> float:
    """num_usable_blocks / ceil(max_model_len / block_size): max_model_len-long requests held."""
    _need_int("num_usable_blocks", num_usable_blocks, 0)
    _need_int("max_model_len", max_model_len, 1)
    return num_usable_blocks / blocks_needed(max_model_len, block_size)


def theoretical_concurrency(kv_token_capacity_tokens: int, tokens_per_active_request: int) -> int:
    """floor(kv_token_capacity / tokens_per_active_request): an upper bound, not a promise."""
    _need_int("kv_token_capacity_tokens", kv_token_capacity_tokens, 0)
    _need_int("tokens_per_active_request", tokens_per_active_request, 1)
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
    _need_int("shared_prefix_tokens", shared_prefix_tokens, 0)
    _need_int("block_size", block_size, 1)
    full = shared_prefix_tokens // block_size
    if prompt_tokens is not None:
        _need_int("prompt_tokens", prompt_tokens, 1)
        if shared_prefix_tokens > prompt_tokens:
            raise ValueError(
                f"shared_prefix_tokens ({shared_prefix_tokens}) cannot exceed prompt_tokens "
                f"({prompt_tokens})"
            )
        full = min(full, (prompt_tokens - 1) // block_size)
    return full * block_size


# ------------------------------------------------------------------ memory budget
def weight_bytes(num_params: int, bytes_per_param: float) -> int:
    """ceil(num_params x bytes_per_param): 14B at bf16 (2) is 28 GB, at 4 bit (0.5) 7 GB."""
    _need_int("num_params", num_params, 0)
    _need_num("bytes_per_param", bytes_per_param, 0.0)
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
    _need_int("available_bytes", available_bytes, 0)
    _need_int("weight_bytes", weight_bytes, 0)
    _need_int("activation_bytes", activation_bytes, 0)
    _need_int("graph_reserve_bytes", graph_reserve_bytes, 0)
    _need_int("headroom_bytes", headroom_bytes, 0)
    _need_int("bytes_per_token", bytes_per_token, 1)
    _need_int("block_size", block_size, 1)
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


# ------------------------------------------------------------------ passes and roofline
def forward_passes(prompt_tokens: int, output_tokens: int, max_num_batched_tokens: int) -> int:
    """ceil(prompt / budget) prefill chunks + (output_tokens - 1) decode passes.

    The last prefill chunk emits the first output token, so 300 outputs after a prompt that fits
    the budget take 300 passes, not 301. One request alone (decodes of others share the budget).
    """
    _need_int("prompt_tokens", prompt_tokens, 1)
    _need_int("output_tokens", output_tokens, 1)
    _need_int("max_num_batched_tokens", max_num_batched_tokens, 1)
    return cdiv(prompt_tokens, max_num_batched_tokens) + output_tokens - 1


def decode_step_lower_bound_s(
    weight_bytes: float, kv_bytes: float, bandwidth_bytes_per_s: float
) -> float:
    """(weight_bytes + kv_bytes) / bandwidth: decode is memory-bound; weights are read once per
    step for the whole batch, KV once per request. Under TP use per-card bytes and bandwidth
    (or totals for both)."""
    _need_num("weight_bytes", weight_bytes, 0.0)
    _need_num("kv_bytes", kv_bytes, 0.0)
    _need_num("bandwidth_bytes_per_s", bandwidth_bytes_per_s, 0.0)
    if bandwidth_bytes_per_s == 0:
        raise ValueError("bandwidth_bytes_per_s must be > 0, got 0")
    return (weight_bytes + kv_bytes) / bandwidth_bytes_per_s


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


def scaling_efficiency(throughput_n: float, throughput_1: float, n: int) -> float:
    """throughput_n / (n x throughput_1): how much of n independent replicas' ideal linear
    speed-up a deployment keeps (1.0 = linear; seeds 001 step 08 and 003). Throughputs in the
    same unit (e.g. output tok/s) measured on the same workload."""
    _need_num("throughput_n", throughput_n, 0.0)
    _need_num("throughput_1", throughput_1, 0.0)
    _need_int("n", n, 1)
    if throughput_1 == 0:
        raise ValueError("throughput_1 must be > 0 (the single-replica baseline), got 0")
    if not math.isfinite(throughput_n) or not math.isfinite(throughput_1):
        raise ValueError(f"throughputs must be finite, got {throughput_n!r} and {throughput_1!r}")
    return throughput_n / (n * throughput_1)


# ------------------------------------------------------------------ speculative decoding
def spec_acceptance_prob(p_target: float, q_draft: float) -> float:
    """min(1, p/q); on rejection resample from norm(max(0, p - q)), so the output is lossless."""
    _need_num("p_target", p_target, 0.0, 1.0)
    _need_num("q_draft", q_draft, 0.0, 1.0)
    if q_draft == 0:
        raise ValueError("q_draft must be > 0 (the draft sampled this token), got 0")
    return min(1.0, p_target / q_draft)


def spec_expected_tokens(acceptance_rate: float, num_spec_tokens: int) -> float:
    """Tokens per verification, i.i.d. acceptance a and k drafts: (1 - a^(k+1)) / (1 - a);
    k + 1 when a == 1. The +1 is the token the target emits at the first rejection (or after
    the last draft)."""
    _need_num("acceptance_rate", acceptance_rate, 0.0, 1.0)
    _need_int("num_spec_tokens", num_spec_tokens, 0)
    if acceptance_rate == 1:
        return float(num_spec_tokens + 1)
    return (1 - acceptance_rate ** (num_spec_tokens + 1)) / (1 - acceptance_rate)


def spec_forward_passes(output_tokens: int, num_drafts: int, accepted_tokens: int) -> int:
    """Decode forwards with speculation, seed 002's reconstruction (one request or totals):

        draft steps make accepted + drafts tokens; the rest, output - (accepted + drafts), take
        one plain step each; forwards = drafts + output - accepted - drafts = output - accepted.

    68 tokens, 8 drafts, 34 accepted: 8 + 26 = 34 forwards against 68 without speculation.
    """
    _need_int("output_tokens", output_tokens, 1)
    _need_int("num_drafts", num_drafts, 0)
    _need_int("accepted_tokens", accepted_tokens, 0)
    if accepted_tokens + num_drafts > output_tokens:
        raise ValueError(
            f"accepted_tokens ({accepted_tokens}) + num_drafts ({num_drafts}) exceed "
            f"output_tokens ({output_tokens}): each draft step emits accepted + 1 tokens"
        )
    return output_tokens - accepted_tokens


def spec_predicted_speedup(output_tokens: int, num_drafts: int, accepted_tokens: int) -> float:
    """output_tokens / spec_forward_passes: one forward per token without speculation."""
    return output_tokens / spec_forward_passes(output_tokens, num_drafts, accepted_tokens)


# ------------------------------------------------------------------ quantized weights
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
    _need_int("num_params", num_params, 0)
    _need_int("num_output_channels", num_output_channels, 0)
    _need_int("dtype_bytes", dtype_bytes, 1)
    if quantization is None:
        return num_params * dtype_bytes
    if quantization in ("int8", "fp8"):
        return num_params + num_output_channels * QUANT_SCALE_BYTES
    if quantization == "int4":
        _need_int("group_size", group_size, 2)
        if num_params % group_size or group_size % 2:
            raise ValueError(
                f"num_params ({num_params}) must be a multiple of group_size ({group_size}), "
                "an even number: every layer's in_features divides by it"
            )
        return num_params // 2 + (num_params // group_size) * 2 * QUANT_SCALE_BYTES
    raise ValueError(
        f"quantization ({quantization!r}) must be None or one of 'int8', 'int4', 'fp8'"
    )


# ------------------------------------------------------------------ FP8 KV cache
FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value
KV_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1}  # "auto" = the model dtype's bytes


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
    raise ValueError(
        f"kv_cache_dtype ({kv_cache_dtype!r}) must be 'auto', 'fp8' or 'fp8_e4m3'"
    )


def fp8_kv_scale(amax: float) -> float:
    """The calibrated scale of an FP8 KV cache: amax(|x|) / 448, so the largest value seen maps
    to e4m3's largest finite value (1.0 when amax is 0: nothing to scale). vLLM's
    calculate_kv_scales divides by K_SCALE_CONSTANT=200 / V_SCALE_CONSTANT=100 instead, leaving
    headroom for later, larger values; here later values beyond amax saturate at 448 x scale."""
    _need_num("amax", amax, 0.0)
    if not math.isfinite(amax):
        raise ValueError(f"amax must be finite, got {amax!r}")
    return amax / FP8_E4M3_MAX if amax > 0 else 1.0


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


# ------------------------------------------------------------------ KV transfer vs recompute
# A KV cache tier (host memory, another GPU, a store shared by replicas) pays off when moving a
# prefix's KV is faster than computing it again (seed 003, PD disaggregation and shared pools:
# "80 layers, 8 KV heads, head_dim 128, FP16: about 320 KB per token; an 8K prompt about
# 2.6 GB; over a 400 Gb/s link (about 50 GB/s) a little over 50 ms; fine against a prefill of
# hundreds of ms, but on short prompts the transfer overhead eats the gain").
#
#   transfer_s  = KV bytes / bandwidth + latency
#   prefill     = 2 x params x n                      (every token through every weight)
#               + 4 x layers x heads x head_dim x n(n+1)/2   (causal QK^T and AV: pairs)
#   recompute_s = prefill FLOPs / (peak FLOP/s x efficiency)
#
# Recompute grows as n^2 and transfer as n, so past a break-even length the transfer wins.
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


def _need_pos(name: str, value: float) -> None:
    _need_num(name, value, 0.0)
    if value == 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def kv_transfer_time_s(kv_bytes: float, bandwidth_bytes_per_s: float,
                       latency_s: float = 0.0) -> float:
    """kv_bytes / bandwidth + latency (a fixed per-transfer cost: setup, lookup, round trip)."""
    _need_num("kv_bytes", kv_bytes, 0.0)
    _need_pos("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    _need_num("latency_s", latency_s, 0.0)
    return kv_bytes / bandwidth_bytes_per_s + latency_s


def prefill_flops(num_params: float, prompt_tokens: int, num_layers: int, num_heads: int,
                  head_dim: int) -> dict[str, float]:
    """FLOPs to prefill `prompt_tokens` from nothing: linear = 2 x num_params x n (num_params:
    the weights every token multiplies, embeddings left out); attention = 4 x layers x
    heads x head_dim x n(n+1)/2 (QK^T and AV over the causal pairs). Returns linear,
    attention and total."""
    _need_pos("num_params", num_params)
    _need_int("prompt_tokens", prompt_tokens, 1)
    for name, value in (("num_layers", num_layers), ("num_heads", num_heads),
                        ("head_dim", head_dim)):
        _need_int(name, value, 1)
    linear = 2.0 * num_params * prompt_tokens
    attention = 4.0 * num_layers * num_heads * head_dim * prompt_tokens * (prompt_tokens + 1) / 2
    return {"linear": linear, "attention": attention, "total": linear + attention}


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
) -> dict[str, float | int | str]:
    """Moving a `prompt_tokens` prefix's KV over a link against prefilling it again.

    Returns kv_bytes_per_token, kv_bytes, transfer_s, linear_flops, attention_flops,
    prefill_flops, recompute_s, winner ("transfer", "recompute" or "tie"), speedup
    (recompute_s / transfer_s), break_even_bandwidth_bytes_per_s (the slowest link for
    which the transfer still wins at this length; inf when latency alone exceeds the
    recompute) and break_even_tokens (the prompt length above which the transfer wins at this
    bandwidth: the positive root of recompute(n) = transfer(n); 0 when it wins at any length).
    """
    _need_int("num_kv_heads", num_kv_heads, 1)
    _need_int("num_heads", num_heads, 1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads}): each KV head serves num_heads / num_kv_heads")
    per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)
    flops = prefill_flops(num_params, prompt_tokens, num_layers, num_heads, head_dim)
    _need_pos("peak_flops", peak_flops)
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


# ------------------------------------------------------------------ P:D disaggregation
# DistServe / Splitwise: P prefill instances hand each request's KV to M decode instances.
# Each pool must keep up with the arrival rate on its own, so with W = P + M instances:
#
#   per prefill instance  p = prefill_tok_s / input_tokens                  requests/s
#                             (and <= 1 / transfer_s when one link per prefill instance
#                             carries the KV away: input_tokens x KV bytes/token / bandwidth)
#   per decode instance   d = decode_tok_s / (output_tokens - 1)            requests/s
#   system(P, M)          = min(P x p, M x d)
#   balancing ratio P:M   = d / p   (both pools saturate together: P x p = M x d)
#   colocated             = W / (input_tokens / prefill_tok_s + (output_tokens - 1) / decode_tok_s)
#                         = W x p x d / (p + d)   (link term aside)
#
# The prefill emits the first output token (as the engine does), so a decode instance
# generates output_tokens - 1 tokens per request; that is also what `bench pd-capacity`
# measures (decode-only steps). These are capacities at 100% utilization, first order.
# Ignored: prefill/decode interference in the colocated case (the reason disaggregation
# wins on TTFT/TPOT SLOs: DistServe's goodput), batching effects (a prefill instance's
# throughput depends on how many prompts share a step, a decode instance's on its batch,
# which the load sets), queueing (latency grows without bound as a pool nears its rate,
# so an SLO is met well below it), KV capacity (the batch a decode instance can hold),
# the transfer's latency (it adds to TTFT, not to capacity) and the router's cost.
# Note that at first order the colocated rate equals the best fractional split, W x p x d /
# (p + d): disaggregation wins no raw capacity here, integer splits lose some; what it buys
# is the removal of interference, which this arithmetic does not see.
@dataclass(frozen=True)
class PDSplit:
    """One split of the workers: `prefill_instances` + `decode_instances` = num_workers, and
    each pool's sustainable request rate (requests/s). `link_rate` is None without a link."""

    prefill_instances: int
    decode_instances: int
    prefill_rate: float
    decode_rate: float
    link_rate: float | None
    system_rate: float

    @property
    def label(self) -> str:
        """"P:M", e.g. "3:1"."""
        return f"{self.prefill_instances}:{self.decode_instances}"

    @property
    def bottleneck(self) -> str:
        """The pool whose rate is the system's: "prefill", "decode", "link", or "balanced"
        when prefill and decode are equal (within 1e-9) and the link is not lower."""
        rates = {"prefill": self.prefill_rate, "decode": self.decode_rate}
        if self.link_rate is not None:
            rates["link"] = self.link_rate
        if math.isclose(self.prefill_rate, self.decode_rate, rel_tol=1e-9) and (
                self.link_rate is None or self.link_rate >= self.system_rate):
            return "balanced"
        return min(rates, key=lambda k: rates[k])


@dataclass(frozen=True)
class PDRatio:
    """`pd_ratio`'s answer; `rows()` / `table()` print it (one row per split)."""

    num_workers: int
    input_tokens: float
    output_tokens: float
    prefill_tok_s: float
    decode_tok_s: float  # the decode figure used (the best of a curve)
    decode_batch: int | None  # the batch it was measured at (None: a single figure given)
    request_rate: float | None
    transfer_s: float | None  # KV transfer time per request (None without a link)
    prefill_rate_per_instance: float  # p, requests/s (the link bound included)
    decode_rate_per_instance: float  # d, requests/s
    splits: tuple[PDSplit, ...]
    best: PDSplit
    balanced_ratio: float  # P / M = d / p: both pools saturate together
    ideal_rate: float  # W x p x d / (p + d): the best fractional split
    colocated_rate: float  # W instances each doing both phases
    min_prefill_instances: int | None  # ceil(rate / p): the fewest that keep up (with a rate)
    min_decode_instances: int | None  # ceil(rate / d)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per split: split, P, M, the pools' and the system's rates (req/s), the
        bottleneck, best (bool) and, with a request rate, meets_rate (bool)."""
        out = []
        for s in self.splits:
            row: dict[str, Any] = {
                "split": s.label, "prefill_instances": s.prefill_instances,
                "decode_instances": s.decode_instances, "prefill_rate": s.prefill_rate,
                "decode_rate": s.decode_rate}
            if self.transfer_s is not None:
                row["link_rate"] = s.link_rate
            row |= {"system_rate": s.system_rate, "bottleneck": s.bottleneck,
                    "best": s == self.best}
            if self.request_rate is not None:
                row["meets_rate"] = s.system_rate >= self.request_rate
            out.append(row)
        return out

    def table(self) -> str:
        """A Markdown table of `rows()` (rates in req/s, 3 decimals; the best split starred)
        and the summary lines below it."""
        link = self.transfer_s is not None
        rate = self.request_rate is not None
        head = ["P:M", "prefill req/s", "decode req/s", *(["link req/s"] if link else []),
                "system req/s", "bottleneck", *([f"meets {self.request_rate:g} req/s"]
                                                if rate else [])]
        align = ["---", *["---:"] * (len(head) - 2 - rate), "---", *(["---"] if rate else [])]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
        for r, s in zip(self.rows(), self.splits, strict=True):
            cells = [s.label + (" *" if r["best"] else ""), f"{s.prefill_rate:.3f}",
                     f"{s.decode_rate:.3f}"]
            if link:
                cells.append(f"{s.link_rate:.3f}")
            cells += [f"{s.system_rate:.3f}", s.bottleneck]
            if rate:
                cells.append("yes" if r["meets_rate"] else "no")
            lines.append("| " + " | ".join(cells) + " |")
        batch = "" if self.decode_batch is None else f" at batch {self.decode_batch}"
        lines += [
            "",
            f"best split {self.best.label}: {self.best.system_rate:.3f} req/s "
            f"({self.best.bottleneck})",
            f"balancing ratio P:M = {self.balanced_ratio:.3f} (prefill {self.input_tokens:g} "
            f"tokens at {self.prefill_tok_s:g} tok/s; decode {self.output_tokens:g} - 1 tokens "
            f"at {self.decode_tok_s:g} tok/s{batch})",
            f"ideal fractional split: {self.ideal_rate:.3f} req/s; colocated "
            f"({self.num_workers} instances doing both): {self.colocated_rate:.3f} req/s",
        ]
        if self.transfer_s is not None:
            lines.append(f"KV transfer per request: {self.transfer_s * 1e3:.3f} ms (adds to "
                         "TTFT; bounds a prefill instance at 1 / transfer req/s)")
        if self.request_rate is not None:
            lines.append(f"for {self.request_rate:g} req/s: at least "
                         f"{self.min_prefill_instances} prefill + {self.min_decode_instances} "
                         "decode instances")
        return "\n".join(lines)


def _decode_figure(decode_tok_s: float | Mapping[int, float]) -> tuple[float, int | None]:
    """(tokens/s, batch): a single figure as is, a {batch: tokens/s} curve's best point (the
    decode pool's capacity is its best throughput; the load grows the batch to reach it)."""
    if isinstance(decode_tok_s, Mapping):
        if not decode_tok_s:
            raise ValueError("decode_tok_s must be a number or a non-empty {batch: tokens/s} "
                             "mapping, got {}")
        for batch, tps in decode_tok_s.items():
            _need_int("decode_tok_s batch", batch, 1)
            _need_pos(f"decode_tok_s[{batch}]", tps)
        batch = max(decode_tok_s, key=lambda b: (decode_tok_s[b], -b))
        return float(decode_tok_s[batch]), batch
    _need_pos("decode_tok_s", decode_tok_s)
    return float(decode_tok_s), None


def pd_ratio(
    num_workers: int,
    input_tokens: float,
    output_tokens: float,
    prefill_tok_s: float,
    decode_tok_s: float | Mapping[int, float],
    *,
    request_rate: float | None = None,
    kv_bytes_per_token: float | None = None,
    link_bandwidth_bytes_per_s: float | None = None,
    link_latency_s: float = 0.0,
) -> PDRatio:
    """The best prefill:decode split of `num_workers` instances for a workload (DistServe's
    first-order reasoning; formulas and what they ignore above this function).

    input_tokens / output_tokens: mean prompt and output lengths of a request (output >= 2:
    the prefill emits the first token, the decode instance the other output_tokens - 1).
    prefill_tok_s: prompt tokens/s of an instance that only prefills. decode_tok_s: output
    tokens/s of an instance that only decodes, at its decode batch: one figure, or a
    {batch: tokens/s} curve whose best point is taken (reported as `decode_batch`).
    request_rate (req/s, optional): marks the splits that keep up and the fewest instances
    of each pool that would. kv_bytes_per_token with link_bandwidth_bytes_per_s (one link per
    prefill instance, one way) give the KV transfer time per request, input_tokens x KV
    bytes/token / bandwidth + link_latency_s, which bounds a prefill instance at
    1 / transfer_s req/s (transfers overlap the next prefill). Splits run P = 1 .. W - 1;
    the best has the highest system rate, ties going to the more balanced, then to fewer
    prefill instances.
    """
    _need_int("num_workers", num_workers, 2)
    _need_pos("input_tokens", input_tokens)
    _need_num("output_tokens", output_tokens, 2.0)
    if not math.isfinite(output_tokens):
        raise ValueError(f"output_tokens must be a finite number >= 2, got {output_tokens!r}")
    _need_pos("prefill_tok_s", prefill_tok_s)
    decode, batch = _decode_figure(decode_tok_s)
    if request_rate is not None:
        _need_pos("request_rate", request_rate)
    if (kv_bytes_per_token is None) != (link_bandwidth_bytes_per_s is None):
        raise ValueError("kv_bytes_per_token and link_bandwidth_bytes_per_s go together: give "
                         f"both or neither, got {kv_bytes_per_token!r} and "
                         f"{link_bandwidth_bytes_per_s!r}")
    _need_num("link_latency_s", link_latency_s, 0.0)
    transfer_s: float | None = None
    if kv_bytes_per_token is not None and link_bandwidth_bytes_per_s is not None:
        _need_pos("kv_bytes_per_token", kv_bytes_per_token)
        transfer_s = kv_transfer_time_s(input_tokens * kv_bytes_per_token,
                                        link_bandwidth_bytes_per_s, link_latency_s)
    compute_p = prefill_tok_s / input_tokens
    link_p = None if transfer_s is None else 1.0 / transfer_s
    p = compute_p if link_p is None else min(compute_p, link_p)
    d = decode / (output_tokens - 1)
    splits = []
    for n_prefill in range(1, num_workers):
        n_decode = num_workers - n_prefill
        link_rate = None if link_p is None else n_prefill * link_p
        pre, dec = n_prefill * compute_p, n_decode * d
        system = min(pre, dec) if link_rate is None else min(pre, dec, link_rate)
        splits.append(PDSplit(n_prefill, n_decode, pre, dec, link_rate, system))
    best = max(splits, key=lambda s: (s.system_rate,
                                      -abs(_prefill_pool_rate(s) - s.decode_rate),
                                      -s.prefill_instances))
    return PDRatio(
        num_workers=num_workers, input_tokens=input_tokens, output_tokens=output_tokens,
        prefill_tok_s=prefill_tok_s, decode_tok_s=decode, decode_batch=batch,
        request_rate=request_rate, transfer_s=transfer_s,
        prefill_rate_per_instance=p, decode_rate_per_instance=d, splits=tuple(splits),
        best=best, balanced_ratio=d / p, ideal_rate=num_workers * p * d / (p + d),
        colocated_rate=num_workers / (input_tokens / prefill_tok_s
                                      + (output_tokens - 1) / decode),
        min_prefill_instances=None if request_rate is None else math.ceil(
            request_rate / p - 1e-12),
        min_decode_instances=None if request_rate is None else math.ceil(
            request_rate / d - 1e-12),
    )


def _prefill_pool_rate(split: PDSplit) -> float:
    """The prefill pool's rate with the link bound: min(prefill_rate, link_rate)."""
    return split.prefill_rate if split.link_rate is None else min(split.prefill_rate,
                                                                   split.link_rate)
