"""Token embedding and LM head, vocab-parallel style (tp_size = 1 for now).

With tensor parallelism each rank would own rows [tp_rank * V/tp, (tp_rank + 1) * V/tp) of
the [vocab, hidden] table; the lm head reuses the same layout (and, when `tie_word_embeddings`,
the very same parameter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = 0
        self.tp_size = 1
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_partition = num_embeddings // self.tp_size
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if tuple(loaded_weight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(
                f"checkpoint tensor has shape {tuple(loaded_weight.shape)} but the embedding "
                f"expects {(self.num_embeddings, self.embedding_dim)}"
            )
        size = self.num_embeddings_per_partition
        param.data.copy_(loaded_weight.narrow(0, self.tp_rank * size, size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # masked + all_reduce when tp_size > 1

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits (no bias)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return F.linear(hidden_states, self.weight)  # all_gather when tp_size > 1
