"""Triton kernels, each beside the plain-PyTorch twin that defines what it must compute.

On a machine without CUDA the only way Triton runs is its interpreter, so importing this
package sets TRITON_INTERPRET=1 there (before `triton` is imported and any kernel is
decorated; an explicit setting is kept). The interpreter computes bf16 wrongly: kernels
upcast to fp32 after loading, and CPU tests use fp32/fp16.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
