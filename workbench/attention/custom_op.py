"""Paged attention as one opaque torch custom op, for a compiled forward (vLLM's
`unified_attention`).

dynamo cannot trace an attention backend: the torch backend plans from the metadata's host
lists and calls the C++ decode kernel through pybind, the Triton one launches kernels with
host-computed grids. Traced as it is, the forward breaks its graph in every layer (measured on
the demo model: 14 graphs, 13 breaks -- `.item()`, pybind calls, a lock). So under
torch.compile each layer's attention is the single op

    workbench::unified_attention(query, key, value, kv_cache, scale) -> out
        mutates kv_cache (the new tokens' K/V are written into it), out [T, Hq, D] is fresh

registered with `torch.library.custom_op` and a fake implementation (the output's shape and
dtype, nothing run), so dynamo records one node and inductor calls it as an extern kernel.
The batch's metadata and the backend instance come from the forward context
(`workbench.attention.forward_context`), which the compiled forward sets around the call; eager
forwards never go through the op.

`make_attention_opaque(model)` wraps every Attention layer's backend in an
`OpaqueAttentionBackend`: outside torch.compile it calls the real backend directly (no
dispatcher cost); while dynamo traces it emits the op.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.attention.backends import AttentionBackend
from workbench.attention.forward_context import get_forward_context
from workbench.attention.metadata import AttentionMetadata

OP_NAME = "workbench::unified_attention"


@torch.library.custom_op(OP_NAME, mutates_args=("kv_cache",))
def unified_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      kv_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """query [T, Hq, D], key/value [T, Hkv, D], kv_cache [2, blocks, block_size, Hkv, D]
    (written) -> out [T, Hq, D]; the backend and metadata of the current forward context."""
    ctx = get_forward_context()
    return ctx.backend.forward(query, key, value, kv_cache, ctx.attn_metadata, scale)


@unified_attention.register_fake
def _unified_attention_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            kv_cache: torch.Tensor, scale: float) -> torch.Tensor:
    return query.new_empty(query.shape)  # contiguous, as every backend returns it


class OpaqueAttentionBackend(AttentionBackend):
    """`inner` outside torch.compile; the `workbench::unified_attention` op inside it."""

    def __init__(self, inner: AttentionBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.cudagraph_safe = inner.cudagraph_safe

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the metadata argument is a placeholder here
            return torch.ops.workbench.unified_attention(query, key, value, kv_cache, scale)
        return self.inner.forward(query, key, value, kv_cache, attn_metadata, scale)


def make_attention_opaque(model: nn.Module) -> int:
    """Wrap every Attention layer's backend (once); returns how many layers were wrapped."""
    from workbench.layers.attention import Attention

    wrapped = 0
    for m in model.modules():
        if isinstance(m, Attention) and not isinstance(m.backend, OpaqueAttentionBackend):
            m.backend = OpaqueAttentionBackend(m.backend)
            wrapped += 1
    return wrapped
