"""Loader and Python entry point of the C++ CPU paged-attention decode kernel.

`paged_decode.cpp` (beside this file) reads K/V rows in place through the block table, one
query token per sequence, exact online softmax in fp32; its twin is the gather + SDPA decode
of `workbench.attention.torch_backend`. `load()` compiles it on first use (g++ -O3
-march=native -fopenmp via load_inline; cached under ~/.cache/torch_extensions, or
$TORCH_EXTENSIONS_DIR) and returns the module, or None when it cannot: WORKBENCH_CPU_KERNELS=0,
no C++ compiler, or a failed build. The reason is logged once and the answer is remembered.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.cpp")
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-DNDEBUG"]
LDFLAGS = ["-fopenmp"]  # resolves to the libgomp.so.1 torch has already loaded
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_lock = threading.Lock()
_state: dict[str, object] = {}  # "module": ModuleType | None once tried; "reason": str
build_seconds: float | None = None  # wall time of this process's load (compile or cache hit)


def _cpu_tag() -> str:
    """-march=native output only runs on this kind of CPU: key the build on it."""
    info = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                info += line
            if line.startswith("flags"):
                break
    except OSError:
        pass
    return hashlib.sha1(info.encode()).hexdigest()[:8]


def unavailable_reason() -> str | None:
    """Why load() returns None (None while it has not been tried or succeeded)."""
    return _state.get("reason")  # type: ignore[return-value]


def load() -> ModuleType | None:
    """The compiled extension (exposes `paged_decode`), or None when it cannot be built."""
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    with _lock:
        if "module" not in _state:
            module, reason = _build()
            if module is None:
                log.warning("CPU paged-decode kernel unavailable, using torch: %s", reason)
            _state["reason"] = reason
            _state["module"] = module
    return _state["module"]  # type: ignore[return-value]


def _build() -> tuple[ModuleType | None, str | None]:
    global build_seconds
    if os.environ.get("WORKBENCH_CPU_KERNELS", "1") == "0":
        return None, "disabled by WORKBENCH_CPU_KERNELS=0"
    if platform.system() != "Linux":
        return None, f"only built on Linux (this is {platform.system()})"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return None, f"no C++ compiler ({cxx!r} not on PATH)"
    try:
        from torch.utils.cpp_extension import load_inline

        t0 = time.perf_counter()
        module = load_inline(
            name=f"workbench_paged_decode_{_cpu_tag()}",
            cpp_sources=[SOURCE.read_text()],
            no_implicit_headers=True,  # <torch/extension.h> alone is ~30 s of parsing
            extra_cflags=CFLAGS,
            extra_ldflags=LDFLAGS,
            verbose=os.environ.get("WORKBENCH_CPU_KERNELS_VERBOSE") == "1",
        )
        build_seconds = time.perf_counter() - t0
        log.info("CPU paged-decode kernel loaded in %.1f s", build_seconds)
        return module, None
    except Exception as e:  # noqa: BLE001 - any build failure means "fall back"
        msg = str(e).strip().splitlines()
        return None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}"


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes these inputs (CPU, a supported dtype, contiguous head_dim).

    An FP8 (float8_e4m3fn) cache is declined: the kernel knows no k_scale/v_scale, so the
    caller's torch path (gather, dequantize, SDPA) serves it."""
    return (
        query.device.type == "cpu"
        and k_cache.device.type == "cpu"
        and query.dtype in SUPPORTED_DTYPES
        and k_cache.dtype in SUPPORTED_DTYPES  # not fp8
        and k_cache.dtype == query.dtype
        and query.dim() == 3
        and k_cache.dim() == 4
        and query.shape[1] % k_cache.shape[2] == 0
        and query.stride(2) == 1
        and k_cache.stride(3) == 1
    )


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_tokens: int = -1,
) -> torch.Tensor | None:
    """One decode token per sequence: query [n, Hq, D], k/v_cache [num_blocks, bs, Hkv, D],
    block_tables [n, W] int64, seq_lens [n] int64 -> out [n, Hq, D] in query's dtype, or None
    when the kernel is unavailable or does not take these inputs (the caller falls back).

    bf16 / fp16 are upcast to fp32 inside the kernel. `split_tokens`: -1 splits long contexts
    across threads when (sequence, kv head) pairs are too few; 0 never splits; > 0 forces
    splits of that many tokens (rounded up to whole blocks; for tests)."""
    if not supports(query, k_cache) or v_cache.shape != k_cache.shape:
        return None
    module = load()
    if module is None:
        return None
    if block_tables.dtype != torch.long:
        block_tables = block_tables.long()
    if block_tables.shape[1] and block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    if seq_lens.dtype != torch.long:
        seq_lens = seq_lens.long()
    out = torch.empty(query.shape, dtype=query.dtype)
    module.paged_decode(
        out, query, k_cache, v_cache, block_tables, seq_lens, float(scale), int(split_tokens)
    )
    return out
