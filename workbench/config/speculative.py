"""SpeculativeConfig: vLLM's `speculative_config` dict, validated (n-gram or a draft model).

The per-method fields stay optional by design: `prompt_lookup_min`/`prompt_lookup_max` are
resolved (vLLM's defaults) for method "ngram" and None for "draft_model"; `model` is a resolved
folder for "draft_model" and None for "ngram".
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workbench.config.named_models import resolve_model

SPEC_METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """vLLM's `speculative_config` dict, validated.

    {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
     "prompt_lookup_max": b}  or  {"method": "draft_model", "model": DIR,
     "num_speculative_tokens": k}. The draft must share the target's tokenizer; that is
    checked when the engine loads it (the target folder is needed).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 5
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config method ({self.method!r}) must be one of "
                f"{', '.join(SPEC_METHODS)}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 32:
            raise ValueError(
                f"speculative_config num_speculative_tokens ({k!r}) must be an integer in 1..32"
            )
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError(
                    f"speculative_config model ({self.model!r}) is only for method "
                    "'draft_model'; n-gram drafts come from the prompt"
                )
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                v = getattr(self, name)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise ValueError(
                        f"speculative_config {name} ({v!r}) must be an integer >= 1"
                    )
            # vLLM's defaults: both missing -> 5 and 5; one missing -> the other's value.
            if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
                self.prompt_lookup_min = self.prompt_lookup_max = 5
            elif self.prompt_lookup_min is None:
                self.prompt_lookup_min = self.prompt_lookup_max
            elif self.prompt_lookup_max is None:
                self.prompt_lookup_max = self.prompt_lookup_min
            assert self.prompt_lookup_min is not None and self.prompt_lookup_max is not None
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError(
                    f"speculative_config prompt_lookup_min ({self.prompt_lookup_min}) must be "
                    f"<= prompt_lookup_max ({self.prompt_lookup_max})"
                )
        else:
            if self.model is not None:
                self.model = resolve_model(self.model)
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError(
                    "speculative_config prompt_lookup_min/prompt_lookup_max are only for "
                    "method 'ngram'"
                )
            if not self.model or not (Path(self.model) / "config.json").is_file():
                raise ValueError(
                    f"speculative_config model ({self.model!r}) must be a local model folder "
                    "with config.json for method 'draft_model'"
                )

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | SpeculativeConfig) -> SpeculativeConfig:
        if isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError(
                f"speculative_config ({spec!r}) must be a dict such as "
                "{'method': 'ngram', 'num_speculative_tokens': 5}"
            )
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(
                f"speculative_config has unknown key(s) {', '.join(unknown)}; allowed: "
                f"{', '.join(sorted(allowed))}"
            )
        if "method" not in spec:
            raise ValueError(
                f"speculative_config needs 'method' (one of {', '.join(SPEC_METHODS)})"
            )
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}
