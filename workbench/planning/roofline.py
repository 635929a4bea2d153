"""Schedule-aware roofline: the fastest a workload could run, step by step, on a machine with a
peak FLOP rate and a memory bandwidth.

Place in the flow: the planning calculator (pure Python, no torch, never the engine):
`workbench.planning.schedule_roofline`, printed by `workbench calc roofline`; the offline
benchmark divides its measured tok/s by it.

The schedule is simulated from (prompt_len, max_tokens) pairs as the engine's V1 scheduler
(`workbench/core/sched/scheduler.py`) runs it, greedy with `ignore_eos`, FCFS, no prefix hits and
no preemption (the KV pool is taken to be large enough):

    each step: budget = max_num_batched_tokens
      1. running requests, in admission order: each gets min(tokens not yet computed, budget)
         (a decode: 1 token; an unfinished prefill: its next chunk)
      2. waiting requests while budget > 0 and fewer than max_num_seqs run: admitted with a
         chunk of what is left of the budget (chunked prefill), or, with chunked prefill
         off, only when the whole prompt fits
    a chunk that reaches the last known token samples one output token; a request that has
    its max_tokens leaves before the next step (its seat and budget go to others)

In the default configuration the running list holds the decodes first and at most one
partial prefill after them, so a step is "decodes first, then prefill chunks filling the
budget". Each step costs (multiply-add = 2 FLOPs, a chunk of n new tokens after c computed):

    FLOPs  = 2 x layer matmul params x layers x n            (q, k, v, o, gate, up, down)
           + 2 x hidden x vocab                 per request that samples in the step
           + 4 x heads x head_dim x layers x (n c + n (n + 1) / 2)   (QK^T and AV, causal)
    bytes  = weight bytes (matmul weights, streamed once per step; the lm_head only in a
             step that samples) + KV bytes/token x c (each chunk reads the KV of its earlier
             tokens: a decode its sequence so far) + KV bytes/token x n (writes its own)
    time   = max(FLOPs / peak, bytes / bandwidth): compute-bound when the FLOP time is the
             larger (or equal), bandwidth-bound otherwise

Left out (small or not needed by a perfect kernel): embedding lookups, norms, activations,
sampling, activations spilled between layers, the host's scheduling and Python time. Summed
over a request, the FLOPs equal `request_flops` (the schedule moves them, never adds any).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.errors import UserError

Bound = Literal["compute", "bandwidth"]


class RooflineInputError(UserError):
    """A bad argument to the schedule roofline (named, with its value, in the message)."""


def _need_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RooflineInputError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _need_pos(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value < math.inf):
        raise RooflineInputError(f"{name} must be a finite number > 0, got {value!r}")


# ------------------------------------------------------------------ the model's shape
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

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            _need_int(name, getattr(self, name), 1)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> DecoderShape:
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
        """From `<ckpt_dir>/config.json` (or a config.json path)."""
        path = Path(ckpt_dir)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_hf_config(json.loads(path.read_text()))

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

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """2 (K and V) x layers x kv_heads x head_dim x dtype_bytes."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def as_shape(model: DecoderShape | Mapping[str, Any] | str | Path) -> DecoderShape:
    """A DecoderShape from itself, an HF config dict, or a checkpoint folder / config.json."""
    if isinstance(model, DecoderShape):
        return model
    if isinstance(model, Mapping):
        return DecoderShape.from_hf_config(model)
    return DecoderShape.from_checkpoint(model)


def request_flops(shape: DecoderShape, prompt_len: int, max_tokens: int) -> float:
    """FLOPs of one greedy request (prefill + decode), schedule aside: P + T - 1 tokens go
    through the layers, T positions through the lm_head, position p attends to p + 1 keys."""
    fed = prompt_len + max_tokens - 1
    layers = 2.0 * shape.num_layers * shape.layer_matmul_params * fed
    lm_head = 2.0 * shape.lm_head_params * max_tokens
    keys = fed * (fed + 1) / 2
    attention = 4.0 * shape.num_heads * shape.head_dim * keys * shape.num_layers
    return layers + lm_head + attention


# ------------------------------------------------------------------ the schedule
@dataclass(frozen=True)
class ScheduleConfig:
    """The scheduler knobs the simulation follows (the engine's `SchedulerConfig` names)."""

    max_num_batched_tokens: int  # the per-step token budget
    max_num_seqs: int  # most requests running at once
    enable_chunked_prefill: bool = True  # split a prompt that does not fit the budget
    long_prefill_token_threshold: int = 0  # cap one prefill chunk at this many tokens (0: off)

    def __post_init__(self) -> None:
        _need_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _need_int("max_num_seqs", self.max_num_seqs, 1)
        _need_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise RooflineInputError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}); raise it or lower max_num_seqs")


