"""Micro-benchmark: the KV-eviction scoring pass (C++ kernel and torch twin) against the
paged decode attention it rides beside.

    python -m workbench.bench.micro.attn_scores [--runs 9] [--threads 1]

Cases: an H2O decode step (one query per sequence over its whole context) and a SnapKV
observation window (32 queries over a 2048-token prompt). Each row gives medians over
`--runs` of `kernels.cpu.attn_scores.attention_scores`, its twin
`workbench.attention.scores.window_probs_torch`, and (decode rows) the C++ paged decode
attention on the same cache, plus the share of the CPUs other processes took (above
`--max-other-cpu-share` the row is INVALID). Blocks are laid out in order (one sequence's
blocks contiguous): a best case for both reads. docs/kv_compression.md quotes it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, default_cpu_watch


@dataclass(frozen=True)
class Case:
    name: str
    num_seqs: int
    context: int
    num_queries: int  # per sequence: 1 = an H2O decode step, > 1 = a SnapKV window
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    block_size: int = 16


CASES = (
    Case("h2o decode 8 x 1024", 8, 1024, 1),
    Case("h2o decode 32 x 512", 32, 512, 1),
    Case("snapkv window 32 x 2048", 1, 2048, 32),
)


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm up (and build the kernel)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_case(case: Case, runs: int) -> dict[str, float]:
    from kernels.cpu.attn_scores import attention_scores
    from kernels.cpu.paged_decode import paged_decode_attention
    from workbench.attention.scores import window_probs_torch

    g = torch.Generator().manual_seed(0)
    per_seq = -(-case.context // case.block_size)
    kv = torch.randn(2, case.num_seqs * per_seq + 1, case.block_size, case.num_kv_heads,
                     case.head_dim, generator=g)
    tables = (torch.arange(case.num_seqs * per_seq) + 1).view(case.num_seqs, per_seq)
    n, nq = case.num_seqs, case.num_queries
    query = torch.randn(n * nq, case.num_heads, case.head_dim, generator=g)
    lens = torch.full((n,), case.context, dtype=torch.long)
    starts = torch.arange(n, dtype=torch.long) * nq
    counts = torch.full((n,), nq, dtype=torch.long)
    key_end = lens - (nq if nq > 1 else 0)
    scale = case.head_dim**-0.5
    args = (query, kv[0], tables, lens, starts, counts, key_end, scale, case.context)
    row = {"kernel_ms": _median_ms(lambda: attention_scores(*args), runs),
           "twin_ms": _median_ms(lambda: window_probs_torch(*args), runs)}
    if nq == 1:
        row["attention_ms"] = _median_ms(
            lambda: paged_decode_attention(query, kv[0], kv[1], tables, lens, scale), runs)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="timed calls per measurement")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument("--max-other-cpu-share", type=float, default=DEFAULT_MAX_OTHER_CPU_SHARE)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs ({args.runs}) must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}, medians of {args.runs} (ms)")
    print(f"{'case':<26}{'kernel':>9}{'twin':>9}{'attention':>11}  other CPU")
    for case in CASES:
        with default_cpu_watch().measure() as share:
            row = run_case(case, args.runs)
        ok = math.isnan(share.others) or share.others <= args.max_other_cpu_share
        attn = f"{row['attention_ms']:11.3f}" if "attention_ms" in row else f"{'-':>11}"
        print(f"{case.name:<26}{row['kernel_ms']:9.3f}{row['twin_ms']:9.3f}{attn}  "
              f"{share.others:.0%}{'' if ok else ' INVALID'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
