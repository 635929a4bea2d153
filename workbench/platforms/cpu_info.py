"""What the CPU is, for keys and figures: its model name, the ISA flags that change GEMM
kernels, its last-level cache size (all from /proc/cpuinfo and sysfs; a fallback value when
unreadable, never an error), and the fingerprint measured choices are keyed by (the linear
backends' autotune, the compiled-forward default the config resolves).

Importing this module does not import torch (the config imports it, and the config loads
without torch); `isa()` and `machine_fingerprint()` import it when called."""

from __future__ import annotations

import platform
from pathlib import Path

CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def cpu_model_name() -> str:
    """/proc/cpuinfo's first 'model name' (else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def isa() -> str:
    """torch's CPU capability plus the flags that change GEMM kernels (AVX-512, AMX)."""
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        flags = set()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
    import torch

    return " ".join([torch.backends.cpu.get_cpu_capability(), *(f for f in wanted if f in flags)])


def last_level_cache_bytes(root: Path = CPU_CACHE_DIR) -> int:
    """The largest cache cpu0 sees (its last level), from sysfs; 0 when unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    best = 0
    for index in sorted(root.glob("index*")):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = units.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].upper() in units else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best


def machine_fingerprint(cpu: str | None = None) -> str:
    """What a measured kernel choice is keyed by: CPU model (`cpu`, default this one's), ISA,
    torch version and torch's thread count."""
    import torch

    cpu = cpu_model_name() if cpu is None else cpu
    return f"cpu={cpu}; isa={isa()}; torch={torch.__version__}; threads={torch.get_num_threads()}"
