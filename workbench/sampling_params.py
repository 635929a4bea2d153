"""SamplingParams: how one request is decoded (vLLM's names and defaults).

Owned here: validation of every sampling knob. The sampler (`workbench/sample/sampler.py`)
applies them; the scheduler reads `max_tokens`, `min_tokens`, `stop_token_ids`, `ignore_eos`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from workbench.config.kv_transfer_params import kv_transfer_params

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
    n: number of output sequences for the prompt (independent siblings added with the
       request, sharing the prompt's KV through the prefix cache, as in vLLM V1).
    seed: per-request seed; the same seed gives the same tokens.
    prompt_logprobs: None (default) or k: for every prompt position after the first, the
       logprob and rank of the actual prompt token plus the k most likely tokens; 0 = the
       actual token only, -1 = the whole vocabulary (vLLM's -1). k must not exceed the
       vocabulary (checked at admission). Such a request reads no prefix-cache blocks: every
       prompt position's logits are computed.
    extra_args: vLLM's free-form per-request arguments; "kv_transfer_params" is read by the
       KV connector (`workbench.config.kv_transfer_params`: max_load_tokens).
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
    prompt_logprobs: int | None = None
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _check_int("n", self.n, low=1)
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args ({self.extra_args!r}) must be a dict, e.g. "
                             '{"kv_transfer_params": {"max_load_tokens": 256}}')
        kv_transfer_params(self.extra_args)  # validated up front
        _check_float("temperature", self.temperature, "a finite number >= 0 (0 = greedy)")
        if self.temperature < 0.0:
            raise ValueError(
                f"temperature ({self.temperature}) must be >= 0; use 0 for greedy decoding"
            )
        _check_float("top_p", self.top_p, "a number in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p ({self.top_p}) must be in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k ({self.top_k!r}) must be -1, 0 (disabled) or a positive int")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        if not isinstance(self.stop_token_ids, list | tuple):
            raise ValueError(
                f"stop_token_ids ({self.stop_token_ids!r}) must be a list of token ids (ints)"
            )
        for i, t in enumerate(self.stop_token_ids):
            if not is_int(t) or t < 0:
                raise ValueError(
                    f"stop_token_ids[{i}] ({t!r}) must be a token id: an integer >= 0"
                )
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} ({getattr(self, name)!r}) must be true or false")
        if self.prompt_logprobs is not None and (
            not is_int(self.prompt_logprobs) or self.prompt_logprobs < -1
        ):
            raise ValueError(
                f"prompt_logprobs ({self.prompt_logprobs!r}) must be None, -1 (the whole "
                "vocabulary) or an integer >= 0 (the top-k besides the prompt token)"
            )
        if self.seed is not None:
            # n > 1 children draw with seed + index: every one must be a valid torch seed
            _check_int("seed", self.seed, low=-(2**63), high=2**64 - self.n)
        # numpy integers and floats pass the checks above: store plain Python numbers
        self.n, self.top_k, self.min_tokens = int(self.n), int(self.top_k), int(self.min_tokens)
        self.max_tokens = None if self.max_tokens is None else int(self.max_tokens)
        self.seed = None if self.seed is None else int(self.seed)
        if self.prompt_logprobs is not None:
            self.prompt_logprobs = int(self.prompt_logprobs)
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        if self.temperature < _EPS:
            # Greedy: the filters are meaningless, normalise them so the sampler's fast
            # path is taken.
            self.temperature = 0.0
            self.top_p = 1.0
            self.top_k = 0

    def check_token_ids(self, vocab_size: int) -> None:
        """Every token id this request names must exist in the model's vocabulary, and
        prompt_logprobs must not ask for more tokens than it has (checked at admission, so a
        bad request is refused before it reaches the engine step)."""
        if self.prompt_logprobs is not None and self.prompt_logprobs > vocab_size:
            raise ValueError(
                f"prompt_logprobs ({self.prompt_logprobs}) must be <= the vocabulary size "
                f"({vocab_size}); use -1 for the whole vocabulary"
            )
        for i, t in enumerate(self.stop_token_ids):
            if t >= vocab_size:
                raise ValueError(
                    f"stop_token_ids[{i}] ({t}) is out of range; allowed 0..{vocab_size - 1} "
                    "(the model's vocabulary)"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _as_int(value: object) -> int | None:
    """`value` as a Python int when it is an integer (numpy's too) but not a bool, else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def is_int(value: object) -> bool:
    """An int that is not a bool (JSON true would otherwise pass as 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    n = _as_int(value)
    if n is None or n < low or (high is not None and n > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name} ({value!r}) must be {allowed}")


def _check_float(name: str, value: object, allowed: str) -> None:
    """Reals only (ints are fine, bools are not), and finite: inf and NaN are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} ({value!r}) must be {allowed}")
