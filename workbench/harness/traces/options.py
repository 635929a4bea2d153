"""What every trace reader shares: the options (`TraceOptions`), one parsed record
(`TraceRow`) and the one-sentence error a bad file gets (`bad_input`).

Options (YAML `workload.params`, `load_trace(**params)`), each format takes COMMON plus its own:

    rate_scale     replay speed: arrival_s = (timestamp - window start) / rate_scale (2.0 =
                   twice as fast); 1.0
    max_requests   keep at most this many requests (after the window and the drops); None: all
    start_s        the window starts this many trace seconds after the first record; 0
    duration_s     the window's length in trace seconds (None: to the end of the file)
    max_model_len  drop requests whose input + output tokens exceed it (counted); None: keep
    vocab_size     without a tokenizer, synthesized token ids are drawn from [0, vocab_size)
    block_size     mooncake: tokens per hash id (a prefix block); 512
    model, log_type  burstgpt: keep only rows with this Model / Log Type ("ChatGPT", "GPT-4";
                   "Conversation log", "API log"); None: all
    min_len, max_prompt_len, max_total_len, shuffle
                   sharegpt: vLLM's benchmark filters (4, 1024, 2048) and its seeded shuffle
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workbench.errors import UserError, did_you_mean, is_int, is_real

COMMON = ("rate_scale", "max_requests", "start_s", "duration_s", "max_model_len", "vocab_size")
EXTRA = {"sharegpt": ("min_len", "max_prompt_len", "max_total_len", "shuffle"),
         "burstgpt": ("model", "log_type"),
         "azure": (),
         "mooncake": ("block_size",)}


def bad_input(path: str | Path, where: str, field: str, value: Any, allowed: str) -> UserError:
    """`<file>, <where>: <field> (<value>) <what is allowed>` as a UserError."""
    return UserError(f"{path}, {where}: {field} ({value!r}) {allowed}")


@dataclass(frozen=True)
class TraceOptions:
    """The validated options of one trace load (see the module docstring)."""

    rate_scale: float = 1.0
    max_requests: int | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    max_model_len: int | None = None
    vocab_size: int = 32000
    block_size: int = 512
    model: str | None = None
    log_type: str | None = None
    min_len: int = 4
    max_prompt_len: int = 1024
    max_total_len: int = 2048
    shuffle: bool = True

    @classmethod
    def from_params(cls, fmt: str, params: dict[str, Any]) -> TraceOptions:
        """Options for format `fmt`; an unknown or bad param is refused naming what is
        allowed."""
        allowed = COMMON + EXTRA[fmt]
        for key in sorted(params, key=str):
            if key not in allowed:
                raise UserError(f"trace format {fmt!r} has no param {key!r}"
                                f"{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
        opts = cls(**params)
        opts._check()
        return opts

    def _check(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise UserError(f"trace param {name} ({getattr(self, name)!r}) must be {what}")

        r = self.rate_scale
        need(is_real(r) and 0 < r < math.inf, "rate_scale", "a finite number > 0 (2.0 = twice "
             "as fast)")
        for name in ("max_requests", "max_model_len"):
            v = getattr(self, name)
            need(v is None or (is_int(v) and v >= 1), name, "an integer >= 1 or null")
        need(is_real(self.start_s) and 0 <= self.start_s < math.inf, "start_s",
             "a finite number of seconds >= 0")
        d = self.duration_s
        need(d is None or (is_real(d) and 0 < d < math.inf), "duration_s",
             "a finite number of seconds > 0 or null")
        for name, low in (("vocab_size", 2), ("block_size", 1), ("min_len", 1),
                          ("max_prompt_len", 1), ("max_total_len", 2)):
            v = getattr(self, name)
            need(is_int(v) and v >= low, name, f"an integer >= {low}")
        for name in ("model", "log_type"):
            v = getattr(self, name)
            need(v is None or (isinstance(v, str) and bool(v)), name,
                 "a non-empty string or null")
        need(isinstance(self.shuffle, bool), "shuffle", "true or false")

    def to_dict(self, fmt: str) -> dict[str, Any]:
        """The options format `fmt` takes, with their values (for `Workload.params`)."""
        keys = COMMON + EXTRA[fmt]
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in keys}


@dataclass(frozen=True)
class TraceRow:
    """One request as a trace records it: where it is in the file, when it arrived (seconds,
    None when the format has no time), its token counts, and what it shares."""

    index: int  # its position among the file's records, 0-based (keys its synthetic tokens)
    where: str  # "line 5", "conversation 3 (id 'x')": for messages
    timestamp_s: float | None
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()  # mooncake: the prompt's prefix blocks
    prompt_token_ids: tuple[int, ...] | None = None  # sharegpt: the tokenized human turn
    prompt: str | None = None  # sharegpt: the human turn's text
    group: str | None = None
