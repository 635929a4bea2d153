"""Linear layers, tensor-parallel (Megatron style; tp rank/size read at construction from
`workbench.distributed.parallel_state`, 0/1 without TP).

    ColumnParallelLinear  W [out/tp, in]: y_r = x W_r^T          (output features split)
    RowParallelLinear     W [out, in/tp]: y = all_reduce(x_r W_r^T) (+ bias, added on rank 0)
    attention:  qkv_proj (column, heads split) -> attn on local heads -> o_proj (row)
    mlp:        gate_up_proj (column)          -> SiluAndMul          -> down_proj (row)

so each decoder layer all-reduces twice. QKVParallelLinear splits the query heads and the KV
heads; when tp > num_kv_heads each rank holds one KV head, head r // (tp / num_kv_heads)
(replicated tp / num_kv_heads times).

Each parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that copies its
slice of a checkpoint tensor into place. Fused layers (QKVParallelLinear, MergedColumnParallel-
Linear) are filled from Hugging Face's separate tensors: the model's `packed_modules_mapping`
maps e.g. `q_proj` -> (`qkv_proj`, "q"), and the loader passes the shard id.

    qkv_proj.weight rows:  [ q: num_heads*head_dim | k: num_kv_heads*head_dim | v: same as k ]
    gate_up_proj rows:     [ gate: intermediate | up: intermediate ]

On CPU in fp32 the engine also gives each unquantized weight a backend plan after loading
(`workbench.layers.linear_autotune`, vLLM's CPU prepacking): per row count F.linear, MKL's or
oneDNN's packed GEMM, whichever measured fastest on this machine for the weight's shape.

Quantization is applied after loading (`workbench.layers.quantization.quantize_model`): it
swaps `weight` for the format's tensors and sets `quant_method`, whose `apply(layer, x, bias)`
the forward then calls (vLLM's LinearBase.quant_method).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from workbench.core.kv_cache.utils import tp_kv_heads_per_rank
from workbench.distributed.communication_op import tensor_model_parallel_all_reduce
from workbench.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from workbench.layers import linear_backend

if TYPE_CHECKING:
    from workbench.layers.linear_backend import LinearPlan
    from workbench.layers.quantization.base import QuantMethod


def _copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(
            f"checkpoint tensor has shape {tuple(src.shape)} but the parameter (slice) expects "
            f"{tuple(dst.shape)}"
        )
    dst.copy_(src)


def _tp_shard(loaded: torch.Tensor, dim: int, size: int, rank: int, tp_size: int) -> torch.Tensor:
    """This rank's `size` rows along `dim`; the whole tensor (shape checked later) when tp = 1."""
    if tp_size == 1:
        return loaded
    return loaded.narrow(dim, rank * size, size)


class LinearBase(nn.Module):
    """y = x W^T + b with `weight` [output_size, input_size] (this rank's partition)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        # weight_loader: the loader's per-parameter hook (vLLM's), not a Parameter attribute
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # loader hook
        if bias:
            self.bias: nn.Parameter | None = nn.Parameter(
                torch.empty(output_size), requires_grad=False
            )
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # as above
        else:
            self.register_parameter("bias", None)
        self.quant_method: QuantMethod[LinearBase] | None = None  # set by quantize_model
        # CPU fp32 (set by cpu_gemm.pack_linear_weights): the backend per row count, and
        # `weight` packed for its packed backend (MKL or oneDNN; None without one)
        self.linear_plan: LinearPlan | None = None
        self.packed_weight: torch.Tensor | None = None

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, self.bias)
        return linear_backend.linear(x, self.weight, self.bias, self.packed_weight,
                                     self.linear_plan)

    def extra_repr(self) -> str:
        quant = f", quant={self.quant_method.name}" if self.quant_method is not None else ""
        return (
            f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}{quant}"
        )


class ReplicatedLinear(LinearBase):
    """Every rank holds the full weight."""

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        _copy_checked(param.data, loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks (dim 0 of the weight)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        if output_size % tp_size:
            raise ValueError(f"output_size ({output_size}) must divide by tp_size ({tp_size})")
        super().__init__(input_size, output_size // tp_size, bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        size = param.shape[0]
        _copy_checked(param.data, _tp_shard(loaded_weight, 0, size, self.tp_rank, self.tp_size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Column-parallel outputs stacked in one weight (e.g. gate_up_proj); shard_id = index."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard_id ({shard_id!r}) must be an index into output_sizes {self.output_sizes}"
            )
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        dst = param.data.narrow(0, offset, size)
        _copy_checked(dst, _tp_shard(loaded_weight, 0, size, self.tp_rank, self.tp_size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; shard_id is "q", "k" or "v". Per rank: num_heads query heads
    and num_kv_heads KV heads (`kv_cache.utils.tp_kv_heads_per_rank`)."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
    ) -> None:
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        tp_size = get_tensor_model_parallel_world_size()
        if total_num_heads % tp_size:
            raise ValueError(
                f"num_attention_heads ({total_num_heads}) must divide by tp_size ({tp_size})"
            )
        self.head_size = head_size
        self.num_heads = total_num_heads // tp_size
        self.num_kv_heads = tp_kv_heads_per_rank(total_num_kv_heads, tp_size)
        self.num_kv_head_replicas = max(1, tp_size // total_num_kv_heads)
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size  # this rank's
        LinearBase.__init__(self, hidden_size, output_size, bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        layout = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}
        if shard_id not in layout:
            raise ValueError(f"shard_id ({shard_id!r}) must be one of 'q', 'k', 'v'")
        offset, size = layout[shard_id]
        dst = param.data.narrow(0, offset, size)
        # query heads: shard tp_rank; KV heads: shard tp_rank // replicas (replicated KV)
        shard = self.tp_rank if shard_id == "q" else self.tp_rank // self.num_kv_head_replicas
        _copy_checked(dst, _tp_shard(loaded_weight, 0, size, shard, self.tp_size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks (dim 1 of the weight); outputs are all-reduced.

    The bias is replicated and added once (on rank 0) after the reduction.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        if input_size % tp_size:
            raise ValueError(f"input_size ({input_size}) must divide by tp_size ({tp_size})")
        super().__init__(input_size // tp_size, output_size, bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if param.dim() == 1:  # bias: replicated
            _copy_checked(param.data, loaded_weight)
            return
        size = param.shape[1]
        _copy_checked(param.data, _tp_shard(loaded_weight, 1, size, self.tp_rank, self.tp_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        if self.quant_method is not None:
            y = self.quant_method.apply(self, x, bias)  # this rank's input shard
        else:
            y = linear_backend.linear(x, self.weight, bias, self.packed_weight, self.linear_plan)
        return tensor_model_parallel_all_reduce(y) if self.tp_size > 1 else y
