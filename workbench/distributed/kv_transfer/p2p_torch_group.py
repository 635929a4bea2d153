"""A two-rank torch.distributed group between a KV consumer and a producer, made without the
global default group: the consumer hosts a `TCPStore` (rank 0), the producer joins it
(rank 1), and each side constructs `ProcessGroupGloo` or `ProcessGroupNCCL` directly on it.
`p2p_torch_transport` forms one per pair and moves the KV payload over it.

The backend follows the KV cache (`torch_dist_backend` "auto"): NCCL for a CUDA cache, gloo
for a CPU one. gloo on a CUDA cache stages the payload through host memory: two instances on
one GPU cannot use NCCL, which refuses two ranks on one device.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

CONSUMER, PRODUCER = 0, 1  # ranks in a pair's group


def backend_for(device: torch.device, requested: str = "auto") -> str:
    """The process-group backend that moves KV on `device` (`torch_dist_backend`): auto is
    nccl on CUDA, gloo on CPU; gloo on any device stages through host memory."""
    where = "kv_transfer_config kv_connector_extra_config"
    if requested == "gloo" or (requested == "auto" and device.type == "cpu"):
        return "gloo"
    if device.type == "cuda":
        return "nccl"
    if requested == "nccl":
        raise ValueError(f"{where} torch_dist_backend ('nccl') needs a CUDA KV cache; this "
                         f"one is on {device.type}: use 'gloo' or 'auto'")
    raise ValueError(f"{where} transport ('torch_dist') needs a KV cache on cpu (gloo) or cuda "
                     f"(nccl), or torch_dist_backend 'gloo'; this one is on {device.type}")


def master_store(host: str, timeout_s: float) -> tuple[Any, int]:
    """The consumer's store, listening on `host` (a free port): (store, port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, 0), family=family)
    port = listener.getsockname()[1]
    store = dist.TCPStore(host, port, 2, True, timedelta(seconds=timeout_s),
                          wait_for_workers=False, master_listen_fd=listener.detach(),
                          use_libuv=True)
    return store, port


def new_process_group(backend: str, store: Any, rank: int, timeout_s: float, host: str,
                      device: torch.device) -> Any:
    """A two-rank group on `store`; blocks until the other rank has joined."""
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        # torch's stubs declare neither ProcessGroupGloo._Options (the gloo options) nor the
        # (store, rank, size, options) constructor that takes them, both there at runtime
        gloo: Any = dist.ProcessGroupGloo
        opts = gloo._Options()
        opts._timeout = timeout
        opts._devices = [gloo.create_device(hostname=host)]
        opts._threads = 1  # send/recv do not use the worker threads
        return gloo(store, rank, 2, opts)
    # a peer's death aborts the communicator instead of the process (torch's default is to
    # tear the process down); read when the group is constructed
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    nccl_opts = dist.ProcessGroupNCCL.Options()
    # longer than our own deadlines: we abort a stuck group before torch's watchdog does
    nccl_opts._timeout = timedelta(seconds=2 * timeout_s + 60)
    pg = dist.ProcessGroupNCCL(store, rank, 2, nccl_opts)
    pg.eager_connect_single_device(device)  # the communicator now, not in the first send
    return pg


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def host_bytes(frame: Any) -> Any:
    """A payload frame as bytes for the ZeroMQ wire."""
    return flat_bytes(frame).cpu().numpy() if isinstance(frame, torch.Tensor) else frame


@dataclass
class PairGroup:
    """One pair's process group. `pg` is None while the producer's join thread runs."""

    peer: str  # the other side: the consumer's uid (producer) or host (consumer)
    epoch: int  # its connection count: a reconnect replaces the group
    backend: str
    store: Any = None
    pg: Any = None
    error: str | None = None  # producer: the join failed
    tags: Any = field(default_factory=itertools.count)
    # producer: posts and waits for this pair's sends (the consumer reads one at a time)
    sender: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="kv-torch-send"))

    def close(self) -> None:
        self.sender.shutdown(wait=False)
        pg, self.pg, self.store = self.pg, None, None
        if pg is not None and self.backend == "nccl":
            try:
                pg.abort()  # a send or recv still on the stream ends now
            except Exception:  # noqa: BLE001 - the group is dropped either way
                logger.exception("aborting the NCCL group with %s failed", self.peer)
        # gloo: once the last reference (and the last pending operation's) is gone, its
        # connections close and the peer's pending send or recv fails at once


@dataclass
class Peer:
    """Consumer side: one producer's group; `lock` serialises the reads from it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    group: PairGroup | None = None
