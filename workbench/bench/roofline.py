"""Compute roofline: the best output tok/s a workload could reach at the machine's matmul rate.

Owned here: the FLOP count of a workload on a Llama-shaped decoder (from its HF `config.json`)
and a quick fp32 GFLOP/s measurement with one large `torch.mm`.

FLOPs counted (multiply-add = 2 FLOPs), per request with prompt length P and T output tokens:
  * layers: every token that goes through the model, P + T - 1 of them (the last output token
    is sampled, never fed back), costs 2 x (matmul parameters of all layers);
  * lm_head: only positions whose logits are sampled, T of them, cost 2 x hidden x vocab;
  * attention: the token at position p attends to p + 1 keys: QK^T and AV cost
    2 x 2 x heads x head_dim x (p + 1) per layer (causal; GQA does not change the FLOPs).
Embedding lookups, norms, activations and sampling are left out (memory-bound, small).

The share of the CPUs other processes took during a measurement is `validity.CpuWatch`'s.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DecoderShape:
    """The matmul-relevant shape of a Llama-style decoder."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> DecoderShape:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
        )

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path) -> DecoderShape:
        return cls.from_hf_config(json.loads((Path(ckpt_dir) / "config.json").read_text()))

    @property
    def layer_matmul_params(self) -> int:
        """q, k, v, o projections and the gated MLP (gate, up, down) of one layer."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * self.num_heads * hd * 2 + h * self.num_kv_heads * hd * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @property
    def matmul_params(self) -> int:
        return self.num_layers * self.layer_matmul_params + self.lm_head_params


def request_flops(shape: DecoderShape, prompt_len: int, max_tokens: int) -> float:
    """FLOPs of one greedy request (prefill + decode) as described in the module docstring."""
    fed = prompt_len + max_tokens - 1
    layers = 2.0 * shape.num_layers * shape.layer_matmul_params * fed
    lm_head = 2.0 * shape.lm_head_params * max_tokens
    # sum_{p=0}^{fed-1} (p + 1) keys attended
    keys = fed * (fed + 1) / 2
    attention = 4.0 * shape.num_heads * shape.head_dim * keys * shape.num_layers
    return layers + lm_head + attention


@dataclass(frozen=True)
class Roofline:
    """A workload's FLOPs and the output tok/s they allow at `gflops` GFLOP/s."""

    total_flops: float
    output_tokens: int
    gflops: float

    @property
    def seconds(self) -> float:
        return self.total_flops / (self.gflops * 1e9)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds

    def fraction(self, measured_output_tok_s: float) -> float:
        return measured_output_tok_s / self.output_tok_s


def workload_roofline(
    shape: DecoderShape, requests: list[tuple[int, int]], gflops: float
) -> Roofline:
    """`requests` as (prompt_len, max_tokens) pairs."""
    if gflops <= 0:
        raise ValueError(f"gflops ({gflops}) must be > 0")
    total = sum(request_flops(shape, p, t) for p, t in requests)
    return Roofline(total_flops=total, output_tokens=sum(t for _, t in requests), gflops=gflops)


def measure_fp32_gflops(n: int = 2048, reps: int = 5) -> float:
    """Best fp32 GFLOP/s of an n x n x n `torch.mm` over `reps` runs (after one warm-up),
    with torch's current thread count. ~0.1 s per rep at n=2048 on 2 AVX2 cores."""
    import torch

    a = torch.randn(n, n, dtype=torch.float32)
    b = torch.randn(n, n, dtype=torch.float32)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def cpu_summary() -> str:
    """'<model name>, <n> CPUs, <widest ISA>' from /proc/cpuinfo (figures differ by ISA:
    AVX2-only machines of this kind measure ~160 fp32 GFLOP/s, AVX-512 ones ~300)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = next((name for flag, name in (("amx_tile", "AVX-512 + AMX"), ("avx512f", "AVX-512"),
                                        ("avx2", "AVX2")) if flag in flags), "no AVX2")
    return f"{model}, {os.cpu_count()} CPUs, {isa}"
