"""Build-on-first-use for the C++ CPU kernels beside this file (one extension per concept).

    ext = CpuExtension("rotary", [Path("rotary.cpp")], extra_cflags=["-ffp-contract=off"])
    ext.load()                 # the compiled module, or None (reason: ext.unavailable_reason())

Each extension is compiled with g++ -O3 -march=native -fopenmp through
torch.utils.cpp_extension.load_inline (cached under ~/.cache/torch_extensions, or
$TORCH_EXTENSIONS_DIR) the first time a process asks for it. The module name carries a
`build_key`: this CPU's flags, and a digest of the sources, the compiler flags, the torch
version and the torch install the headers come from. torch's own cache is keyed on the name
alone and rebuilds a changed build in place under the same .so path, so without the digest a
process of another checkout or venv (a clean-clone CI run, an older commit's tests) could
overwrite the .so between another process's build and its import, and that process would
then run the other sources' kernel.

`load()` returns None when it cannot be built (WORKBENCH_CPU_KERNELS=0, not Linux, no C++
compiler, a failed build), logs the reason once, and remembers the answer, so every caller
falls back to its torch twin.
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

log = logging.getLogger(__name__)

CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-DNDEBUG"]
LDFLAGS = ["-fopenmp"]  # resolves to the libgomp.so.1 torch has already loaded
# torch's build lock (a `lock` file in the build folder) is left behind when a building
# process is killed, and every later process then waits on it forever. A build takes a few
# minutes at most, so a lock this old is taken for a dead builder's and removed.
STALE_LOCK_S = 900.0
# WORKBENCH_CPU_ISA=avx2 builds the kernels without AVX-512 on an AVX-512 machine: with
# ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and MKL_ENABLE_INSTRUCTIONS=AVX2 (see
# docs/benchmarks.md) the whole process then runs the code paths of an AVX2-only CPU.
ISA_CFLAGS = {"native": [], "avx2": ["-mno-avx512f"]}
# A kernel built on simd_f32.h reports its vector width (`simd_lanes()`): what it is called.
SIMD_PATHS = {16: "AVX-512", 8: "AVX2", 0: "portable"}


def cpu_tag() -> str:
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


def build_key(sources: list[str], cflags: list[str], ldflags: list[str]) -> str:
    """`<cpu tag>_<digest>`: equal only for the same CPU flags, sources, compiler flags and
    torch build (version and install path, whose headers the build includes)."""
    import torch

    h = hashlib.sha1()
    for part in (*sources, *cflags, "--", *ldflags, torch.__version__,
                 str(Path(torch.__file__).resolve().parent)):
        h.update(part.encode())
        h.update(b"\0")
    return f"{cpu_tag()}_{h.hexdigest()[:10]}"


class CpuExtension:
    """One C++ extension built from `sources` on first `load()`."""

    def __init__(self, name: str, sources: list[Path], extra_cflags: list[str] | None = None
                 ) -> None:
        self.name = name
        self.sources = sources
        self.cflags = CFLAGS + list(extra_cflags or [])
        self._lock = threading.Lock()
        self._state: dict[str, object] = {}  # "module": ModuleType | None; "reason": str
        self.build_seconds: float | None = None  # this process's load (compile or cache hit)
        self.module_name: str | None = None  # set when a build is tried: names the exact build

    def unavailable_reason(self) -> str | None:
        """Why load() returns None (None while it has not been tried or succeeded)."""
        return self._state.get("reason")  # type: ignore[return-value]

    def status(self) -> str:
        """What this process runs: the loaded module's name (it names the exact build), the
        reason for the torch fallback, or "not loaded" before the first call."""
        if "module" not in self._state:
            return "not loaded"
        if self._state["module"] is None:
            return f"torch fallback ({self._state['reason']})"
        lanes = getattr(self._state["module"], "simd_lanes", None)
        if lanes is None:
            return str(self.module_name)
        return f"{self.module_name} ({SIMD_PATHS.get(lanes(), f'{lanes()} lanes')} fp32 path)"

    def load(self) -> ModuleType | None:
        if "module" in self._state:
            return self._state["module"]  # type: ignore[return-value]
        with self._lock:
            if "module" not in self._state:
                module, reason = self._build()
                if module is None:
                    log.warning("CPU %s kernel unavailable, using torch: %s", self.name, reason)
                self._state["reason"] = reason
                self._state["module"] = module
        return self._state["module"]  # type: ignore[return-value]

    def _build(self) -> tuple[ModuleType | None, str | None]:
        if os.environ.get("WORKBENCH_CPU_KERNELS", "1") == "0":
            return None, "disabled by WORKBENCH_CPU_KERNELS=0"
        if platform.system() != "Linux":
            return None, f"only built on Linux (this is {platform.system()})"
        isa = os.environ.get("WORKBENCH_CPU_ISA", "native")
        if isa not in ISA_CFLAGS:
            return None, (f"WORKBENCH_CPU_ISA={isa!r} is not one of "
                          f"{', '.join(sorted(ISA_CFLAGS))}")
        cflags = self.cflags + ISA_CFLAGS[isa]
        cxx = os.environ.get("CXX", "c++")
        if shutil.which(cxx) is None:
            return None, f"no C++ compiler ({cxx!r} not on PATH)"
        try:
            from torch.utils.cpp_extension import load_inline

            t0 = time.perf_counter()
            sources = [p.read_text() for p in self.sources]
            self.module_name = f"workbench_{self.name}_{build_key(sources, cflags, LDFLAGS)}"
            from torch.utils.cpp_extension import _get_build_directory

            clear_stale_lock(Path(_get_build_directory(self.module_name, verbose=False)))
            module = load_inline(
                name=self.module_name,
                cpp_sources=sources,
                no_implicit_headers=True,  # <torch/extension.h> alone is ~30 s of parsing
                extra_cflags=list(cflags),  # copies: load_inline appends to its
                extra_ldflags=list(LDFLAGS),  # arguments (torch's -L/-l flags) in place
                verbose=os.environ.get("WORKBENCH_CPU_KERNELS_VERBOSE") == "1",
            )
            self.build_seconds = time.perf_counter() - t0
            log.info("CPU %s kernel loaded in %.1f s", self.name, self.build_seconds)
            return module, None
        except Exception as e:  # noqa: BLE001 - any build failure means "fall back"
            msg = str(e).strip().splitlines()
            return None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}"


def clear_stale_lock(build_dir: Path, now: float | None = None,
                     max_age_s: float = STALE_LOCK_S) -> bool:
    """Remove `build_dir/lock` when it is older than `max_age_s` (a killed build's); True
    when one was removed. A younger lock is a build in progress: torch waits for it."""
    lock = build_dir / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age <= max_age_s:
        return False
    log.warning("removing a stale C++ build lock (%.0f s old, a killed build's): %s", age, lock)
    lock.unlink(missing_ok=True)
    return True
