"""C++ CPU kernels, compiled at first use with torch.utils.cpp_extension.load_inline.

Each loader returns None (with the reason logged once) when the kernel cannot be built, so the
caller falls back to its plain-PyTorch twin. Set WORKBENCH_CPU_KERNELS=0 to never build them.
`kernel_status()` says, per kernel, which build this process runs (or why it runs torch).
"""

from __future__ import annotations


def kernel_status() -> dict[str, str]:
    """{kernel: the loaded module's name (source-keyed), "torch fallback (why)" or
    "not loaded"} for every C++ CPU kernel."""
    from kernels.cpu import paged_decode, rms_norm, rotary

    return {ext.name: ext.status()
            for ext in (paged_decode.EXTENSION, rotary.EXTENSION, rms_norm.EXTENSION)}
