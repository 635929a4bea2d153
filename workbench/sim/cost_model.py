"""The analytic cost model: one step's time from operator costs, Vidur's way (no measurement).

For a BatchComposition with T = prefill_tokens + decode_tokens tokens, on a GPU profile
(`hardware.py`: peak P, memory bandwidth B, link bandwidth L, each times its stated efficiency),
tensor-parallel degree tp and pipeline-parallel degree pp:

    step = overhead                       step_overhead_s + seq_overhead_s x num_seqs
         + layers x (qkv_proj + o_proj + gate_up_proj + down_proj   GEMMs, sharded by tp
                     + attention_prefill + attention_decode
                     + tp_all_reduce)                              2 per layer when tp > 1
         + pp_send_recv                   (pp - 1) stage boundaries, the batch's activations
         + lm_head + logits_gather        on the sampled rows (gather when tp > 1)
         + sampling                       per sampled row

    GEMM (m rows, k in, n out)  max(2 m k n / P, (k n x weight bytes + (m k + m n) x 2) / B)
                                weights read once per step; activations bf16
    attention_prefill           4 x prefill_attn_pairs x heads/tp x head_dim / P
    attention_decode            max(decode_context_tokens x 2 x kv_heads/tp x head_dim
                                    x kv bytes / B,  4 x decode_context_tokens x heads/tp
                                    x head_dim / P)
    all-reduce (S bytes)        2 (tp - 1) / tp x S / L + latency    (ring), S = T x hidden x 2
    send/recv (S bytes)         S / L + latency
    sampling                    sampled_rows x vocab x 4 bytes x SAMPLING_PASSES / B

MoE layers (num_experts > 0): the router GEMM (hidden -> experts, not sharded) plus each
expert GEMM priced with FLOPs for T x experts_per_token rows and weights for the experts the
batch touches, expected under uniform routing: E (1 - (1 - k / E)^T).
KV heads are sharded by tp down to one per rank (replicated beyond that), as vLLM does.
Pipeline stages run one batch in sequence, so a step's latency sums every layer; the
overlap of several batches across stages (vLLM's virtual engines) is not modelled.
Not priced: embedding lookup, norms, rotary, activation functions, residual adds (memory-bound
elementwise work, a few percent of a step) and CPU-GPU overlap.
"""

from __future__ import annotations

from typing import Any

from workbench.sim.batch import BatchComposition
from workbench.sim.hardware import HardwareProfile, hardware_profile
from workbench.sim.model_shapes import ModelShape, model_shape

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
                               "fp8": 1, "fp8_e4m3": 1, "fp32": 4, "float32": 4}