@dataclass(frozen=True)
class Chunk:
    """One request's share of a step: `num_new` tokens after `num_computed` already in KV."""

    request: int  # index into the request list
    num_computed: int
    num_new: int
    is_decode: bool  # the prompt was already computed (the engine's decode/prefill split)
    samples: bool  # the chunk reaches the last known token: one output token is sampled


def simulate_schedule(requests: Sequence[tuple[int, int]],
                      config: ScheduleConfig) -> list[tuple[Chunk, ...]]:
    """The steps the engine would run for `requests` ((prompt_len, max_tokens) pairs), each
    as its chunks in scheduling order (see the module docstring)."""
    for i, (prompt, out) in enumerate(requests):
        _need_int(f"requests[{i}] prompt_len", prompt, 1)
        _need_int(f"requests[{i}] max_tokens", out, 1)
    threshold = config.long_prefill_token_threshold
    longest = max((p for p, _ in requests), default=0)
    first_chunk = min(longest, threshold) if threshold else longest
    if not config.enable_chunked_prefill and first_chunk > config.max_num_batched_tokens:
        raise RooflineInputError(
            f"a prompt of {longest} tokens never fits max_num_batched_tokens "
            f"({config.max_num_batched_tokens}) with chunked prefill off; raise the budget or "
            "turn chunked prefill on")
    computed = [0] * len(requests)
    generated = [0] * len(requests)
    waiting: deque[int] = deque(range(len(requests)))
    running: list[int] = []
    steps: list[tuple[Chunk, ...]] = []
    while running or waiting:
        budget = config.max_num_batched_tokens
        planned: list[tuple[int, int]] = []
        for r in running:
            if budget <= 0:
                break
            num_new = min(requests[r][0] + generated[r] - computed[r], budget)
            if 0 < threshold < num_new:
                num_new = threshold
            planned.append((r, num_new))
            budget -= num_new
        while waiting and budget > 0 and len(running) < config.max_num_seqs:
            r = waiting[0]
            num_new = requests[r][0]
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                if not config.enable_chunked_prefill:
                    break
                num_new = budget
            waiting.popleft()
            running.append(r)
            planned.append((r, num_new))
            budget -= num_new
        assert planned, "a step with nothing scheduled: the simulation would not end"
        chunks = []
        for r, num_new in planned:
            prompt = requests[r][0]
            known = prompt + generated[r]
            samples = computed[r] + num_new == known
            chunks.append(Chunk(r, computed[r], num_new, computed[r] >= prompt, samples))
            computed[r] += num_new
            generated[r] += samples
        steps.append(tuple(chunks))
        running = [r for r in running if generated[r] < requests[r][1]]
    return steps


# ------------------------------------------------------------------ the cost of each step
@dataclass(frozen=True)
class StepCost:
    """One step's work and its lower bound in seconds."""

    num_decodes: int
    num_prefill_tokens: int
    num_samples: int  # output tokens the step produces
    linear_flops: float
    lm_head_flops: float
    attention_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    compute_s: float
    memory_s: float

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + self.num_prefill_tokens

    @property
    def flops(self) -> float:
        return self.linear_flops + self.lm_head_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> Bound:
        return "compute" if self.compute_s >= self.memory_s else "bandwidth"

    def to_dict(self) -> dict[str, Any]:
        return {"num_decodes": self.num_decodes, "num_prefill_tokens": self.num_prefill_tokens,
                "num_samples": self.num_samples, "flops": self.flops, "bytes": self.bytes,
                "kv_read_bytes": self.kv_read_bytes, "kv_write_bytes": self.kv_write_bytes,
                "compute_s": self.compute_s, "memory_s": self.memory_s,
                "seconds": self.seconds, "bound": self.bound}


