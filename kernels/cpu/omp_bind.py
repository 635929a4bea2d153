"""Loader of `omp_bind.cpp`: pin the calling thread's OpenMP team to CPUs, one thread each.

`bind(cpus, n)` returns each team thread's allowed CPUs after pinning ([[0], [1]]), or None
when the extension cannot be built (the caller then runs unpinned); `affinity(n)` reads them.
Policy (when, which CPUs) lives in `workbench.worker.cpu_threads`.
"""

from __future__ import annotations

from pathlib import Path

from kernels.cpu.build import CpuExtension

EXTENSION = CpuExtension("omp_bind", [Path(__file__).with_name("omp_bind.cpp")])


def bind(cpus: list[int], n: int) -> list[list[int]] | None:
    module = EXTENSION.load()
    return None if module is None else [list(c) for c in module.bind(list(cpus), int(n))]


def affinity(n: int) -> list[list[int]] | None:
    module = EXTENSION.load()
    return None if module is None else [list(c) for c in module.affinity(int(n))]
