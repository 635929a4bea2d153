"""The machine's side of the roofline: its peak fp32 FLOP rate and memory bandwidth, measured
at the start and at the end of a benchmark, and whether the two agree well enough to divide by.

Owned here: `measure_fp32_gflops` (the best n x n x n GEMM over the engine's linear
backends, `measure_gemm_gflops` each backend's), `measure_stream` (STREAM-like copy `a = b`
and triad `a = b + s c` on fp32 tensors well past the last-level cache, best of N; bytes
counted as STREAM does: 2 and 3 arrays, no write-allocate), `measure_machine` (both under
a `CpuWatch`, redone while others are busy) and `check_machine` (start vs end). The
workload's side, the engine's schedule and what each step costs, is
`workbench.planning.roofline` (also `workbench.planning.schedule_roofline`).

A roofline fraction is refused (`RooflineCheck.valid` False, with the reasons) when start and
end differ by more than `MAX_DRIFT` (10%) in either figure (max / min - 1), or when other
processes took more than `max_others` of the CPUs during a measurement: the bound would then
be a property of the neighbours as much as of the machine. The figure used is the best of
start and end (a roofline is the best case). A figure stated on the command line
(`--gflops`, `--bandwidth-gbs`) is used as is and not checked.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.harness.validity import CpuWatch, default_cpu_watch
from workbench.planning.roofline import DecoderShape, request_flops
from workbench.platforms.cpu_info import last_level_cache_bytes

__all__ = ["DecoderShape", "request_flops", "MAX_DRIFT", "MachineRates", "RooflineCheck",
           "StreamFigures", "check_machine", "cpu_summary", "last_level_cache_bytes",
           "measure_fp32_gflops", "measure_gemm_gflops", "measure_machine",
           "measure_stream"]

MAX_DRIFT = 0.10  # start and end may differ by this much (max / min - 1), each figure
MIN_STREAM_BYTES = 64 << 20  # per array, whatever the cache says


def measure_gemm_gflops(n: int = 2048, reps: int = 5) -> dict[str, float]:
    """Best fp32 GFLOP/s of an n x n x n GEMM on each linear backend this torch build runs
    (`workbench.layers.linear_backend`: torch's sgemm, MKL packed, oneDNN packed), best of
    `reps` runs after one warm-up each, with torch's current thread count."""
    import torch

    from workbench.layers.linear_backend import available_backends, runner

    x = torch.randn(n, n, dtype=torch.float32)
    w = torch.randn(n, n, dtype=torch.float32)
    rates: dict[str, float] = {}
    for backend in available_backends():
        fn = runner(backend, w)
        fn(x)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            best = min(best, time.perf_counter() - t0)
        rates[backend] = 2.0 * n**3 / best / 1e9
    return rates


def measure_fp32_gflops(n: int = 2048, reps: int = 5) -> float:
    """The machine's fp32 peak as the engine can reach it: the fastest linear backend's
    GFLOP/s (`measure_gemm_gflops`; the engine autotunes its linears over the same backends,
    so a peak from `torch.mm` alone would understate it where oneDNN is faster)."""
    return max(measure_gemm_gflops(n, reps).values())


@dataclass(frozen=True)
class StreamFigures:
    """Best copy and triad rates (GB/s, 10^9 bytes/s) on arrays of `array_bytes` each."""

    copy_gbs: float
    triad_gbs: float
    array_bytes: int

    @property
    def gbs(self) -> float:
        """The bandwidth the roofline uses: the better of the two."""
        return max(self.copy_gbs, self.triad_gbs)


def measure_stream(array_bytes: int | None = None, reps: int = 5) -> StreamFigures:
    """STREAM-like copy and triad with torch's current threads, best of `reps` each after a
    warm-up; arrays of `array_bytes` (default: 4 x the last-level cache, at least 64 MiB)."""
    import torch

    if array_bytes is None:
        array_bytes = max(4 * last_level_cache_bytes(), MIN_STREAM_BYTES)
    n = array_bytes // 4
    a = torch.zeros(n, dtype=torch.float32)
    b = torch.ones(n, dtype=torch.float32)
    c = torch.full((n,), 2.0, dtype=torch.float32)

    def best_s(fn: Callable[[], object]) -> float:
        fn()
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    copy_s = best_s(lambda: a.copy_(b))
    triad_s = best_s(lambda: torch.add(b, c, alpha=3.0, out=a))
    nbytes = 4 * n
    return StreamFigures(copy_gbs=2 * nbytes / copy_s / 1e9,
                         triad_gbs=3 * nbytes / triad_s / 1e9, array_bytes=nbytes)


def measure_bandwidth_gbs() -> float:
    return measure_stream().gbs


@dataclass(frozen=True)
class MachineRates:
    """One measurement of the machine: fp32 GFLOP/s and memory GB/s; `*_stated` when given
    on the command line instead; `others_cpu` the share of the CPUs other processes used
    meanwhile (NaN: not measured); `redone` measurements repeated because of them."""

    gflops: float
    bandwidth_gbs: float
    gflops_stated: bool = False
    bandwidth_stated: bool = False
    others_cpu: float = float("nan")
    redone: int = 0

    def __post_init__(self) -> None:
        for name in ("gflops", "bandwidth_gbs"):
            value = getattr(self, name)
            if not (0 < value < math.inf):
                raise ValueError(f"{name} ({value}) must be a finite number > 0")


def measure_machine(
    gflops: float | None = None,
    bandwidth_gbs: float | None = None,
    *,
    max_others: float = 0.15,
    retries: int = 2,
    watch: CpuWatch | None = None,
    measure_gflops: Callable[[], float] = measure_fp32_gflops,
    measure_bandwidth: Callable[[], float] = measure_bandwidth_gbs,
) -> MachineRates:
    """Measure what is not stated, inside `watch` (default `validity.default_cpu_watch()`),
    redone up to `retries` times while other processes use more than `max_others` of the
    CPUs. The measuring functions are injectable (tests)."""
    watch = watch if watch is not None else default_cpu_watch()
    redone = 0
    while True:
        with watch.measure() as share:
            g = gflops if gflops is not None else measure_gflops()
            b = bandwidth_gbs if bandwidth_gbs is not None else measure_bandwidth()
        if not share.others > max_others or redone >= retries:  # NaN: kept
            return MachineRates(g, b, gflops is not None, bandwidth_gbs is not None,
                                share.others, redone)
        redone += 1


@dataclass(frozen=True)
class RooflineCheck:
    """Start vs end: the figures the roofline uses (the best of both) and whether a fraction
    of it may be reported (`valid`; otherwise `reasons`, one sentence each)."""

    start: MachineRates
    end: MachineRates
    gflops: float
    bandwidth_gbs: float
    max_drift: float
    max_others: float
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def valid(self) -> bool:
        return not self.reasons

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "reason": self.reason, "gflops": self.gflops,
                "bandwidth_gbs": self.bandwidth_gbs, "max_drift": self.max_drift,
                "max_others": self.max_others, "start": _rates_json(self.start),
                "end": _rates_json(self.end)}


