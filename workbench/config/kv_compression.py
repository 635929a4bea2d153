"""KVCompressionConfig: KV eviction policies (seed 003's memory lecture), one knob.

`kv_compression_config={"method": ..., "budget_tokens" | "budget_ratio": ..., ...}` on
`LLM`, `EngineArgs`, the server (`--kv-compression-config JSON`) and templates. The budget is
the number of KV tokens a request keeps per layer (PyramidKV: the mean over layers):
`budget_tokens`, or `budget_ratio` x the request's prompt length; the cache manager evicts
whole blocks, so budgets, sinks and windows round up to blocks.

Methods and the fields each reads (any other field set is refused by name):
  streaming_llm  sink_tokens, recent_tokens=None (budget - sinks): attention sinks + a
                 recent window; evicts the oldest non-sink block as the sequence grows.
  h2o            recent_tokens: heavy hitters by attention accumulated over every query
                 since the token was written, plus a recent window; evicts during decode.
  snapkv         window_size, kernel_size, pooling: once, after the prefill, keeps the prompt
                 blocks the last `window_size` prompt queries attend to most (scores pooled
                 over `kernel_size` neighbours) plus the window itself.
  pyramidkv      window_size, kernel_size, pooling, beta: SnapKV's selection with per-layer
                 budgets, larger in the lower layers (PyramidKV's arithmetic series).
With the budget at or above a request's length no block is evicted, and the output equals
the uncompressed engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

KV_COMPRESSION_METHODS = ("streaming_llm", "h2o", "snapkv", "pyramidkv")
POOLINGS = ("max", "avg")

# the fields each method reads besides method/budget_tokens/budget_ratio
_METHOD_FIELDS: dict[str, tuple[str, ...]] = {
    "streaming_llm": ("sink_tokens", "recent_tokens"),
    "h2o": ("recent_tokens",),
    "snapkv": ("window_size", "kernel_size", "pooling"),
    "pyramidkv": ("window_size", "kernel_size", "pooling", "beta"),
}
_DEFAULTS: dict[str, Any] = {"sink_tokens": 4, "recent_tokens": None, "window_size": 32,
                             "kernel_size": 5, "pooling": "max", "beta": 20.0}


def _positive_int(name: str, value: Any, *, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"kv_compression_config.{name} ({value!r}) must be an integer >= {low}")


@dataclass(frozen=True)
class KVCompressionConfig:
    """One eviction policy and its budget; see the module docstring for each method."""

    method: str
    budget_tokens: int | None = None
    budget_ratio: float | None = None
    sink_tokens: int = 4
    recent_tokens: int | None = None
    window_size: int = 32
    kernel_size: int = 5
    pooling: str = "max"
    beta: float = 20.0
    # which optional fields the user set (to refuse those the method does not read)
    explicit: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.method not in KV_COMPRESSION_METHODS:
            raise ValueError(f"kv_compression_config.method ({self.method!r}) must be one of "
                             f"{', '.join(repr(m) for m in KV_COMPRESSION_METHODS)}")
        if (self.budget_tokens is None) == (self.budget_ratio is None):
            raise ValueError(
                "kv_compression_config needs exactly one of budget_tokens (KV tokens kept per "
                "request and layer) or budget_ratio (a fraction of the request's length in "
                f"(0, 1]); got budget_tokens={self.budget_tokens!r}, "
                f"budget_ratio={self.budget_ratio!r}")
        if self.budget_tokens is not None:
            _positive_int("budget_tokens", self.budget_tokens)
        r = self.budget_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, int | float)
                              or not 0 < r <= 1):
            raise ValueError(f"kv_compression_config.budget_ratio ({r!r}) must be a number "
                             "in (0, 1]")
        reads = _METHOD_FIELDS[self.method]
        extra = [n for n in self.explicit if n not in reads]
        if extra:
            raise ValueError(
                f"kv_compression_config.{extra[0]} does not apply to method {self.method!r} "
                f"(it reads: {', '.join(reads) or 'only the budget'})")
        _positive_int("sink_tokens", self.sink_tokens, allow_zero=True)
        if self.recent_tokens is not None:
            _positive_int("recent_tokens", self.recent_tokens)
        _positive_int("window_size", self.window_size)
        k = self.kernel_size
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise ValueError(f"kv_compression_config.kernel_size ({k!r}) must be an odd "
                             "integer >= 1")
        if self.pooling not in POOLINGS:
            raise ValueError(f"kv_compression_config.pooling ({self.pooling!r}) must be one "
                             f"of {', '.join(repr(p) for p in POOLINGS)}")
        b = self.beta
        if isinstance(b, bool) or not isinstance(b, int | float) or b < 1:
            raise ValueError(f"kv_compression_config.beta ({b!r}) must be a number >= 1")
        if (self.budget_tokens is not None and self.recent_tokens is not None
                and self.method == "streaming_llm"
                and self.sink_tokens + self.recent_tokens > self.budget_tokens):
            raise ValueError(
                f"kv_compression_config: sink_tokens + recent_tokens ({self.sink_tokens} + "
                f"{self.recent_tokens}) must be <= budget_tokens ({self.budget_tokens})")

    @classmethod
    def from_value(cls, value: KVCompressionConfig | dict[str, Any] | None
                   ) -> KVCompressionConfig | None:
        """None, a config, or the knob's dict form (unknown keys refused by name)."""
        if value is None or isinstance(value, KVCompressionConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"kv_compression_config ({value!r}) must be a dict such as "
                             "{'method': 'streaming_llm', 'budget_tokens': 256}")
        known = {f.name for f in fields(cls)} - {"explicit"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"kv_compression_config has an unknown key {unknown[0]!r} "
                             f"(known: {', '.join(sorted(known))})")
        if "method" not in value:
            raise ValueError("kv_compression_config.method is required (one of "
                             f"{', '.join(repr(m) for m in KV_COMPRESSION_METHODS)})")
        explicit = tuple(k for k in value if k in _DEFAULTS)
        return cls(**value, explicit=explicit)

    def budget_for(self, num_prompt_tokens: int) -> int:
        """KV tokens a request with this prompt keeps per layer (before rounding to blocks)."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        assert self.budget_ratio is not None
        return max(1, int(self.budget_ratio * num_prompt_tokens + 0.5))

    def to_dict(self) -> dict[str, Any]:
        """The knob's dict form: method, the budget, and the fields this method reads."""
        out: dict[str, Any] = {"method": self.method}
        if self.budget_tokens is not None:
            out["budget_tokens"] = self.budget_tokens
        else:
            out["budget_ratio"] = self.budget_ratio
        for name in _METHOD_FIELDS[self.method]:
            out[name] = getattr(self, name)
        return out
