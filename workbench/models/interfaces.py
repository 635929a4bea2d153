"""What the model runner needs of a text-generation model (vLLM's
`VllmModelForTextGeneration`): one base class every architecture under `workbench/models/`
derives from, so the runner's calls are typed and a new architecture (MoE, MLA, sliding
window) knows what it must provide.

A model is an `nn.Module` that runs one flattened batch: `model(input_ids [T], positions [T],
attn_metadata) -> hidden [T, hidden_size]`, then `compute_logits(hidden [n, hidden_size])`
gives float32 logits `[n, vocab_size]` for the rows the sampler reads. `bind_kv_cache` hands
each attention layer its paged KV tensor, and `attn_backend` is the attention backend the
layers share (the runner reads its `cudagraph_safe`).
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from torch import nn

from workbench.attention.backends import AttentionBackend
from workbench.attention.metadata import AttentionMetadata


class TextGenerationModel(nn.Module):
    """Base of every architecture the loader builds (see the module docstring)."""

    attn_backend: AttentionBackend

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states [T, hidden_size] of the batch's T scheduled tokens."""

    @abstractmethod
    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, vocab_size] of `hidden_states` [n, hidden_size]."""

    @abstractmethod
    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        """Give attention layer i its cache tensor `kv_caches[i]`."""

