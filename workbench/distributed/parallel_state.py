"""Parallel state: this process's tensor-parallel rank and group (vLLM's parallel_state).

One process = one TP rank. The world is the TP group (no pipeline or data parallelism here):

    rank 0 (engine process)        rank 1 .. N-1 (spawned workers, or torchrun peers)
    init_distributed_environment(world_size=N, rank=r, "tcp://127.0.0.1:PORT", backend)
        backend: "gloo" on CPU, "nccl" on CUDA (device cuda:local_rank)

Layers read `get_tensor_model_parallel_rank()` / `..._world_size()` once, at construction, to
size their shard; forward() uses the group through `communication_op`. The construction view
can be pinned with `tensor_parallel_scope(rank, size)`: the model runner builds a TP=1 model
under `(0, 1)`, so a TP=1 engine works beside a TP engine in the same process, and tests build
rank r's layers without a process group (weight sharding only: no forward).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# A collective waits at most this long for its peers (gloo's default is 30 min). A dead peer
# is noticed at once (its sockets close); this only bounds a hung one.
DIST_TIMEOUT_S = 300


@dataclass(frozen=True)
class TensorParallelGroup:
    """vLLM's GroupCoordinator, reduced to what one TP group needs."""

    rank: int
    world_size: int
    backend: str  # "gloo" | "nccl"
    device: torch.device  # where the collectives' tensors live
    local_rank: int = 0


_TP: TensorParallelGroup | None = None
_SCOPE: tuple[int, int] | None = None  # (rank, world_size) seen by layers under construction


def default_backend(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_distributed_environment(
    world_size: int,
    rank: int,
    distributed_init_method: str = "env://",
    backend: str | None = None,
    local_rank: int = 0,
    device: str = "cpu",
    timeout_s: float = DIST_TIMEOUT_S,
) -> TensorParallelGroup:
    """Join the process group (blocks until all `world_size` ranks have joined) and make it
    this process's TP group. One TP group per process: a second call is a RuntimeError."""
    global _TP
    if _TP is not None or dist.is_initialized():
        raise RuntimeError(
            "this process already is a tensor-parallel rank (one TP engine per process); "
            "shut the other engine down first (LLM.close())"
        )
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    backend = backend or default_backend(dev)
    dist.init_process_group(
        backend, init_method=distributed_init_method, world_size=world_size, rank=rank,
        timeout=timedelta(seconds=timeout_s),
    )
    _TP = TensorParallelGroup(rank, world_size, backend, dev, local_rank)
    return _TP


def init_from_torchrun_env(device: str = "cpu") -> TensorParallelGroup:
    """external_launcher: the rank, world size and rendezvous come from torchrun's env vars."""
    need = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [k for k in need if k not in os.environ]
    if missing:
        raise ValueError(
            f"distributed_executor_backend ('external_launcher') needs {', '.join(missing)} in "
            "the environment: start every rank with torchrun (python -m torch.distributed.run "
            "--nproc-per-node N script.py), or use distributed_executor_backend='mp'"
        )
    return init_distributed_environment(
        world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]),
        distributed_init_method="env://", local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        device=device,
    )


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> TensorParallelGroup:
    if _TP is None:
        raise RuntimeError("tensor parallelism is not initialized in this process")
    return _TP


def get_tensor_model_parallel_rank() -> int:
    if _SCOPE is not None:
        return _SCOPE[0]
    return _TP.rank if _TP is not None else 0


def get_tensor_model_parallel_world_size() -> int:
    if _SCOPE is not None:
        return _SCOPE[1]
    return _TP.world_size if _TP is not None else 1


@contextlib.contextmanager
def tensor_parallel_scope(rank: int, world_size: int) -> Iterator[None]:
    """Layers built inside see (rank, world_size) whatever the process group says."""
    global _SCOPE
    if not 0 <= rank < world_size:
        raise ValueError(f"rank ({rank}) must be in 0..{world_size - 1} (world_size)")
    old, _SCOPE = _SCOPE, (rank, world_size)
    try:
        yield
    finally:
        _SCOPE = old


def destroy_distributed_environment() -> None:
    """Leave the process group (a no-op when this process is not a TP rank)."""
    global _TP
    if _TP is None:
        return
    _TP = None
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_for_tensor_parallel_size(tp_size: int) -> int:
    """This process's TP rank for a model built with `tp_size` ranks: 0 when tp_size is 1,
    else the initialized group's rank (a RuntimeError when there is none of that size)."""
    if tp_size == 1:
        return 0
    if _TP is None or _TP.world_size != tp_size:
        have = "none" if _TP is None else f"one of {_TP.world_size} ranks"
        raise RuntimeError(
            f"tensor_parallel_size ({tp_size}) needs a TP group of {tp_size} ranks in this "
            f"process ({have} is initialized); build engines through LLM / LLMEngine, which "
            "start the ranks (workbench.executor.tp_model_runner.create_model_runner)"
        )
    return _TP.rank
