"""One instance's prefill and decode capacity: what the measurement does, what it found, and
how to read both figures off an engine step trace.

    PDCapacityConfig       lengths, the decode batch, W workers to split, repeats, the engine's
                           knobs (fp32, prefix caching off, room for the batch)
    PhaseFigure            one phase's tokens/s per repeat, and the tokens, seconds and steps
                           behind each
    PDCapacity             both phases, `planning.pd_ratio`'s split of W instances, others' CPU
                           share and validity; `table()` in Markdown
    prefill_tok_s(trace)   (prompt tokens, seconds, steps) over the steps that scheduled prompt
                           tokens
    decode_tok_s(trace)    (decode tokens, seconds, steps) over the decode-only steps

`workbench bench pd-capacity` measures it on the engine directly (two calls per repeat: a
prefill batch with max_tokens=1, a decode batch); notebook 12 measures it through the
experiment runner (`workbench.experiments.studies.pd_disaggregation`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench import planning
from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE


def positive_int(name: str, value: object) -> None:
    """ValueError naming `name` unless `value` is an integer >= 1 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class PDCapacityConfig:
    """What one measurement does. `prefill_batch` None: `batch` prompts per prefill call."""

    model: str
    input_len: int
    output_len: int
    batch: int
    num_workers: int
    prefill_batch: int | None = None
    decode_prompt_len: int = 8
    repeats: int = 3
    seed: int = 0
    request_rate: float | None = None
    max_other_cpu_share: float = DEFAULT_MAX_OTHER_CPU_SHARE
    engine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("input_len", "batch", "decode_prompt_len", "repeats"):
            positive_int(name, getattr(self, name))
        if isinstance(self.output_len, bool) or not isinstance(self.output_len, int) or (
                self.output_len < 2):
            raise ValueError(f"output_len must be an integer >= 2 (the prefill emits the first "
                             f"token, the decode phase the rest), got {self.output_len!r}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or (
                self.num_workers < 2):
            raise ValueError(f"num_workers must be an integer >= 2 (one prefill and one decode "
                             f"instance at least), got {self.num_workers!r}")
        if self.prefill_batch is not None:
            positive_int("prefill_batch", self.prefill_batch)
        if self.request_rate is not None and not (
                isinstance(self.request_rate, int | float) and math.isfinite(self.request_rate)
                and self.request_rate > 0):
            raise ValueError(f"request_rate must be a finite number > 0 (req/s), got "
                             f"{self.request_rate!r}")
        if not 0 <= self.max_other_cpu_share <= 1:
            raise ValueError(f"max_other_cpu_share must be in [0, 1], got "
                             f"{self.max_other_cpu_share!r}")

    @property
    def prefill_prompts(self) -> int:
        return self.batch if self.prefill_batch is None else self.prefill_batch

    def engine_kwargs(self) -> dict[str, Any]:
        """fp32, no prefix caching, room for the batch and the longest request; the
        caller's knobs win."""
        longest = max(self.input_len + 1, self.decode_prompt_len + self.output_len)
        return {"dtype": "float32", "enable_prefix_caching": False,
                "max_num_seqs": max(self.batch, self.prefill_prompts),
                "max_model_len": longest, **self.engine}


@dataclass(frozen=True)
class PhaseFigure:
    """One phase's tokens/s per repeat (and the tokens and seconds behind each)."""

    phase: str  # "prefill" | "decode"
    batch: int
    tok_s: tuple[float, ...]
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    steps: tuple[int, ...]

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.tok_s)


@dataclass(frozen=True)
class PDCapacity:
    config: PDCapacityConfig
    prefill: PhaseFigure
    decode: PhaseFigure
    ratio: planning.PDRatio
    other_cpu_share: float  # NaN: not measurable
    valid: bool

    def table(self) -> str:
        """The measured figures, one row per phase (Markdown)."""
        c = self.config
        lines = ["| phase | batch | tokens per request | median tok/s | min | max | runs | "
                 "steps per run |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for f, per_req in ((self.prefill, f"{c.input_len} prompt"),
                           (self.decode, f"{c.output_len - 1} decode")):
            lines.append(f"| {f.phase} | {f.batch} | {per_req} | {f.median_tok_s:.1f} | "
                         f"{min(f.tok_s):.1f} | {max(f.tok_s):.1f} | {len(f.tok_s)} | "
                         f"{statistics.median(f.steps):g} |")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "prefill": asdict(self.prefill),
                "decode": asdict(self.decode), "prefill_tok_s": self.prefill.median_tok_s,
                "decode_tok_s": self.decode.median_tok_s, "splits": self.ratio.rows(),
                "best_split": self.ratio.best.label,
                "balanced_ratio": self.ratio.balanced_ratio,
                "colocated_rate": self.ratio.colocated_rate,
                "other_cpu_share": None if math.isnan(self.other_cpu_share)
                else self.other_cpu_share, "valid": self.valid}


def prefill_tok_s(trace: Sequence[dict[str, Any]]) -> tuple[int, float, int]:
    """(prompt tokens, seconds, steps) over the steps that scheduled prompt tokens."""
    steps = [r for r in trace if r["prefill_tokens"] > 0]
    return (sum(r["prefill_tokens"] for r in steps), sum(r["duration_s"] for r in steps),
            len(steps))


def decode_tok_s(trace: Sequence[dict[str, Any]]) -> tuple[int, float, int]:
    """(decode tokens, seconds, steps) over the decode-only steps (no prompt token)."""
    steps = [r for r in trace if r["prefill_tokens"] == 0 and r["decode_tokens"] > 0]
    return (sum(r["decode_tokens"] for r in steps), sum(r["duration_s"] for r in steps),
            len(steps))