def step_cost(shape: DecoderShape, chunks: Sequence[Chunk], gflops: float, bandwidth_gbs: float,
              dtype_bytes: float, kv_dtype_bytes: float) -> StepCost:
    """FLOPs, bytes and time of one step (formulas in the module docstring)."""
    tokens = sum(c.num_new for c in chunks)
    samples = sum(c.samples for c in chunks)
    keys = sum(c.num_new * c.num_computed + c.num_new * (c.num_new + 1) / 2 for c in chunks)
    linear = 2.0 * shape.num_layers * shape.layer_matmul_params * tokens
    lm_head = 2.0 * shape.lm_head_params * samples
    attention = 4.0 * shape.num_heads * shape.head_dim * shape.num_layers * keys
    weight_params = shape.num_layers * shape.layer_matmul_params + (
        shape.lm_head_params if samples else 0)
    per_token = shape.kv_bytes_per_token(kv_dtype_bytes)
    kv_read = per_token * sum(c.num_computed for c in chunks)
    kv_write = per_token * tokens
    weights = weight_params * dtype_bytes
    return StepCost(
        num_decodes=sum(c.num_new for c in chunks if c.is_decode),
        num_prefill_tokens=sum(c.num_new for c in chunks if not c.is_decode),
        num_samples=samples, linear_flops=linear, lm_head_flops=lm_head,
        attention_flops=attention, weight_bytes=weights, kv_read_bytes=kv_read,
        kv_write_bytes=kv_write, compute_s=(linear + lm_head + attention) / (gflops * 1e9),
        memory_s=(weights + kv_read + kv_write) / (bandwidth_gbs * 1e9))


@dataclass(frozen=True)
class ScheduleRoofline:
    """A workload's schedule-aware roofline: its steps' costs and their totals."""

    steps: tuple[StepCost, ...]
    prompt_tokens: int
    output_tokens: int
    gflops: float
    bandwidth_gbs: float

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def total_flops(self) -> float:
        return sum(s.flops for s in self.steps)

    @property
    def total_bytes(self) -> float:
        return sum(s.bytes for s in self.steps)

    @property
    def compute_bound_steps(self) -> int:
        return sum(s.bound == "compute" for s in self.steps)

    @property
    def bandwidth_bound_steps(self) -> int:
        return sum(s.bound == "bandwidth" for s in self.steps)

    @property
    def output_tok_s(self) -> float:
        """The output tok/s bound: output tokens / the steps' summed lower bounds."""
        return self.output_tokens / self.seconds

    @property
    def compute_only_output_tok_s(self) -> float:
        """The old bound, FLOPs / peak alone (>= output_tok_s), for comparison."""
        return self.output_tokens / (self.total_flops / (self.gflops * 1e9))

    def fraction(self, measured_output_tok_s: float) -> float:
        return measured_output_tok_s / self.output_tok_s

    def to_dict(self, with_steps: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "gflops": self.gflops, "bandwidth_gbs": self.bandwidth_gbs,
            "num_steps": len(self.steps), "compute_bound_steps": self.compute_bound_steps,
            "bandwidth_bound_steps": self.bandwidth_bound_steps,
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "total_flops": self.total_flops, "total_bytes": self.total_bytes,
            "seconds": self.seconds, "output_tok_s": self.output_tok_s,
            "compute_only_output_tok_s": self.compute_only_output_tok_s}
        if with_steps:
            doc["steps"] = [s.to_dict() for s in self.steps]
        return doc


def schedule_roofline(
    model: DecoderShape | Mapping[str, Any] | str | Path,
    requests: Sequence[tuple[int, int]],
    max_num_batched_tokens: int,
    max_num_seqs: int,
    gflops: float,
    bandwidth_gbs: float,
    dtype_bytes: float = 4,
    *,
    kv_dtype_bytes: float | None = None,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
) -> ScheduleRoofline:
    """The schedule-aware roofline of `requests` ((prompt_len, max_tokens) pairs, greedy,
    ignore_eos) on `model` (a DecoderShape, an HF config dict or a checkpoint folder) at
    `gflops` GFLOP/s and `bandwidth_gbs` GB/s (10^9 bytes/s); weights of `dtype_bytes` bytes
    (4 fp32, 2 bf16), KV of `kv_dtype_bytes` (default: dtype_bytes)."""
    shape = as_shape(model)
    _need_pos("gflops", gflops)
    _need_pos("bandwidth_gbs", bandwidth_gbs)
    _need_pos("dtype_bytes", dtype_bytes)
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    _need_pos("kv_dtype_bytes", kv_bytes)
    if not requests:
        raise RooflineInputError("requests must hold at least one (prompt_len, max_tokens) "
                                 "pair, got none")
    config = ScheduleConfig(max_num_batched_tokens, max_num_seqs, enable_chunked_prefill,
                            long_prefill_token_threshold)
    steps = simulate_schedule(requests, config)
    costs = tuple(step_cost(shape, s, gflops, bandwidth_gbs, dtype_bytes, kv_bytes)
                  for s in steps)
    return ScheduleRoofline(steps=costs, prompt_tokens=sum(p for p, _ in requests),
                            output_tokens=sum(t for _, t in requests), gflops=float(gflops),
                            bandwidth_gbs=float(bandwidth_gbs))
