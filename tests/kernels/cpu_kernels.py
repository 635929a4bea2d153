"""Test helper for the C++ CPU kernels: their module, or a skip that says why it is missing."""

from __future__ import annotations

from types import ModuleType

import pytest

from kernels.cpu.build import CpuExtension


def load_or_skip(ext: CpuExtension) -> ModuleType:
    """`ext`'s compiled module; skips the calling test (or module fixture) when it cannot be
    built here, with the builder's reason."""
    module = ext.load()
    if module is None:
        pytest.skip(f"CPU {ext.name} kernel unavailable: {ext.unavailable_reason()}")
    return module
