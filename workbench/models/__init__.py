"""Model definitions, the architecture registry, and the safetensors loader."""

from __future__ import annotations

from workbench.models.loader import load_model
from workbench.models.registry import get_model_class
from workbench.models.tokenizer import load_tokenizer

__all__ = ["get_model_class", "load_model", "load_tokenizer"]
