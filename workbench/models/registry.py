"""The architecture registry: config.json `architectures[0]` -> (module, class), as vLLM's.

One table, no torch: `workbench.config` validates a model's architecture against it before
anything is built, and `workbench.models.loader.get_model_class` imports the module it names.
Adding an architecture is a row here plus its module under `workbench/models/`.
"""

from __future__ import annotations

# architecture -> (module under workbench/models/, class name)
MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(MODELS)


def model_location(architecture: str) -> tuple[str, str]:
    """(module, class) of `architecture`; ValueError naming the supported ones otherwise."""
    try:
        return MODELS[architecture]
    except KeyError:
        raise ValueError(
            f"architecture ({architecture!r}) is not supported; supported architectures are "
            f"{', '.join(MODELS)}"
        ) from None
