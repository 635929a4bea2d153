"""What one tensor-parallel collective costs on this machine: the floor under a TP step.

    from workbench.harness.collectives import allreduce_latency, collectives_per_step
    allreduce_latency(world_size=2, numels=(256, 65536))   # [{numel, bytes, median_us, ...}]
    collectives_per_step(num_hidden_layers=6)              # 14

A TP=N forward pass makes `collectives_per_step(L)` collectives whatever the batch: one
all-reduce after the vocab-parallel embedding, two per layer (after o_proj and down_proj) and
one all-gather of the LM head's vocab shards. Their latency times that count is what TP adds
to every step; compare it with the step's compute / N to see when TP can pay off (a model
whose per-step compute is small against it gets slower with TP, whatever the core count).

The measurement spawns `world_size` fresh processes (gloo on CPU, like `tensor_parallel_size`
workers, `threads` intra-op threads each), times `iters` all-reduces of each size after a
warm-up, and reports rank 0's median and p90 per call.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from typing import Any

COLLECTIVE_TIMEOUT_S = 120.0


def collectives_per_step(num_hidden_layers: int) -> int:
    """Collectives in one TP forward pass: embedding all-reduce + 2 per layer + LM-head gather."""
    if num_hidden_layers < 1:
        raise ValueError(f"num_hidden_layers ({num_hidden_layers}) must be >= 1")
    return 2 * num_hidden_layers + 2


def _rank_main(rank: int, world_size: int, port: int, numels: tuple[int, ...], iters: int,
               threads: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        rows = []
        for numel in numels:
            x = torch.ones(numel, dtype=torch.float32)
            for _ in range(max(3, iters // 10)):
                dist.all_reduce(x)
            dist.barrier()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - t0)
            times.sort()
            rows.append({"numel": numel, "bytes": numel * 4,
                         "median_us": statistics.median(times) * 1e6,
                         "p90_us": times[int(0.9 * (len(times) - 1))] * 1e6})
        if rank == 0:
            queue.put(("ok", rows))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put(("error", f"rank {rank}: {type(e).__name__}: {e}"))


def allreduce_latency(world_size: int = 2, numels: tuple[int, ...] = (256, 4096, 65536),
                      iters: int = 200, threads: int = 1) -> list[dict[str, Any]]:
    """Median / p90 microseconds per gloo all-reduce of fp32 tensors of each size, measured on
    rank 0 of `world_size` fresh processes."""
    from workbench.executor.multiproc_executor import get_open_port

    if world_size < 2:
        raise ValueError(f"world_size ({world_size}) must be >= 2 to time a collective")
    if iters < 1 or not numels or min(numels) < 1:
        raise ValueError(f"iters ({iters}) and every numel ({numels}) must be >= 1")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = get_open_port()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, port, tuple(numels), iters, threads, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        kind, payload = queue.get(timeout=COLLECTIVE_TIMEOUT_S)
    finally:
        for p in procs:
            p.join(10.0)
            if p.is_alive():
                p.kill()
                p.join()
    if kind != "ok":
        raise RuntimeError(f"all-reduce benchmark failed: {payload}")
    return list(payload)
