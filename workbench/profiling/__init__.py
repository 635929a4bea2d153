"""Profiling annotations: `with profiling.range("engine.step"):` around engine phases.

An NVTX range (seen by Nsight Systems) when the `nvtx` package is installed and CUDA is
available; a `torch.profiler.record_function` when a torch profile is being taken
(`enable_record_function(True)`); nothing otherwise (a shared null context, ~100 ns).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager

import torch

_NULL = contextlib.nullcontext()
_record_function = False


def _nvtx_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import nvtx  # noqa: F401
    except ImportError:
        return False
    return True


_USE_NVTX = _nvtx_available()


def enable_record_function(enabled: bool = True) -> None:
    """Also emit torch.profiler.record_function ranges (for torch.profiler traces)."""
    global _record_function
    _record_function = enabled


@contextlib.contextmanager
def _both(name: str) -> Iterator[None]:
    import nvtx

    with nvtx.annotate(name, domain="workbench"), torch.profiler.record_function(name):
        yield


def range(name: str) -> AbstractContextManager[object]:  # noqa: A001 - the public name
    if _USE_NVTX:
        if _record_function:
            return _both(name)
        import nvtx

        return nvtx.annotate(name, domain="workbench")
    if _record_function:
        return torch.profiler.record_function(name)
    return _NULL


nvtx_range = range


@contextlib.contextmanager
def torch_trace(path: str) -> Iterator[None]:
    """Profile the block with torch.profiler (CPU, and CUDA when present), the workbench
    ranges included, and write a Chrome trace (open in chrome://tracing or Perfetto)."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    enable_record_function(True)
    try:
        # The engine steps on a background thread (AsyncEngine): profile every thread.
        config = _ExperimentalConfig(profile_all_threads=True)
        with profile(activities=activities, experimental_config=config) as prof:
            yield
    finally:
        enable_record_function(False)
    prof.export_chrome_trace(path)
