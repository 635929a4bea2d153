"""ModelConfig (the model folder and its Hugging Face `config.json`) and QuantConfig (online
weight quantization), vLLM's `ModelConfig` / `quantization` knobs.

`max_model_len` is resolved on construction (None -> the model's max_position_embeddings), so
after validation it is an `int` for every reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config.named_models import resolve_model
from workbench.config.utils import knob
from workbench.models.registry import SUPPORTED_ARCHITECTURES

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATION_METHODS = ("int8", "int4", "fp8")
INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_INT4_GROUP_SIZE = 128  # GPTQ's / AWQ's usual group_size


@dataclass(frozen=True)
class QuantConfig:
    """Online weight quantization of the linear layers, applied right after loading.

    "int8" = W8A16 (per-output-channel symmetric), "int4" = W4A16 (asymmetric per group of
    `group_size` input features, two values per byte), "fp8" = W8A8 e4m3 (per-channel weight
    scales, dynamic per-token activation scales). The embeddings, lm_head and norms stay in the
    model dtype, as with vLLM's defaults. Built from ModelConfig's `quantization` and
    `quantization_group_size` knobs (the names in error messages).
    """

    method: str | None = None  # None | "int8" | "int4" | "fp8"
    group_size: int | None = None  # int4 only: 32 | 64 | 128; None -> 128 for int4

    def __post_init__(self) -> None:
        m, g = self.method, self.group_size
        if m is not None and m not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization ({m!r}) must be None or one of "
                f"{', '.join(repr(q) for q in QUANTIZATION_METHODS)}"
            )
        if g is not None and m != "int4":
            raise ValueError(
                f"quantization_group_size ({g!r}) only applies to quantization='int4' "
                f"(got quantization={m!r}); leave it unset"
            )
        if m == "int4":
            if g is None:
                object.__setattr__(self, "group_size", DEFAULT_INT4_GROUP_SIZE)
            elif isinstance(g, bool) or g not in INT4_GROUP_SIZES:
                raise ValueError(
                    f"quantization_group_size ({g!r}) must be one of "
                    f"{', '.join(map(str, INT4_GROUP_SIZES))}"
                )

    def options(self) -> dict[str, Any]:
        """Keyword options for `quantize_model` (group_size for int4, none otherwise)."""
        return {"group_size": self.group_size} if self.method == "int4" else {}


@dataclass
class ModelConfig:
    """The model folder and its Hugging Face `config.json`."""

    model: str
    dtype: str = knob("auto", "weights and activations: auto (float32 on CPU, bfloat16 on "
                      "CUDA) | float32 | bfloat16 | float16")
    max_model_len: int = knob(None, "longest prompt + output in tokens (default: the "
                                    "model's max_position_embeddings)", accepts=int | None)
    seed: int = knob(0, "seed of the engine's sampling generator")
    quantization: str | None = knob(None, "quantize the linear weights at load time: int8 "
                                          "(W8A16) | int4 (W4A16) | fp8 (W8A8)")
    quantization_group_size: int | None = knob(None, "int4 only: 32 | 64 | 128 input "
                                                     "features per scale (default 128)")
    hf_config: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _ = self.quant_config  # validates quantization / quantization_group_size
        self.model = resolve_model(self.model)
        path = Path(self.model)
        if not path.is_dir():
            raise ValueError(
                f"model ({self.model!r}) is not a folder; pass a local Hugging Face folder with "
                "config.json, *.safetensors and tokenizer files (nothing is downloaded)"
            )
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"model ({self.model!r}) has no config.json")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype ({self.dtype!r}) must be one of {', '.join(DTYPES)}")
        self.hf_config = json.loads(cfg_path.read_text())
        archs = self.hf_config.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture ({arch!r}) in {cfg_path} is not supported; supported "
                f"architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        self.max_model_len = self._resolve_max_model_len(self.max_model_len)

    def _resolve_max_model_len(self, given: int | None) -> int:
        """None -> max_position_embeddings; else a positive int no larger than it."""
        max_pos = int(self.hf_config.get("max_position_embeddings", 2048))
        if given is None:
            return max_pos
        if not isinstance(given, int) or given < 1:
            raise ValueError(f"max_model_len ({given}) must be a positive integer")
        if given > max_pos:
            raise ValueError(
                f"max_model_len ({given}) must be <= the model's "
                f"max_position_embeddings ({max_pos})"
            )
        return given

    @property
    def quant_config(self) -> QuantConfig:
        return QuantConfig(self.quantization, self.quantization_group_size)

    @property
    def architecture(self) -> str:
        return str(self.hf_config["architectures"][0])

    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.hf_config["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.hf_config.get("num_key_value_heads") or self.num_attention_heads)

    @property
    def head_dim(self) -> int:
        hd = self.hf_config.get("head_dim")
        return int(hd) if hd else int(self.hf_config["hidden_size"]) // self.num_attention_heads

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.hf_config.get("eos_token_id")
        if eos is None:
            return []
        return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]
