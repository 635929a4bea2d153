"""Architecture name (config.json `architectures[0]`) -> model class."""

from __future__ import annotations

from torch import nn

from workbench.config import SUPPORTED_ARCHITECTURES
from workbench.models.llama import LlamaForCausalLM

# Every supported architecture is a Llama-family variant handled by one class.
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    arch: LlamaForCausalLM for arch in SUPPORTED_ARCHITECTURES
}


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"architecture ({architecture!r}) is not supported; supported architectures are "
            f"{', '.join(MODEL_REGISTRY)}"
        ) from None
