"""Transparent huge pages for the engine's large CPU buffers (the KV cache, the weights).

On the CPUs measured (docs/benchmarks.md) the decode step reads the KV cache in scattered
16 KB blocks and streams every weight once per step; with 4 KB pages both miss the TLB on
nearly every page (a two-level walk under a hypervisor): the bench model made 629-657 output
tok/s on 4 KB pages against 680-820 on 2 MB pages, in alternating runs. Linux gives huge
pages to memory marked MADV_HUGEPAGE when /sys/kernel/mm/transparent_hugepage/enabled is
"madvise" (the usual default) and to all anonymous memory when it is "always"; "never" turns
them off.

Two ways in:
- `THP_MEM_ALLOC_ENABLE=1` makes torch's CPU allocator mark every allocation of 2 MB or more
  (weights, packed weights, activations). torch reads it once, at its first allocation, so it
  only takes effect when set before torch is imported: `workbench/__init__.py` sets it when it
  is imported first (`prepare_torch_env`), unless WORKBENCH_HUGEPAGES=0. On by default: this
  is where the gain above came from.
- buffers the engine allocates itself (the KV cache) are marked before their first touch
  (`zeros`), whatever the import order was: only with WORKBENCH_HUGEPAGES=all. Off by
  default because it measured no gain (635 tok/s with only the KV cache marked) and costs at
  start: on a VM whose host backs guest memory lazily (this project's machines), faulting in
  huge pages of memory the guest has not touched recently costs ~4 s of system time per GiB
  against ~0.3 s with 4 KB pages, and the default CPU KV cache is up to 4 GiB.

WORKBENCH_HUGEPAGES: "0" keeps 4 KB pages everywhere (for A/B runs), "1" (the default) torch's
allocations, "all" torch's allocations and the KV cache.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported inside the functions: prepare_torch_env runs before it
    import torch

MADV_HUGEPAGE = 14
PAGE = 4096
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
ENV = "WORKBENCH_HUGEPAGES"  # "0" | "1" (default) | "all": see the module's docstring
CHOICES = ("0", "1", "all")
TORCH_ENV = "THP_MEM_ALLOC_ENABLE"


def _raw() -> str:
    return os.environ.get(ENV, "1").strip().lower()


def setting() -> str:
    """WORKBENCH_HUGEPAGES ("1" when unset); a value outside CHOICES is refused."""
    value = _raw()
    if value not in CHOICES:
        raise ValueError(f"{ENV} ({os.environ[ENV]!r}) must be one of {', '.join(CHOICES)}: "
                         "0 = 4 KB pages, 1 = torch's allocations >= 2 MB, "
                         "all = those and the KV cache")
    return value


def enabled() -> bool:
    """Whether the engine asks for huge pages at all (WORKBENCH_HUGEPAGES is not "0")."""
    return _raw() != "0"  # never raises: `import workbench` asks (setting() refuses later)


def kv_enabled() -> bool:
    """Whether the KV cache is marked too (WORKBENCH_HUGEPAGES=all)."""
    return setting() == "all"


def thp_mode(path: Path = THP_ENABLED) -> str:
    """The kernel's THP mode: "always", "madvise", "never", or "unavailable"."""
    try:
        text = path.read_text()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unavailable"


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def advise(t: torch.Tensor) -> bool:
    """Mark the whole pages inside `t`'s storage MADV_HUGEPAGE (call it before the first
    touch: pages already faulted in stay 4 KB). True when the kernel accepted it."""
    import torch

    if t.device.type != "cpu" or t.is_sparse or t.layout != torch.strided:
        return False
    nbytes = t.untyped_storage().nbytes()
    start = t.untyped_storage().data_ptr()
    lo, hi = -(-start // PAGE) * PAGE, (start + nbytes) // PAGE * PAGE
    libc = _libc()
    if libc is None or hi - lo < 2 * 1024 * 1024:
        return False
    return libc.madvise(lo, hi - lo, MADV_HUGEPAGE) == 0


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.zeros; with WORKBENCH_HUGEPAGES=all a CPU buffer is marked for huge pages before
    it is first written."""
    import torch

    if torch.device(device).type != "cpu" or not kv_enabled():
        return torch.zeros(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=dtype, device=device)
    advise(t)
    return t.zero_()


_auto_set = False  # True when prepare_torch_env set TORCH_ENV (not the user)


def prepare_torch_env() -> None:
    """Set THP_MEM_ALLOC_ENABLE=1 for torch's allocator when that can still take effect
    (torch not imported yet), the user has not set it, and huge pages are wanted."""
    global _auto_set
    if enabled() and "torch" not in sys.modules and TORCH_ENV not in os.environ:
        os.environ[TORCH_ENV] = "1"
        _auto_set = True


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a peer process that should run as shipped: without THP_MEM_ALLOC_ENABLE
    when this process set it on its own (a user's setting is passed on)."""
    if _auto_set:
        env = {k: v for k, v in env.items() if k != TORCH_ENV}
    return env


def status() -> str:
    """One line for the engine's notes: what this process gets."""
    mode = thp_mode()
    if not enabled():
        return f"huge pages off ({ENV}=0; kernel THP {mode})"
    if mode in ("never", "unavailable"):
        return f"huge pages unavailable (kernel THP {mode})"
    if mode == "always":
        return "huge pages: kernel THP always (every large buffer)"
    torch_env = os.environ.get(TORCH_ENV) == "1"
    parts = ["torch allocations >= 2 MB (THP_MEM_ALLOC_ENABLE=1)"] if torch_env else []
    if kv_enabled():
        parts.insert(0, "KV cache")
    if not parts:
        return ("huge pages: none (torch was imported before workbench: set "
                "THP_MEM_ALLOC_ENABLE=1 for the weights)")
    return "huge pages: " + " + ".join(parts)
