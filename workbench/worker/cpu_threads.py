"""Pin the engine's OpenMP threads to CPUs, one thread per CPU (vLLM-CPU's
VLLM_CPU_OMP_THREADS_BIND, same grammar minus the per-rank "|" lists).

WORKBENCH_CPU_OMP_THREADS_BIND:
    nobind    (default) leave the threads to the OS scheduler
    auto      thread i of the forward's team -> the i-th CPU this process may use
    0-3,6     thread i -> the i-th CPU of this list (wrapping when threads outnumber CPUs)

Unpinned threads migrate, and a barrier waits for the slowest: on the 2-core EPYC of
docs/benchmarks.md the bench model's run-to-run spread shrank and its median rose ~10% when
pinned (vLLM-best pins too). The default stays "nobind", unlike vLLM's "auto", because this
bench often runs several engines on one machine (the test workers, router replicas, the
notebooks' pairs): pinned the same way, every engine's main thread would share CPU 0. The
offline benchmark pins its engine ("auto"), as its vllm-best peer is pinned.

libgomp keeps a thread pool per thread that opens parallel regions, so the team is pinned
from the thread that runs the forward, the first time it does (`bind_this_thread`).
"""

from __future__ import annotations

import os
import threading

ENV = "WORKBENCH_CPU_OMP_THREADS_BIND"
GRAMMAR = 'nobind, auto, or a CPU list such as "0-3,6"'
_ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
_local = threading.local()
_status = "nobind (not run yet)"


def parse_cpus(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]; ValueError naming the variable, the value and the form."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            a, b = int(lo), int(hi if dash else lo)
            if a < 0 or b < a:
                raise ValueError(part)
            cpus += range(a, b + 1)
    except ValueError:
        raise ValueError(f"{ENV} ({text!r}) must be {GRAMMAR}") from None
    unknown = sorted(set(cpus) - set(_ALLOWED)) if _ALLOWED else []
    if unknown:
        raise ValueError(f"{ENV} ({text!r}) names CPUs {unknown} this process may not use "
                         f"(allowed: {_ALLOWED})")
    return cpus


def policy() -> str | list[int]:
    """"nobind", "auto" or the CPU list, read from the environment and checked."""
    value = os.environ.get(ENV, "nobind").strip()
    if value in ("nobind", "auto"):
        return value
    return parse_cpus(value)


def bind_this_thread(num_threads: int, tp_size: int = 1) -> None:
    """Pin the calling thread's `num_threads`-thread OpenMP team per the policy, once per
    thread. Never raises: what happened is in `status()`."""
    global _status
    if getattr(_local, "done", False):
        return
    _local.done = True
    try:
        chosen = policy()
    except ValueError as e:
        _status = f"nobind ({e})"
        return
    if chosen == "nobind":
        _status = f"nobind ({ENV} unset or nobind)"
        return
    if tp_size > 1:
        _status = f"nobind (tensor_parallel_size {tp_size}: ranks would share the CPUs)"
        return
    cpus = _ALLOWED if isinstance(chosen, str) else chosen  # "auto" (policy() names only it)
    from kernels.cpu import omp_bind

    try:
        got = omp_bind.bind(list(cpus), num_threads)
    except RuntimeError as e:
        _status = f"nobind ({e})"
        return
    if got is None:
        _status = f"nobind (omp_bind unavailable: {omp_bind.EXTENSION.unavailable_reason()})"
        return
    pairs = ", ".join(f"{i}->{c[0] if len(c) == 1 else c}" for i, c in enumerate(got))
    how = "auto" if chosen == "auto" else os.environ[ENV]
    _status = f"bound ({how}): OpenMP thread->CPU {pairs}"


def unpin() -> None:
    """Give the calling thread every CPU the process had at start. A child process inherits
    its spawner's affinity, so a peer spawned from a pinned thread passes this as
    `preexec_fn` (it runs in the child, before exec)."""
    if _ALLOWED:
        os.sched_setaffinity(0, _ALLOWED)


def status() -> str:
    """The last binding decision in this process, for the engine's notes."""
    return _status
