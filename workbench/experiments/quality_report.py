"""The quality gate's thresholds and the report it judges: what a `quality_gate` block may
hold, `QualityReport` (the candidate's figures against the reference) and `passes`.

Thresholds (a template's `quality_gate` block, or a dict given to `passes`):
`min_token_agreement`, `max_ppl_increase_pct` (100 * (ppl_cand / ppl_ref - 1)),
`max_mean_kl` (nats), `min_top1_agreement`. Options in the same block: `num_prompts`,
`max_tokens`, `ppl_tokens`, `ppl_context`. A threshold whose figure was not measured fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

THRESHOLDS: dict[str, str] = {
    "min_token_agreement": "greedy token agreement",
    "max_ppl_increase_pct": "perplexity increase (%)",
    "max_mean_kl": "mean KL(ref || cand) (nats)",
    "min_top1_agreement": "top-1 agreement",
}
OPTIONS = ("num_prompts", "max_tokens", "ppl_tokens", "ppl_context")
GATE_KEYS = (*THRESHOLDS, *OPTIONS)


def check_gate(gate: dict[str, Any]) -> None:
    """ValueError naming an unknown key or a bad value of a `quality_gate` block."""
    unknown = sorted(set(gate) - set(GATE_KEYS))
    if unknown:
        raise ValueError(
            f"quality_gate key(s) {', '.join(unknown)} are not known; allowed: "
            f"{', '.join(GATE_KEYS)}"
        )
    for key in THRESHOLDS:
        v = gate.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError(f"quality_gate.{key} ({v!r}) must be a number")
    for key in OPTIONS:
        v = gate.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"quality_gate.{key} ({v!r}) must be an integer >= 1")


def needs(gate: dict[str, Any] | None) -> dict[str, bool]:
    """Which measurements a gate's thresholds need: {"kl": ..., "perplexity": ...}."""
    g = gate or {}
    return {
        "kl": g.get("max_mean_kl") is not None or g.get("min_top1_agreement") is not None,
        "perplexity": g.get("max_ppl_increase_pct") is not None,
    }


@dataclass
class QualityReport:
    """The candidate against the reference; None = not measured."""

    model: str
    reference_config: dict[str, Any]
    candidate_config: dict[str, Any]
    num_prompts: int
    max_tokens: int
    token_agreement: float
    first_divergence: list[int | None]
    identical_sequences: int
    mean_kl: float | None = None  # nats, over every continuation position
    max_kl: float | None = None
    top1_agreement: float | None = None  # argmax equal, continuation positions
    ppl_tokens: int | None = None
    reference_perplexity: float | None = None
    perplexity: float | None = None
    text_top1_agreement: float | None = None  # argmax equal, held-out text positions
    seconds: float = 0.0

    @property
    def ppl_increase_pct(self) -> float | None:
        if self.perplexity is None or self.reference_perplexity is None:
            return None
        return 100.0 * (self.perplexity / self.reference_perplexity - 1.0)

    def figures(self) -> dict[str, float | None]:
        """The gated figures, keyed like the thresholds' subjects."""
        return {
            "token_agreement": self.token_agreement,
            "ppl_increase_pct": self.ppl_increase_pct,
            "mean_kl": self.mean_kl,
            "top1_agreement": self.top1_agreement,
        }

    def passes(self, thresholds: dict[str, Any] | None) -> tuple[bool, list[str]]:
        """(all thresholds met, one sentence per miss). Unknown keys raise ValueError; option
        keys (num_prompts, ...) are ignored; a threshold on an unmeasured figure fails."""
        gate = dict(thresholds or {})
        check_gate(gate)
        reasons = []
        fig = self.figures()
        checks = (
            ("min_token_agreement", "token_agreement", ">=", ".3f"),
            ("max_ppl_increase_pct", "ppl_increase_pct", "<=", "+.3f"),
            ("max_mean_kl", "mean_kl", "<=", ".3g"),
            ("min_top1_agreement", "top1_agreement", ">=", ".3f"),
        )
        for key, name, op, fmt in checks:
            bound = gate.get(key)
            if bound is None:
                continue
            value = fig[name]
            if value is None:
                reasons.append(f"{THRESHOLDS[key]} was not measured ({key}: {bound})")
                continue
            ok = value >= bound if op == ">=" else value <= bound
            if not ok:
                bad = "<" if op == ">=" else ">"
                extra = ""
                if name == "token_agreement":
                    extra = f" (first divergence per prompt: {self.first_divergence})"
                elif name == "ppl_increase_pct":
                    extra = (f" (perplexity {self.perplexity:.4f} vs reference "
                             f"{self.reference_perplexity:.4f})")
                reasons.append(f"{THRESHOLDS[key]} {value:{fmt}} {bad} {bound}{extra}")
        return not reasons, reasons

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ppl_increase_pct": self.ppl_increase_pct}

    def row(self) -> dict[str, Any]:
        """A flat row for a table."""
        return {
            "perplexity": self.perplexity, "ppl_increase_pct": self.ppl_increase_pct,
            "mean_kl": self.mean_kl, "max_kl": self.max_kl,
            "top1_agreement": self.top1_agreement,
            "text_top1_agreement": self.text_top1_agreement,
            "token_agreement": self.token_agreement,
            "identical_sequences": f"{self.identical_sequences}/{self.num_prompts}",
            "first_divergence": self.first_divergence,
        }
