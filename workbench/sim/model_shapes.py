"""A model as the simulator sees it: its shape, no weights.

`ModelShape` holds what the cost models price (widths, depth, heads, vocabulary, experts);
`model_shape(spec)` reads one from a named shape (NAMED_SHAPES), a shipped model's name
("bundled", "demo", "demo-draft": their config.json, nothing rebuilt or loaded), a model folder
or a config.json path, or an HF config dict.

The named shapes are the models' published config.json values (huggingface.co, checked
against copies of each config.json: meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B,
Llama-2-7b-hf, Qwen/Qwen3-32B, mistralai/Mixtral-8x7B-v0.1). Qwen3-32B's attention is wider
than its hidden size (64 heads x head_dim 128 = 8192 vs hidden 5120), which is why head_dim is
a field and not hidden_size / num_heads.

MoE: `num_experts` experts per layer (HF: num_local_experts, num_experts or n_routed_experts),
`experts_per_token` of them per token (num_experts_per_tok); `intermediate_size` is then one
expert's width (HF's moe_intermediate_size where the config has it). Shared experts and dense
layers between MoE layers (DeepSeek-style) are not modelled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.config.named_models import NAMED_MODELS


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (HF config names in the field docs)."""

    name: str
    hidden_size: int  # hidden_size
    num_layers: int  # num_hidden_layers
    num_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads (default: num_heads)
    head_dim: int  # head_dim (default: hidden_size // num_heads)
    intermediate_size: int  # intermediate_size (MoE: one expert's, moe_intermediate_size)
    vocab_size: int  # vocab_size
    num_experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            _need_int(f"ModelShape {self.name!r} {name}", getattr(self, name), 1)
        _need_int(f"ModelShape {self.name!r} num_experts", self.num_experts, 0)
        _need_int(f"ModelShape {self.name!r} experts_per_token", self.experts_per_token, 0)
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"ModelShape {self.name!r}: experts_per_token "
                             f"({self.experts_per_token}) must be in 1..num_experts "
                             f"({self.num_experts})")
        if not self.num_experts and self.experts_per_token:
            raise ValueError(f"ModelShape {self.name!r}: experts_per_token "
                             f"({self.experts_per_token}) without num_experts")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        """Query width: num_heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """One of K or V's width: num_kv_heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes one token takes over all layers (K and V)."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def layer_matmul_params(self) -> int:
        """Weights in one layer's GEMMs (q, k, v, o and the MLP; every expert)."""
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        if self.is_moe:
            return attn + self.num_experts * mlp + self.hidden_size * self.num_experts
        return attn + mlp

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _need_int(what: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} ({value!r}) must be an integer >= {low}")


NAMED_SHAPES: dict[str, ModelShape] = {
    s.name: s for s in (
        ModelShape("Llama-3-8B", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                   head_dim=128, intermediate_size=14336, vocab_size=128256),
        ModelShape("Llama-3-70B", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                   head_dim=128, intermediate_size=28672, vocab_size=128256),
        ModelShape("Llama-2-7B", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                   head_dim=128, intermediate_size=11008, vocab_size=32000),
        ModelShape("Qwen3-32B", hidden_size=5120, num_layers=64, num_heads=64, num_kv_heads=8,
                   head_dim=128, intermediate_size=25600, vocab_size=151936),
        ModelShape("Mixtral-8x7B", hidden_size=4096, num_layers=32, num_heads=32,
                   num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32000,
                   num_experts=8, experts_per_token=2),
    )
}

_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def from_hf_config(config: Mapping[str, Any], name: str = "config") -> ModelShape:
    """The shape of an HF config.json's dict (a multimodal config's `text_config` when the top
    level has no hidden_size). A missing or bad key is a ValueError naming it."""
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]

    def need(key: str) -> int:
        if key not in config:
            raise ValueError(f"model config {name!r} has no {key!r}")
        value = config[key]
        _need_int(f"model config {name!r} {key}", value, 1)
        return int(value)

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    experts = next((config[k] for k in _EXPERT_KEYS if config.get(k)), 0)
    per_token = (config.get("num_experts_per_tok") or 0) if experts else 0
    width_key = "moe_intermediate_size" if experts and config.get(
        "moe_intermediate_size") else "intermediate_size"
    return ModelShape(name=name, hidden_size=hidden, num_layers=need("num_hidden_layers"),
                      num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                      intermediate_size=need(width_key), vocab_size=need("vocab_size"),
                      num_experts=experts, experts_per_token=per_token)


def model_shape(spec: str | Path | Mapping[str, Any] | ModelShape) -> ModelShape:
    """A shape from: a ModelShape (returned as is); an HF config dict; a NAMED_SHAPES name; a
    shipped model's name (NAMED_MODELS: its config.json); a model folder or config.json path.
    Anything else is a ValueError listing the named shapes."""
    if isinstance(spec, ModelShape):
        return spec
    if isinstance(spec, Mapping):
        return from_hf_config(spec)
    text = str(spec)
    if text in NAMED_SHAPES:
        return NAMED_SHAPES[text]
    path = NAMED_MODELS.get(text, Path(text))
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise ValueError(
            f"model ({text!r}) must be a named shape ({', '.join(sorted(NAMED_SHAPES))}), a "
            f"shipped model ({', '.join(sorted(NAMED_MODELS))}), a model folder or a "
            "config.json path")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"model config {str(config_path)!r} is unreadable: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model config {str(config_path)!r} must hold a JSON object")
    return from_hf_config(config, name=text)
