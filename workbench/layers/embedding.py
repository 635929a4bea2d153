"""Token embedding and LM head, vocab-parallel (tp rank/size read at construction).

The vocabulary is padded to a multiple of tp (V' = ceil(V / tp) * tp, padding rows zero) and
rank r owns rows [r * V'/tp, (r + 1) * V'/tp) of the [vocab, hidden] table:

    embedding:  ids outside the rank's rows -> row 0, output zeroed -> all_reduce (one rank
                contributes each token's row)
    lm head:    local logits [n, V'/tp] -> all_gather -> [n, V'] -> [:, :V]

The lm head reuses the same layout (and, when `tie_word_embeddings`, the very same parameter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.kv_cache.utils import cdiv
from workbench.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from workbench.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from workbench.layers import linear_backend
from workbench.layers.linear_backend import LinearPlan


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_partition = cdiv(num_embeddings, self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = max(self.vocab_start_index, min(
            self.vocab_start_index + self.num_embeddings_per_partition, num_embeddings
        ))  # rows [start, end) are real; the rest of the partition is padding
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(
            torch.zeros(self.num_embeddings_per_partition, embedding_dim), requires_grad=False
        )
        # weight_loader: the loader's per-parameter hook (vLLM's), not a Parameter attribute
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # loader hook

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if tuple(loaded_weight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(
                f"checkpoint tensor has shape {tuple(loaded_weight.shape)} but the embedding "
                f"expects {(self.num_embeddings, self.embedding_dim)}"
            )
        start, end = self.vocab_start_index, self.vocab_end_index
        param.data.narrow(0, 0, end - start).copy_(loaded_weight.narrow(0, start, end - start))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local = (input_ids - self.vocab_start_index).masked_fill_(outside, 0)
        out = F.embedding(local, self.weight).masked_fill_(outside.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(out)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits (no bias)."""

    # CPU fp32 backend plan and packed copy (cpu_gemm.pack_linear_weights)
    linear_plan: LinearPlan | None = None
    packed_weight: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [n, V'/tp]: this rank's vocab shard
        logits = linear_backend.linear(hidden_states, self.weight, None, self.packed_weight,
                                       self.linear_plan)
        if self.tp_size == 1:
            return logits
        return tensor_model_parallel_all_gather(logits, dim=-1)[..., : self.num_embeddings]
