"""LlamaForCausalLM: one paged-attention implementation of the Llama family.

Covers Llama (incl. llama3 RoPE scaling, optional attention/mlp bias), Qwen2 (q/k/v bias),
Qwen3 (per-head q/k RMSNorm before RoPE, explicit head_dim) and Mistral; GQA; tied or untied
embeddings. Weight names match Hugging Face except the fused projections, which the loader
fills through `packed_modules_mapping`:

    embed -> [input_norm -> qkv_proj -> (q/k norm) -> RoPE -> paged attn -> o_proj (+res)
              post_norm -> gate_up_proj -> SiluAndMul -> down_proj (+res)] x L -> norm -> lm_head
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from workbench.attention.backends import AttentionBackend
from workbench.attention.metadata import AttentionMetadata
from workbench.attention.selector import get_attention_backend
from workbench.config import ModelConfig
from workbench.layers.activation import SiluAndMul
from workbench.layers.attention import Attention
from workbench.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from workbench.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from workbench.layers.norm import RMSNorm
from workbench.layers.rotary import RotaryEmbedding, get_rope_config
from workbench.models.interfaces import TextGenerationModel

# The architectures this class serves (workbench/models/registry.py points them here) and the
# per-family differences `LlamaArch` resolves.
FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}


@dataclass(frozen=True)
class LlamaArch:
    """The config.json fields this model reads, with the per-family differences resolved."""

    family: str  # "llama" | "qwen2" | "qwen3" | "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any]
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @classmethod
    def from_model_config(cls, mc: ModelConfig) -> LlamaArch:
        hf = mc.hf_config
        family = FAMILIES[mc.architecture]
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act ({hf['hidden_act']!r}) is not supported; only 'silu'")
        window = hf.get("sliding_window") if hf.get("use_sliding_window", True) else None
        assert mc.max_model_len is not None
        if window is not None and window < mc.max_model_len:
            raise ValueError(
                f"sliding_window ({window}) is smaller than max_model_len ({mc.max_model_len}); "
                f"sliding-window attention is not implemented, so pass max_model_len <= {window}"
            )
        attention_bias = bool(hf.get("attention_bias", False))
        theta, scaling = get_rope_config(hf)
        return cls(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=mc.num_layers,
            num_heads=mc.num_attention_heads,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position=mc.max_model_len,  # RoPE table size; positions stay below it
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else attention_bias and family != "mistral",
            o_bias=attention_bias and family in ("llama", "qwen3"),
            mlp_bias=bool(hf.get("mlp_bias", False)) and family == "llama",
            qk_norm=family == "qwen3",
        )


class LlamaMLP(nn.Module):
    def __init__(self, arch: LlamaArch) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            arch.hidden_size, [arch.intermediate_size] * 2, bias=arch.mlp_bias
        )
        self.down_proj = RowParallelLinear(
            arch.intermediate_size, arch.hidden_size, bias=arch.mlp_bias
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    def __init__(
        self, arch: LlamaArch, rotary_emb: RotaryEmbedding, backend: AttentionBackend
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            arch.hidden_size, arch.head_dim, arch.num_heads, arch.num_kv_heads, bias=arch.qkv_bias
        )
        # this TP rank's heads (all of them without TP)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = arch.head_dim
        self.q_size = self.num_heads * arch.head_dim
        self.kv_size = self.num_kv_heads * arch.head_dim
        self.o_proj = RowParallelLinear(
            arch.num_heads * arch.head_dim, arch.hidden_size, bias=arch.o_bias
        )
        self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.rotary_emb = [rotary_emb]  # shared by all layers; a list keeps it out of children
        self.attn = Attention(
            self.num_heads, arch.head_dim, arch.head_dim**-0.5, self.num_kv_heads, backend
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            t = q.shape[0]
            q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim)).view(t, self.q_size)
            k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim)).view(t, self.kv_size)
        q, k = self.rotary_emb[0](positions, q, k)
        return self.o_proj(self.attn(q, k, v, attn_metadata))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, arch: LlamaArch, rotary_emb: RotaryEmbedding, backend: AttentionBackend
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(arch, rotary_emb, backend)
        self.mlp = LlamaMLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, arch: LlamaArch, backend: AttentionBackend) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size)
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position, arch.rope_theta, arch.rope_scaling
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, self.rotary_emb, backend) for _ in range(arch.num_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        # called with the layer index once a layer has run (its KV written): a KV connector
        # saving layer by layer while the later layers compute (vLLM's save_kv_layer)
        self.layer_hook: Callable[[int], None] | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        hook = self.layer_hook
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, residual, attn_metadata)
            if hook is not None:
                hook(i)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(TextGenerationModel):
    """model(input_ids [T], positions [T], attn_metadata) -> hidden [T, hidden_size];
    compute_logits(hidden [n, hidden_size]) -> float32 logits [n, vocab_size]."""

    packed_modules_mapping: dict[str, tuple[str, str | int]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, model_config: ModelConfig, attention_backend: str = "torch") -> None:
        super().__init__()
        self.arch = LlamaArch.from_model_config(model_config)
        self.attn_backend = get_attention_backend(attention_backend)()
        self.model = LlamaModel(self.arch, self.attn_backend)
        self.lm_head = ParallelLMHead(self.arch.vocab_size, self.arch.hidden_size)
        if self.arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def attention_layers(self) -> list[Attention]:
        # nn.ModuleList yields nn.Module; LlamaModel fills it with LlamaDecoderLayer only
        return [cast(LlamaDecoderLayer, layer).self_attn.attn for layer in self.model.layers]

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        """Give layer i its cache tensor [2, num_blocks, block_size, num_kv_heads, head_dim]
        (num_kv_heads of this TP rank)."""
        layers = self.attention_layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"got {len(kv_caches)} KV cache tensors for {len(layers)} layers")
        want = (layers[0].num_kv_heads, self.arch.head_dim)
        for i, (attn, cache) in enumerate(zip(layers, kv_caches, strict=True)):
            if cache.dim() != 5 or cache.shape[0] != 2 or tuple(cache.shape[3:]) != want:
                raise ValueError(
                    f"kv_caches[{i}] has shape {tuple(cache.shape)}; expected "
                    f"[2, num_blocks, block_size, {want[0]}, {want[1]}]"
                )
            if not cache.is_contiguous():
                raise ValueError(f"kv_caches[{i}] must be contiguous")
            attn.kv_cache = cache

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()
