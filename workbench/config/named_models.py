"""Model folders the workbench ships, by name: anywhere a model folder is asked for
(`LLM(model=...)`, `speculative_config["model"]`, templates' `target.model`, `--model`),
these names work too.

    bundled      workbench/assets/tiny-llama    random 2-layer Llama, for tests and plumbing
    demo         workbench/assets/demo-target   trained on Python's stdlib (spec-decode pair)
    demo-draft   workbench/assets/demo-draft    its smaller draft, same tokenizer
    needle       workbench/assets/demo-needle   demo fine-tuned to retrieve a passkey
                                                (`make needle-model`; the KV quality gate)
"""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
NAMED_MODELS: dict[str, Path] = {
    "bundled": ASSETS_DIR / "tiny-llama",
    "demo": ASSETS_DIR / "demo-target",
    "demo-draft": ASSETS_DIR / "demo-draft",
    "needle": ASSETS_DIR / "demo-needle",
}


def resolve_model(model: str | Path) -> str:
    """A shipped model's folder for its name (the bundled random checkpoint is rebuilt,
    deterministically, if its folder is missing); anything else is returned unchanged."""
    name = str(model)
    path = NAMED_MODELS.get(name)
    if path is None:
        return name
    if name == "bundled" and not (path / "config.json").is_file():
        from workbench.testing import tiny_checkpoint

        tiny_checkpoint(path, arch="llama", seed=0)
    return str(path)


def bundled_checkpoint() -> Path:
    """The bundled checkpoint's folder (`resolve_model("bundled")`); rebuilt deterministically
    if the folder is missing."""
    return Path(resolve_model("bundled"))
