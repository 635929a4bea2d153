"""Attention backends: the contract every implementation follows.

A backend does the paged part of attention for one layer and one flat batch:

1. write every new token's K and V into the layer's cache at `slot_mapping` (-1 = skip);
2. then, for each sequence, attend its query tokens to context positions 0..pos *read back from
   the paged cache* through `block_tables` (never from the in-flight k/v: another sequence in
   the same batch may hit prefix blocks this batch is writing).

The model builds one backend instance and shares it across layers, so per-batch planning
(index tensors, masks) can be done once per `AttentionMetadata` and reused by every layer:
the runner must pass a fresh AttentionMetadata object for each forward.
The cache must hold finite values everywhere (allocate it with torch.zeros, not torch.empty):
masked positions get zero weight, and 0 * NaN would still poison the output.

Backends: "torch" (`torch_backend`, the plain-PyTorch reference, default on CPU) and "triton"
(`triton_backend`: the kernels in `kernels.triton`, default on CUDA; its decode path is
CUDA-graph capturable, see that module's docstring for the contract). `selector.py` maps a
name to its class; this module imports neither implementation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from workbench.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    """One paged-attention implementation. Subclasses must be stateless across batches
    except for caches keyed on the identity of the metadata object."""

    name: str
    # True when a decode-only batch (max_query_len == 1) reads nothing but the metadata's
    # device tensors and their shapes, so a CUDA graph can capture it (workbench.worker.cuda_graph)
    cudagraph_safe: bool = False

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """query [T, Hq, D], key/value [T, Hkv, D], kv_cache [2, num_blocks, block_size, Hkv, D]
        -> output [T, Hq, D]. Rows of padding tokens (beyond the last sequence) are zeros."""
