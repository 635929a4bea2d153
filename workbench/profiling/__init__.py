"""Profiling annotations: `with profiling.range("engine.step"):` around engine phases.

An NVTX range (seen by Nsight Systems) when the `nvtx` package is installed and CUDA is
available; a `torch.profiler.record_function` when a torch profile is being taken
(`enable_record_function(True)`); nothing otherwise (a shared null context, ~100 ns).
"""

from __future__ import annotations

import contextlib
import os
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
def quiet_stderr(drop: tuple[str, ...] = ("USDT:", "STAGE:")) -> Iterator[None]:
    """Hold file descriptor 2 (C++ writes included) for the block; afterwards write back
    every line that does not start with one of `drop`. Kineto prints `USDT:`/`STAGE:` lines
    there on each profiler start/stop (only KINETO_LOG_LEVEL=6, read at start-up, silences
    them, errors too); this keeps its errors."""
    import sys
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 (an embedded interpreter): nothing to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True)
                    if not line.lstrip().startswith(drop)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@contextlib.contextmanager
def torch_trace(path: str | os.PathLike[str]) -> Iterator[None]:
    """Profile the block with torch.profiler (CPU, and CUDA when present), the workbench
    ranges included, and write a Chrome trace (open in Perfetto or chrome://tracing); a path
    ending in `.gz` is gzip-compressed (both open it as it is; ~10x smaller). Kineto's
    `USDT:` start/stop lines are kept off stderr (`quiet_stderr`)."""
    import gzip
    import shutil
    import tempfile

    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    enable_record_function(True)
    try:
        # The engine steps on a background thread (AsyncEngine): profile every thread.
        config = _ExperimentalConfig(profile_all_threads=True)
        prof = profile(activities=activities, experimental_config=config)
        with quiet_stderr():
            prof.__enter__()
        try:
            yield
        finally:
            with quiet_stderr():
                prof.__exit__(None, None, None)
    finally:
        enable_record_function(False)
    dst = os.fspath(path)
    if not dst.endswith(".gz"):
        prof.export_chrome_trace(dst)
        return
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(plain)
        with open(plain, "rb") as src, gzip.open(dst, "wb", compresslevel=6) as out:
            shutil.copyfileobj(src, out)
