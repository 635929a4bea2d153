"""Pinning the forward's OpenMP threads (workbench.worker.cpu_threads, kernels/cpu/omp_bind):
the policy read from WORKBENCH_CPU_OMP_THREADS_BIND and refused when malformed, and the team
really pinned one thread per CPU (read back from the kernel), in a child process so this test
process stays unpinned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.worker import cpu_threads

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = sorted(os.sched_getaffinity(0))


def test_cpu_lists_parse_like_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "_ALLOWED", list(range(8)))
    assert cpu_threads.parse_cpus("0-3,6") == [0, 1, 2, 3, 6]
    assert cpu_threads.parse_cpus(" 5 ") == [5]
    for bad in ("", "a", "3-1", "1-", "-2", "0,,1"):
        with pytest.raises(ValueError, match=r"WORKBENCH_CPU_OMP_THREADS_BIND \(.*\) must be "
                                             r"nobind, auto, or a CPU list"):
            cpu_threads.parse_cpus(bad)
    with pytest.raises(ValueError, match=r"names CPUs \[8, 9\] this process may not use"):
        cpu_threads.parse_cpus("7-9")


def test_policy_defaults_to_nobind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_threads.ENV, raising=False)
    assert cpu_threads.policy() == "nobind"
    monkeypatch.setenv(cpu_threads.ENV, "auto")
    assert cpu_threads.policy() == "auto"
    monkeypatch.setenv(cpu_threads.ENV, "bogus")
    with pytest.raises(ValueError, match="'bogus'"):
        cpu_threads.policy()


CHILD = """
import torch
from kernels.cpu import omp_bind
from workbench.worker import cpu_threads
n = 2
cpu_threads.bind_this_thread(n)
cpu_threads.bind_this_thread(n)  # once per thread: a second call changes nothing
print(cpu_threads.status())
print(omp_bind.affinity(n))
"""


def run_child(value: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != cpu_threads.ENV}
    if value is not None:
        env[cpu_threads.ENV] = value
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    return out.stdout.strip().splitlines()[-2:]


def test_auto_pins_thread_i_to_the_ith_cpu() -> None:
    status, affinity = run_child("auto")
    want = [[ALLOWED[i % len(ALLOWED)]] for i in range(2)]
    assert affinity == str(want)
    pairs = ", ".join(f"{i}->{c[0]}" for i, c in enumerate(want))
    assert status == f"bound (auto): OpenMP thread->CPU {pairs}"


def test_nobind_leaves_the_threads_free() -> None:
    status, affinity = run_child(None)
    assert status == "nobind (WORKBENCH_CPU_OMP_THREADS_BIND unset or nobind)"
    assert affinity == str([ALLOWED, ALLOWED])


def test_a_cpu_list_is_followed() -> None:
    last = str(ALLOWED[-1])
    status, affinity = run_child(last)
    assert affinity == str([[ALLOWED[-1]], [ALLOWED[-1]]])  # wraps: 2 threads, 1 CPU
    assert status == f"bound ({last}): OpenMP thread->CPU 0->{last}, 1->{last}"


def test_tensor_parallel_ranks_are_not_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_threads.ENV, "auto")
    monkeypatch.setattr(cpu_threads, "_local", type(cpu_threads._local)())
    cpu_threads.bind_this_thread(2, tp_size=2)  # decided before anything is pinned
    assert cpu_threads.status() == (
        "nobind (tensor_parallel_size 2: ranks would share the CPUs)")


SPAWN = """
import subprocess, sys
import torch
from workbench.worker import cpu_threads
cpu_threads.bind_this_thread(2)
show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
print(subprocess.run(show, capture_output=True, text=True).stdout.strip())
print(subprocess.run(show, capture_output=True, text=True,
                     preexec_fn=cpu_threads.unpin).stdout.strip())
"""


def test_a_peer_spawned_from_a_pinned_thread_gets_every_cpu_back() -> None:
    env = {**os.environ, cpu_threads.ENV: "auto"}
    out = subprocess.run([sys.executable, "-c", SPAWN], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True, timeout=300).stdout.strip().splitlines()
    assert out[-2:] == [str(ALLOWED[:1]), str(ALLOWED)]  # inherited pin, then unpinned