ACTIVATION_BYTES = 2  # bf16 activations, whatever the weights' dtype
LOGIT_BYTES = 4  # the sampler reads float32 logits
SAMPLING_PASSES = 3  # softmax read, probabilities written, read again to draw


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a weight or KV dtype (DTYPE_BYTES); unknown names list the known."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype ({dtype!r}) must be one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class AnalyticCostModel:
    """CostModel from a ModelShape and a HardwareProfile (see the module docstring)."""

    def __init__(self, model: ModelShape | str, hardware: HardwareProfile | str,
                 tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 weight_dtype: str = "bf16", kv_cache_dtype: str = "bf16") -> None:
        self.shape = model_shape(model)
        self.hardware = hardware_profile(hardware)
        for name, value in (("tensor_parallel_size", tensor_parallel_size),
                            ("pipeline_parallel_size", pipeline_parallel_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
        if pipeline_parallel_size > self.shape.num_layers:
            raise ValueError(f"pipeline_parallel_size ({pipeline_parallel_size}) must be at "
                             f"most the model's layers ({self.shape.num_layers})")
        self.tp, self.pp = tensor_parallel_size, pipeline_parallel_size
        self.weight_dtype, self.kv_cache_dtype = weight_dtype, kv_cache_dtype
        self.weight_bytes, self.kv_bytes = dtype_bytes(weight_dtype), dtype_bytes(kv_cache_dtype)

    # ------------------------------------------------------------------ pieces
    def _gemm_s(self, m: float, k: int, n: int, weight_rows: float | None = None) -> float:
        """max(FLOP time, byte time) of an (m x k) @ (k x n) GEMM; `weight_rows`: how many k-row
        weight slices are read (default k; MoE: the touched experts' share)."""
        if m <= 0:
            return 0.0
        hw = self.hardware
        weights = (k if weight_rows is None else weight_rows) * n * self.weight_bytes
        moved = weights + (m * k + m * n) * ACTIVATION_BYTES
        return max(2.0 * m * k * n / hw.effective_flops, moved / hw.effective_memory_bandwidth)

    def _link_s(self, nbytes: float) -> float:
        hw = self.hardware
        return nbytes / hw.effective_link_bandwidth + hw.link_latency_s

    def _mlp_s(self, t: int) -> dict[str, float]:
        s, tp = self.shape, self.tp
        width = _ceil_div(s.intermediate_size, tp)
        if not s.is_moe:
            return {"gate_up_proj": self._gemm_s(t, s.hidden_size, 2 * width),
                    "down_proj": self._gemm_s(t, width, s.hidden_size)}
        e, k = s.num_experts, s.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** t) if t > 0 else 0.0
        rows = t * k
        return {"router": self._gemm_s(t, s.hidden_size, e),
                "gate_up_proj": self._gemm_s(rows, s.hidden_size, 2 * width,
                                             weight_rows=touched * s.hidden_size),
                "down_proj": self._gemm_s(rows, width, s.hidden_size,
                                          weight_rows=touched * width)}

    def breakdown(self, batch: BatchComposition) -> dict[str, float]:
        """Seconds per operator for one step of `batch` (summed over layers); their sum is
        `step_time_s(batch)`. Keys: overhead, qkv_proj, o_proj, [router,] gate_up_proj,
        down_proj, attention_prefill, attention_decode, tp_all_reduce, pp_send_recv, lm_head,
        logits_gather, sampling."""
        s, hw, tp, layers = self.shape, self.hardware, self.tp, self.shape.num_layers
        t = batch.num_tokens
        out = {"overhead": hw.step_overhead_s + hw.seq_overhead_s * batch.num_seqs}
        heads = _ceil_div(s.num_heads, tp)
        kv_heads = max(1, _ceil_div(s.num_kv_heads, tp))
        per_layer = {
            "qkv_proj": self._gemm_s(t, s.hidden_size, (heads + 2 * kv_heads) * s.head_dim),
            "o_proj": self._gemm_s(t, heads * s.head_dim, s.hidden_size),
            **self._mlp_s(t),
            "attention_prefill": (4.0 * batch.prefill_attn_pairs * heads * s.head_dim
                                  / hw.effective_flops),
            "attention_decode": max(
                batch.decode_context_tokens * 2 * kv_heads * s.head_dim * self.kv_bytes
                / hw.effective_memory_bandwidth,
                4.0 * batch.decode_context_tokens * heads * s.head_dim / hw.effective_flops),
            "tp_all_reduce": (2 * self._link_s(2 * (tp - 1) / tp * t * s.hidden_size
                                               * ACTIVATION_BYTES) if tp > 1 and t else 0.0),
        }
        out.update({name: layers * v for name, v in per_layer.items()})
        out["pp_send_recv"] = ((self.pp - 1) * self._link_s(t * s.hidden_size * ACTIVATION_BYTES)
                               if self.pp > 1 and t else 0.0)
        rows = batch.sampled_rows
        out["lm_head"] = self._gemm_s(rows, s.hidden_size, _ceil_div(s.vocab_size, tp))
        out["logits_gather"] = (self._link_s((tp - 1) / tp * rows * s.vocab_size
                                             * ACTIVATION_BYTES) if tp > 1 and rows else 0.0)
        out["sampling"] = (rows * s.vocab_size * LOGIT_BYTES * SAMPLING_PASSES
                           / hw.effective_memory_bandwidth)
        return out

    def step_time_s(self, batch: BatchComposition) -> float:
        return sum(self.breakdown(batch).values())

    def describe(self) -> dict[str, Any]:
        hw = self.hardware
        return {"source": "analytic", "profile": f"{hw.name} (analytic, uncalibrated)",
                "hardware": hw.as_dict(), "model": self.shape.as_dict(),
                "tensor_parallel_size": self.tp, "pipeline_parallel_size": self.pp,
                "weight_dtype": self.weight_dtype, "kv_cache_dtype": self.kv_cache_dtype}
