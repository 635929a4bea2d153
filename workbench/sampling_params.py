"""SamplingParams: how one request is decoded (vLLM's names and defaults).

Owned here: validation of every sampling knob. The sampler (`workbench/layers/sampler.py`)
applies them; the scheduler reads `max_tokens`, `min_tokens`, `stop_token_ids`, `ignore_eos`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_EPS = 1e-5


@dataclass
class SamplingParams:
    """Per-request decoding parameters.

    temperature: 0 means greedy (argmax); > 0 samples from softmax(logits / temperature).
    top_k: keep the k most likely tokens; 0 or -1 keeps all.
    top_p: keep the smallest set whose probability mass reaches top_p (1.0 keeps all).
    max_tokens: output tokens to generate at most (the first one comes from the prefill).
    min_tokens: EOS and stop tokens are suppressed until this many tokens exist.
    stop_token_ids: extra token ids that finish the request (the stop token is kept).
    ignore_eos: keep generating past EOS (benchmarks).
    n: number of output sequences for the prompt (forked after prefill, blocks shared
       copy-on-write).
    seed: per-request seed; the same seed gives the same tokens.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_tokens: int = 0
    max_tokens: int | None = 16
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n ({self.n}) must be an integer >= 1")
        if self.temperature < 0.0:
            raise ValueError(
                f"temperature ({self.temperature}) must be >= 0; use 0 for greedy decoding"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p ({self.top_p}) must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k ({self.top_k}) must be -1, 0 (disabled) or a positive int")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens ({self.max_tokens}) must be an integer >= 1")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.temperature < _EPS:
            # Greedy: the filters are meaningless, normalise them so the sampler's fast
            # path is taken.
            self.temperature = 0.0
            self.top_p = 1.0
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
