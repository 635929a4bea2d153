"""MultiprocExecutor: rank 0's handle on the spawned TP workers (vLLM's "mp" backend).

    engine process (rank 0)                         worker rank r (spawned)
    MultiprocExecutor(config)
      spawn N-1 workers, one duplex Pipe each  -->  worker_main: "hello"
      init_distributed_environment(rank 0)  <====>  init_distributed_environment(rank r)
      (rank 0 builds its ModelRunner)               builds its ModelRunner shard
      wait_ready()                             <--  "ready" (or "error" + traceback)
      per step: send_step(SchedulerOutput)     -->  execute_model (no reply)
      send_call(...) / collect_replies()       <->  ("ok", result)
      shutdown(): "shutdown", join, terminate, kill

Transport: each message is pickled once and written to every worker's pipe (a local
multiprocessing Pipe, not a torch.distributed object broadcast: it works beside NCCL and under
any backend, and the same pipe carries the workers' errors back). `broadcast_stats()` reports
what one step's send costs (pickle + pipe writes, bytes). Measured on the shared 2-core CPU
with the earlier StepInput encoding of the same delta, TP=2, 16 decoding requests (~1.4 KB a
step): send median 72 us (pickle ~40 us of it), p90
~470 us (the OS waking the worker on a busy machine), worker decode ~60 us, against a 5.6 ms
step of the tiny test model: 1-3 % of a step.

Failure handling: a worker that raises sends its traceback and exits; rank 0's next collective
then fails (gloo notices the closed socket at once) and `fail()` re-raises the worker's
traceback as a RuntimeError after stopping every worker. Any other exception on rank 0 inside
a step or a call also stops the workers (they may be blocked in a collective rank 0 will
never join) before it propagates. A `weakref.finalize` stops the workers when the executor is
collected or at interpreter exit. NCCL does not notice a dead peer: there a worker crash can
leave rank 0 waiting until the collective timeout (parallel_state.DIST_TIMEOUT_S).

CPU threads: with N ranks on one machine each rank uses max(1, os.cpu_count() // N) intra-op
threads (torch.set_num_threads), or OMP_NUM_THREADS when that is set (the usual meaning:
threads per process, so `workbench router --replica-threads 1` gives every TP rank one
thread, like every replica); rank 0's previous setting is restored at shutdown.

Spawn, not fork (a forked torch process with threads or CUDA is unsafe): like any spawning
program, a script that builds a TP engine needs the `if __name__ == "__main__":` guard, since
each worker re-imports the main module (notebooks, pytest and `workbench serve` need nothing).
A program whose main module cannot be re-read (a script fed on standard input, `python -
<<EOF`) is refused before anything is spawned (`main_module.py`), and a worker that exits
during start-up gets the same advice in its error, as in vLLM.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch

from workbench.config import EngineConfig
from workbench.core.sched.output import SchedulerOutput
from workbench.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    model_parallel_is_initialized,
)
from workbench.executor.main_module import MAIN_ADVICE, main_module_problem
from workbench.worker.tp_worker import worker_main

STARTUP_TIMEOUT_S = 600.0  # a worker's imports + model load
ERROR_GRACE_S = 0.5  # after a failed collective: how long to wait for a worker's traceback
JOIN_TIMEOUT_S = 2.0


def get_open_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads of each of `world_size` ranks on this machine: OMP_NUM_THREADS when it
    is a positive integer, else an equal share of the cores (at least 1)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return max(1, (os.cpu_count() or 1) // world_size)


def _stop_processes(procs: list[Any], conns: list[Connection]) -> None:
    """Ask each worker to exit, then terminate / kill the ones still alive."""
    for conn in conns:
        try:
            conn.send_bytes(pickle.dumps(("shutdown",)))
        except (OSError, ValueError):
            pass  # already gone or closed
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(JOIN_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()
    for conn in conns:
        conn.close()


class WorkerError(RuntimeError):
    """A TP worker failed; the message carries its traceback."""


class WorkerDied(WorkerError):
    """A TP worker exited or closed its pipe without reporting an error."""


class MultiprocExecutor:
    backend = "mp"

    def __init__(self, config: EngineConfig) -> None:
        n = config.parallel_config.tensor_parallel_size
        if model_parallel_is_initialized():
            raise RuntimeError(
                "this process already is a tensor-parallel rank (one TP engine per process); "
                "shut the other engine down first (LLM.close())"
            )
        self._check(config)
        self.world_size = n
        self._old_threads = torch.get_num_threads()
        self.num_threads = threads_per_rank(n)
        if config.device == "cpu":
            torch.set_num_threads(self.num_threads)
        self.procs: list[Any] = []  # BaseProcess, or a handle with its methods (RayWorkerHandle)
        self.conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop_processes, self.procs, self.conns)
        self.num_broadcasts = 0
        self.broadcast_bytes = 0
        self.broadcast_s = 0.0  # pickle + pipe writes, summed over steps
        self.pickle_s = 0.0
        self._closed = False
        self._owns_group = False
        try:
            init_method = self._start_workers(config)
            for rank in range(1, n):
                try:
                    self._expect(rank, "hello", STARTUP_TIMEOUT_S)
                except WorkerDied as e:
                    raise WorkerDied(f"{e} during start-up {self._startup_advice()}") from None
            init_distributed_environment(n, 0, init_method, device=config.device)
            self._owns_group = True
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- start-up
    def _check(self, config: EngineConfig) -> None:
        """Refuse what this backend cannot start, before anything is started."""
        n = config.parallel_config.tensor_parallel_size
        if config.device == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(
                f"tensor_parallel_size ({n}) needs {n} CUDA devices; "
                f"{torch.cuda.device_count()} visible"
            )
        problem = main_module_problem()
        if problem is not None:
            raise RuntimeError(
                f"tensor_parallel_size ({n}) starts {n - 1} worker process(es) with the 'spawn' "
                f"method; {problem}. To use tensor parallelism, {MAIN_ADVICE}."
            )

    def _start_workers(self, config: EngineConfig) -> str:
        """Start ranks 1..N-1 (appending to `procs` and `conns` in rank order); the
        torch.distributed init method every rank joins with."""
        ctx = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{get_open_port()}"
        for rank in range(1, self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(
                target=worker_main, name=f"TPWorker-{rank}", daemon=True,
                args=(config, rank, self.world_size, init_method, child_end, os.getpid(),
                      self.num_threads),
            )
            p.start()
            child_end.close()
            self.procs.append(p)
            self.conns.append(parent_end)
        return init_method

    def _startup_advice(self) -> str:
        return ("(its own error is on stderr above). A spawned worker first re-runs this "
                "program's main module, which must build the LLM only under "
                f"`if __name__ == \"__main__\":`; {MAIN_ADVICE}.")

    # ----------------------------------------------------------------- replies
    def _recv(self, rank: int, timeout_s: float) -> tuple[Any, ...]:
        """The next message from worker `rank`; a WorkerError for its "error" message, or when
        it dies or stays silent past `timeout_s`."""
        conn, proc = self.conns[rank - 1], self.procs[rank - 1]
        deadline = time.monotonic() + timeout_s
        while not conn.poll(0.05):
            if not proc.is_alive():
                if conn.poll(0.05):
                    break  # it wrote its traceback before exiting
                raise WorkerDied(
                    f"tensor-parallel worker rank {rank} exited (exit code {proc.exitcode})"
                )
            if time.monotonic() > deadline:
                raise WorkerError(f"tensor-parallel worker rank {rank}: no reply in {timeout_s} s")
        try:
            msg = conn.recv()
        except EOFError:
            raise WorkerDied(
                f"tensor-parallel worker rank {rank} closed its pipe (exit code {proc.exitcode})"
            ) from None
        if msg[0] == "error":
            raise WorkerError(f"tensor-parallel worker rank {rank} failed:\n{msg[1]}")
        return msg

    def _expect(self, rank: int, kind: str, timeout_s: float) -> Any:
        msg = self._recv(rank, timeout_s)
        if msg[0] != kind:
            raise WorkerError(f"tensor-parallel worker rank {rank} sent {msg[0]!r}, not {kind!r}")
        return msg[1]

    def wait_ready(self) -> None:
        """Block until every worker has built its model (after rank 0 built its own)."""
        try:
            for rank in range(1, self.world_size):
                self._expect(rank, "ready", STARTUP_TIMEOUT_S)
        except BaseException as e:
            self.fail(e)

    # ------------------------------------------------------------------- sends
    def _send(self, msg: tuple[Any, ...]) -> tuple[int, float]:
        """Pickle once, write to every worker; returns (bytes, seconds spent pickling)."""
        if self._closed:
            raise RuntimeError(
                "the tensor-parallel workers have shut down (after LLM.close() or an error); "
                "build a new LLM"
            )
        t0 = time.perf_counter()
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        pickle_s = time.perf_counter() - t0
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as e:
            self.fail(e)
        return len(data), pickle_s

    def send_step(self, step: SchedulerOutput) -> None:
        """One step's message, as rank 0's runner gets it (no reply): timed and counted for
        broadcast_stats()."""
        t0 = time.perf_counter()
        nbytes, pickle_s = self._send(("step", step))
        self.broadcast_s += time.perf_counter() - t0
        self.pickle_s += pickle_s
        self.broadcast_bytes += nbytes
        self.num_broadcasts += 1

    def send_call(self, method: str, args: tuple[Any, ...] = (),
                  kwargs: dict[str, Any] | None = None) -> None:
        self._send(("call", method, args, kwargs or {}))

    def collect_replies(self, timeout_s: float = STARTUP_TIMEOUT_S) -> list[Any]:
        """The workers' results of the last send_call, by rank (1..N-1)."""
        try:
            return [self._expect(rank, "ok", timeout_s) for rank in range(1, self.world_size)]
        except BaseException as e:
            self.fail(e)

    def broadcast_stats(self) -> dict[str, float]:
        n = max(1, self.num_broadcasts)
        return {
            "num_broadcasts": self.num_broadcasts,
            "mean_send_us": 1e6 * self.broadcast_s / n,
            "mean_pickle_us": 1e6 * self.pickle_s / n,
            "mean_bytes": self.broadcast_bytes / n,
        }

    # ---------------------------------------------------------------- failures
    def worker_errors(self, wait_s: float = ERROR_GRACE_S) -> list[str]:
        """Tracebacks (or exit notes) of workers that failed, waiting up to `wait_s` for one
        still writing; a healthy worker (maybe blocked in a collective) reports nothing."""
        errors: list[str] = []
        deadline = time.monotonic() + wait_s
        for i, (conn, proc) in enumerate(zip(self.conns, self.procs, strict=True)):
            try:
                ready = conn.poll(max(0.0, deadline - time.monotonic()))
                if ready:
                    msg = conn.recv()
                    if msg[0] == "error":
                        errors.append(f"tensor-parallel worker rank {i + 1} failed:\n{msg[1]}")
                        continue
            except (EOFError, OSError):
                pass
            if not proc.is_alive() and proc.exitcode not in (0, None):
                errors.append(f"tensor-parallel worker rank {i + 1} exited "
                              f"(exit code {proc.exitcode})")
        return errors

    def fail(self, exc: BaseException) -> NoReturn:
        """Stop every worker and raise: the workers' tracebacks when one failed (chained to
        rank 0's own error), else `exc` itself."""
        errors = [] if isinstance(exc, WorkerError) else self.worker_errors()
        self.shutdown(graceful=False)
        if errors:
            raise WorkerError("\n".join(errors)) from exc
        raise exc

    # ---------------------------------------------------------------- shutdown
    def shutdown(self, graceful: bool = True) -> None:
        """Stop the workers (graceful: ask, wait up to JOIN_TIMEOUT_S, then terminate; else
        terminate at once: after a failure they may be blocked in a collective), leave the
        process group, restore rank 0's thread count. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not graceful:
            for p in self.procs:
                p.terminate()
        self._finalizer()
        if self._owns_group:
            destroy_distributed_environment()
        torch.set_num_threads(self._old_threads)
