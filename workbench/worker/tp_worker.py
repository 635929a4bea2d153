"""A tensor-parallel worker (ranks 1..N-1): a spawned process ("mp") or a Ray actor ("ray").

    spawn (not fork) -> join the process group -> build its ModelRunner shard -> "ready"
    loop:  recv from rank 0's pipe
             ("step", SchedulerOutput)     -> execute_model on the same message; send nothing
             ("call", method, args, kw)    -> run it (profile_run, initialize_kv_cache, ...);
                                              send ("ok", result)
             ("shutdown",)                 -> leave the group, exit 0
           an exception -> send ("error", traceback text), exit 1 (its sockets close, so rank 0's
           pending collective fails at once and rank 0 re-raises this traceback)

The worker computes the logits (the LM head's all-gather is a collective) but does not sample
or propose drafts: its ModelRunner is not the driver worker (`is_driver_worker=False`); rank 0
samples. It exits
by itself when its parent dies: the pipe reaches EOF, and a watchdog thread checks the parent
pid (a worker blocked in a collective sees no EOF). `run_worker` is the loop both backends
share; the Ray actor (`ray_worker.py`) talks to rank 0 over a TCP connection instead of a
pipe and watches that connection instead of a parent pid.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from workbench.config import EngineConfig
from workbench.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from workbench.worker.model_runner import ModelRunner

PARENT_POLL_S = 0.5


def rank_memory_info(runner: ModelRunner) -> dict[str, Any]:
    """One rank's memory: its weight shard and KV tensors (shapes, bytes, blocks)."""
    return {
        "tp_rank": runner.tp_rank,
        "weight_bytes": runner.weight_bytes,
        "packed_weight_bytes": runner.packed_weight_bytes,
        "kv_shapes": [tuple(c.shape) for c in runner.kv_caches],
        "kv_bytes": sum(c.numel() * c.element_size() for c in runner.kv_caches),
        "num_blocks": runner.num_blocks,
        "bytes_per_block": runner.bytes_per_block,
    }


class TPWorker:
    """Rank r's model runner plus the loop that mirrors rank 0's calls."""

    def __init__(self, config: EngineConfig, rank: int) -> None:
        self.rank = rank
        self.runner = ModelRunner(config, is_driver_worker=False)
        self.num_steps = 0
        self.decode_s = 0.0  # unpickling the step messages, summed

    def broadcast_stats(self) -> dict[str, float]:
        """This worker's side of the per-step broadcast: steps received and decode seconds."""
        return {"num_steps": self.num_steps, "decode_s": self.decode_s}

    def memory_info(self) -> dict[str, Any]:
        return rank_memory_info(self.runner)

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        target = getattr(self, method, None) or getattr(self.runner, method)
        return target(*args, **kwargs)

    def run(self, conn: Connection) -> None:
        while True:
            data = conn.recv_bytes()
            t0 = time.perf_counter()
            msg = pickle.loads(data)
            kind = msg[0]
            if kind == "step":
                self.decode_s += time.perf_counter() - t0
                self.num_steps += 1
                self.runner.execute_model(msg[1])
            elif kind == "call":
                conn.send(("ok", self.call(msg[1], msg[2], msg[3])))
            elif kind == "shutdown":
                return
            else:
                raise RuntimeError(f"unknown message {kind!r} from rank 0")


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # parent gone: nobody will shut us down


def run_worker(
    config: EngineConfig,
    rank: int,
    world_size: int,
    distributed_init_method: str,
    conn: Connection,
    num_threads: int,
    local_rank: int,
) -> int:
    """Rank `rank`'s whole life over `conn` (any backend); the exit code: 0 after "shutdown",
    1 after an error (its traceback sent to rank 0) or when rank 0 is gone."""
    try:
        if config.device == "cpu":
            torch.set_num_threads(num_threads)
        conn.send(("hello", os.getpid()))
        init_distributed_environment(
            world_size, rank, distributed_init_method, local_rank=local_rank,
            device=config.device,
        )
        worker = TPWorker(config, rank)
        conn.send(("ready", None))
        worker.run(conn)
    except (EOFError, ConnectionError):
        return 1  # rank 0 is gone
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        return 1
    destroy_distributed_environment()
    conn.close()
    return 0


def worker_main(
    config: EngineConfig,
    rank: int,
    world_size: int,
    distributed_init_method: str,
    conn: Connection,
    parent_pid: int,
    num_threads: int,
) -> None:
    """The spawned process's entry point ("mp")."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    code = run_worker(config, rank, world_size, distributed_init_method, conn, num_threads,
                      local_rank=rank)
    # Skip interpreter teardown: once, in a loaded test run, a worker leaving through it
    # aborted ("terminate called without an active exception", exit code -6 instead of 0).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