def _rates_json(r: MachineRates) -> dict[str, Any]:
    d = asdict(r)
    d["others_cpu"] = None if math.isnan(r.others_cpu) else r.others_cpu
    return d


def drift(a: float, b: float) -> float:
    """max / min - 1: how far apart two positive figures are (0.1 = 10%)."""
    return max(a, b) / min(a, b) - 1


def check_machine(start: MachineRates, end: MachineRates, max_drift: float = MAX_DRIFT,
                  max_others: float = 0.15) -> RooflineCheck:
    """Judge a start/end pair (module docstring): refused on a drift above `max_drift` in a
    measured figure or a measurement taken while others used more than `max_others`."""
    if not max_drift >= 0:  # NaN too
        raise ValueError(f"max_drift ({max_drift}) must be >= 0")
    reasons = []
    for label, unit, stated, a, b in (
            ("fp32 GFLOP/s", "", start.gflops_stated, start.gflops, end.gflops),
            ("memory bandwidth", " GB/s", start.bandwidth_stated, start.bandwidth_gbs,
             end.bandwidth_gbs)):
        if not stated and drift(a, b) > max_drift:
            reasons.append(f"{label} moved {100 * drift(a, b):.0f}% between start ({a:.1f}"
                           f"{unit}) and end ({b:.1f}{unit}), more than {100 * max_drift:.0f}%:"
                           " the machine changed under the benchmark")
    for when, r in (("start", start), ("end", end)):
        if r.others_cpu > max_others:  # NaN (not measured) is never above
            reasons.append(f"other processes used {100 * r.others_cpu:.0f}% of the CPUs while "
                           f"the machine was measured at the {when} (threshold "
                           f"{100 * max_others:.0f}%)")
    return RooflineCheck(start=start, end=end, gflops=max(start.gflops, end.gflops),
                         bandwidth_gbs=max(start.bandwidth_gbs, end.bandwidth_gbs),
                         max_drift=max_drift, max_others=max_others, reasons=tuple(reasons))


# Environment variables that restrict the code paths torch, oneDNN, MKL and the C++ kernels take.
ISA_LIMIT_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                  "WORKBENCH_CPU_ISA")


def cpu_summary() -> str:
    """'<model name>, <n> CPUs, <widest ISA>' from /proc/cpuinfo (figures differ by ISA:
    AVX2-only machines of this kind measure ~160 fp32 GFLOP/s, AVX-512 ones ~300)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = next((name for flag, name in (("amx_tile", "AVX-512 + AMX"), ("avx512f", "AVX-512"),
                                        ("avx2", "AVX2")) if flag in flags), "no AVX2")
    limits = [f"{k}={os.environ[k]}" for k in ISA_LIMIT_VARS if os.environ.get(k)]
    if limits:  # `make bench-avx2`: an AVX2-only CPU's code paths on this one
        isa += f" (code paths limited: {' '.join(limits)})"
    return f"{model}, {os.cpu_count()} CPUs, {isa}"
