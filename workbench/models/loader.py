"""load_model: build the model for a local Hugging Face folder and fill it from *.safetensors.

The shards listed in `model.safetensors.index.json` (or, without an index, every
`*.safetensors` file) are read with `safetensors.safe_open` (never pickle). Each tensor is
routed to a parameter and copied by that parameter's `weight_loader`; HF's separate q/k/v and
gate/up tensors go into the fused parameters through the model's `packed_modules_mapping`
("...self_attn.k_proj.weight" -> "...qkv_proj.weight", shard "k"). A tensor with no
parameter, or a parameter (shard) left unfilled, is a ValueError naming it.
`rotary_emb.inv_freq` buffers are ignored; with tied embeddings `lm_head.weight` is optional
(the head shares embed_tokens' parameter). With `model_config.quantization` set, the linear
layers are quantized online right after loading (`workbench.layers.quantization`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from workbench.config import ModelConfig
from workbench.layers.quantization import quantize_model
from workbench.models.interfaces import TextGenerationModel
from workbench.models.registry import model_location

Packed = dict[str, tuple[str, str | int]]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def default_weight_loader(
    param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
) -> None:
    if param.shape != loaded_weight.shape:
        raise ValueError(
            f"checkpoint tensor has shape {tuple(loaded_weight.shape)} but the parameter "
            f"expects {tuple(param.shape)}"
        )
    param.data.copy_(loaded_weight)


def route(name: str, packed: Packed) -> tuple[str, str | int | None]:
    """Checkpoint tensor name -> (parameter name, shard id or None)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in packed:
            target, shard = packed[part]
            return ".".join([*parts[:i], target, *parts[i + 1 :]]), shard
    return name, None


def _expected_shards(model: nn.Module, packed: Packed) -> dict[str, list[str | int | None]]:
    by_target: dict[str, list[str | int]] = {}
    for target, shard in packed.values():
        by_target.setdefault(target, []).append(shard)
    expected: dict[str, list[str | int | None]] = {}
    for name, _ in model.named_parameters():
        leaf_module = name.split(".")[-2] if "." in name else ""
        expected[name] = list(by_target.get(leaf_module, [None]))
    return expected


def _checkpoint_name(param: str, shard: str | int | None, packed: Packed) -> str:
    if shard is None:
        return param
    for source, (target, s) in packed.items():
        if s == shard and f".{target}." in f".{param}":
            return param.replace(f"{target}.", f"{source}.")
    return f"{param}[{shard}]"


def checkpoint_files(folder: Path) -> list[Path]:
    """The shards named by model.safetensors.index.json if present, else every *.safetensors
    (the index matters when a repo also ships e.g. Mistral's consolidated.safetensors)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
        absent = [n for n in names if not (folder / n).is_file()]
        if absent:
            raise ValueError(f"{index} lists shard(s) missing from the folder: {absent}")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}; only safetensors are loaded")
    return files


def load_weights(model: nn.Module, folder: str | Path) -> None:
    folder = Path(folder)
    files = checkpoint_files(folder)
    packed: Packed = getattr(model, "packed_modules_mapping", {})
    tied = bool(getattr(getattr(model, "arch", None), "tie_word_embeddings", False))
    params = dict(model.named_parameters())  # shared (tied) parameters appear once
    expected = _expected_shards(model, packed)
    loaded: set[tuple[str, str | int | None]] = set()
    unexpected: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
                    continue
                target, shard = route(name, packed)
                param = params.get(target)
                if param is None:
                    unexpected.append(name)
                    continue
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                try:
                    weight_loader(param, f.get_tensor(name), shard)
                except ValueError as e:
                    raise ValueError(f"cannot load {name} from {file.name}: {e}") from None
                loaded.add((target, shard))
    if unexpected:
        raise ValueError(
            f"{len(unexpected)} checkpoint tensor(s) in {folder} match no model parameter: "
            f"{', '.join(unexpected[:10])}"
        )
    missing = [
        _checkpoint_name(p, s, packed)
        for p, shards in expected.items()
        for s in shards
        if (p, s) not in loaded
    ]
    if missing:
        raise ValueError(
            f"{len(missing)} weight(s) missing from the checkpoint in {folder}: "
            f"{', '.join(missing[:10])}"
        )


def get_model_class(architecture: str) -> type[TextGenerationModel]:
    """The class the registry names for `architecture` (its module imported on demand)."""
    module, name = model_location(architecture)
    cls = getattr(importlib.import_module(f"workbench.models.{module}"), name)
    if not (isinstance(cls, type) and issubclass(cls, TextGenerationModel)):
        raise TypeError(f"workbench.models.{module}.{name} ({cls!r}) is not a "
                        "TextGenerationModel (workbench/models/interfaces.py)")
    return cls


def load_model(
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    attention_backend: str = "torch",
) -> TextGenerationModel:
    """Build the model on `device` in `dtype`, load its weights and quantize its linear layers
    if `model_config.quantization` says so; returns it in eval mode."""
    model_cls = get_model_class(model_config.architecture)
    with _default_dtype(dtype), torch.device(device):
        model = model_cls(model_config, attention_backend)
    load_weights(model, model_config.model)
    quant = model_config.quant_config
    if quant.method is not None:
        with torch.no_grad():
            quantize_model(model, quant.method, **quant.options())
    return model.eval()
