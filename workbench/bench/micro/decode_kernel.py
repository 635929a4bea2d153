"""Micro-benchmark: the CPU paged-decode attention kernel against its torch twin.

    python -m workbench.bench.micro.decode_kernel [--runs 9] [--threads N]

One decode token per sequence through `TorchAttentionBackend.forward` (the KV write, the plan
and the attention), the C++ kernel switched on and off (`USE_CPU_DECODE_KERNEL`): the torch
twin gathers K/V through the block table and runs SDPA. Caches hold random blocks in random
order, rotated over 8 layers' worth of caches so K/V come from memory as in a real forward.
Shapes: the offline bench's models (head_dim 64, 32) and a head_dim-128 one. The table gives
medians over `--runs`, the K/V bytes read per second by the kernel, the speed-up, the largest
difference from the twin, the fp32 vector path the kernel was built with, and the share of
the CPUs other processes took (above `--max-other-cpu-share` the row is INVALID).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, default_cpu_watch

if TYPE_CHECKING:
    from workbench.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class Case:
    name: str
    num_seqs: int
    context: tuple[int, int]  # inclusive range of context lengths
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 64
    block_size: int = 16


CASES = (
    Case("bench model", 64, (48, 384), head_dim=64),
    Case("small model", 48, (24, 192), head_dim=32),
    Case("head_dim 128", 32, (48, 384), head_dim=128),
)
LAYERS = 8


def _inputs(case: Case, seed: int = 0) -> tuple[list[torch.Tensor], AttentionMetadata,
                                                  torch.Tensor, torch.Tensor, torch.Tensor, int]:
    from workbench.attention.metadata import AttentionMetadata

    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    bs = case.block_size
    lens = [rng.randint(*case.context) for _ in range(case.num_seqs)]
    width = -(-max(lens) // bs)
    num_blocks = case.num_seqs * width + 1  # block 0: the null block
    tables = (torch.randperm(num_blocks - 1, generator=g) + 1).view(case.num_seqs, width)
    caches = [torch.randn(2, num_blocks, bs, case.num_kv_heads, case.head_dim, generator=g)
              for _ in range(LAYERS)]
    slots = [int(tables[i, (s - 1) // bs]) * bs + (s - 1) % bs for i, s in enumerate(lens)]
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        query_start_loc=torch.arange(case.num_seqs + 1, dtype=torch.long),
        seq_lens=torch.tensor(lens, dtype=torch.long), block_tables=tables,
        query_lens_cpu=[1] * case.num_seqs, seq_lens_cpu=lens, max_query_len=1,
        max_seq_len=max(lens))
    n = case.num_seqs
    q = torch.randn(n, case.num_heads, case.head_dim, generator=g)
    k = torch.randn(n, case.num_kv_heads, case.head_dim, generator=g)
    v = torch.randn(n, case.num_kv_heads, case.head_dim, generator=g)
    kv_bytes = 2 * sum(lens) * case.num_kv_heads * case.head_dim * 4
    return caches, md, q, k, v, kv_bytes


def measure(case: Case, runs: int) -> dict[str, float]:
    """Median seconds per layer for the twin and the kernel, their largest difference."""
    from workbench.attention import torch_backend

    caches, md, q, k, v, kv_bytes = _inputs(case)
    backend = torch_backend.TorchAttentionBackend()
    scale = case.head_dim ** -0.5
    old = torch_backend.USE_CPU_DECODE_KERNEL
    out: dict[str, float] = {"kv_bytes": kv_bytes}
    results = {}
    try:
        for name, use in (("twin", False), ("kernel", True)):
            torch_backend.USE_CPU_DECODE_KERNEL = use
            results[name] = backend.forward(q, k, v, caches[0], md, scale)  # warm-up
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                for cache in caches:
                    backend.forward(q, k, v, cache, md, scale)
                times.append((time.perf_counter() - t0) / LAYERS)
            out[name] = statistics.median(times)
    finally:
        torch_backend.USE_CPU_DECODE_KERNEL = old
    out["max_diff"] = float((results["kernel"] - results["twin"]).abs().max())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="timed passes over the 8 layers")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument("--max-other-cpu-share", type=float, default=DEFAULT_MAX_OTHER_CPU_SHARE)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs ({args.runs}) must be >= 1")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads ({args.threads}) must be >= 1")
    if not 0 <= args.max_other_cpu_share <= 1:
        ap.error(f"--max-other-cpu-share ({args.max_other_cpu_share}) must be in [0, 1]")
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels.cpu import paged_decode
    from workbench.bench.micro.roofline import cpu_summary

    paged_decode.load()
    print(f"{cpu_summary()}; {torch.get_num_threads()} threads; kernel "
          f"{paged_decode.EXTENSION.status()}")
    print("| case | seqs x context | head_dim | torch twin ms/layer | kernel ms/layer "
          "| kernel K/V GB/s | speed-up | max abs diff | others' CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in CASES:
        with default_cpu_watch().measure() as share:
            r = measure(case, args.runs)
        others = "n/a" if math.isnan(share.others) else f"{share.others:.0%}"
        flag = "" if math.isnan(share.others) or share.others <= args.max_other_cpu_share \
            else " INVALID (disturbed)"
        print(f"| {case.name}{flag} | {case.num_seqs} x {case.context[0]}-{case.context[1]} | "
              f"{case.head_dim} | {r['twin'] * 1e3:.3f} | {r['kernel'] * 1e3:.3f} | "
              f"{r['kv_bytes'] / r['kernel'] / 1e9:.1f} | {r['twin'] / r['kernel']:.2f}x | "
              f"{r['max_diff']:.1e} | {others} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
