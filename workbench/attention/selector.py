"""The name -> class switch for attention backends (vLLM's `attention/selector.py`).

Kept apart from `backends.py` (the contract) so the contract imports no implementation and each
implementation imports only the contract: the backends are imported here, lazily, because the
Triton one imports triton.
"""

from __future__ import annotations

from workbench.attention.backends import AttentionBackend
from workbench.config import ATTENTION_BACKENDS  # ("torch", "triton")


def get_attention_backend(name: str) -> type[AttentionBackend]:
    """The backend class called `name` (one of ATTENTION_BACKENDS)."""
    if name == "torch":
        from workbench.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend
    if name == "triton":
        from workbench.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend
    raise ValueError(
        f"attention backend ({name!r}) is unknown; allowed: {', '.join(ATTENTION_BACKENDS)}"
    )
