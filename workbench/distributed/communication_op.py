"""Collectives over the TP group (vLLM's communication_op names).

    RowParallelLinear / VocabParallelEmbedding:  partial sums  -> all_reduce  -> full sum
    ParallelLMHead:                              vocab shards  -> all_gather  -> all logits

Every rank of the group must call the same collectives in the same order with tensors of the
same shape: that is why the TP workers run the very same batch as rank 0 every step. With one
rank these are identities.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workbench.distributed.parallel_state import get_tp_group, model_parallel_is_initialized


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over the ranks, in place; every rank gets the same (bitwise) result."""
    if not model_parallel_is_initialized() or get_tp_group().world_size == 1:
        return x
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The ranks' `x` concatenated along `dim`, in rank order, on every rank."""
    if not model_parallel_is_initialized():
        return x
    world = get_tp_group().world_size
    if world == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=dim)


def broadcast_int_from_rank0(value: int) -> int:
    """Rank 0's `value` on every rank (external_launcher: every rank runs the engine)."""
    if not model_parallel_is_initialized():
        return value
    group = get_tp_group()
    t = torch.tensor([value], dtype=torch.int64, device=group.device)
    dist.broadcast(t, src=0)
    return int(t.item())
