"""The quality gate's thresholds and the report it judges: what a `quality_gate` block may
hold, `QualityReport` (the candidate's figures against the reference) and `passes`.

Thresholds (a template's `quality_gate` block, or a dict given to `passes`):
`min_token_agreement`, `max_ppl_increase_pct` (100 * (ppl_cand / ppl_ref - 1)),
`max_mean_kl` (nats), `min_top1_agreement`. Options in the same block: `num_prompts`,
`max_tokens`, `ppl_tokens`, `ppl_context`. A threshold whose figure was not measured fails.

`needle` (a mapping) gates passkey retrieval (`workbench.experiments.needle`, on the
template's model, which should be `needle`): `min_accuracy` (required, in [0, 1]: the
variant's exact-match accuracy over the grid must reach it) and the grid, `lengths` (prompt
tokens, default 128 256 512 1024), `depths` (in [0, 1], default 0 0.25 0.5 0.75 1),
`cases_per_cell` (default 4), `seed` (default 0). The baseline runs the same grid; its
accuracy is reported beside the variant's.
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
NEEDLE = "needle"  # the passkey block: NEEDLE_KEYS
NEEDLE_KEYS = ("min_accuracy", "lengths", "depths", "cases_per_cell", "seed")
MIN_NEEDLE_TOKENS = 64  # = needle_cases.MIN_CONTEXT_TOKENS (a test checks)
GATE_KEYS = (*THRESHOLDS, *OPTIONS, NEEDLE)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def needle_problems(block: Any) -> list[str]:
    """What is wrong with a `quality_gate.needle` block (empty: nothing)."""
    where = "quality_gate.needle"
    if not isinstance(block, dict):
        return [f"{where} ({block!r}) must be a mapping such as {{min_accuracy: 0.9}}"]
    out = [f"{where} key {k!r} is not known; allowed: {', '.join(NEEDLE_KEYS)}"
           for k in sorted(set(block) - set(NEEDLE_KEYS), key=str)]
    acc = block.get("min_accuracy")
    if acc is None:
        out.append(f"{where}.min_accuracy is required (the accuracy a variant must reach, "
                   "e.g. 0.9)")
    elif isinstance(acc, bool) or not isinstance(acc, int | float) or not 0 <= acc <= 1:
        out.append(f"{where}.min_accuracy ({acc!r}) must be a number in [0, 1]")
    lengths = block.get("lengths")
    if lengths is not None and (not isinstance(lengths, list) or not lengths or not all(
            _int(n) and n >= MIN_NEEDLE_TOKENS for n in lengths)):
        out.append(f"{where}.lengths ({lengths!r}) must be a list of integers >= "
                   f"{MIN_NEEDLE_TOKENS} (prompt tokens)")
    depths = block.get("depths")
    if depths is not None and (not isinstance(depths, list) or not depths or not all(
            isinstance(d, int | float) and not isinstance(d, bool) and 0 <= d <= 1
            for d in depths)):
        out.append(f"{where}.depths ({depths!r}) must be a list of numbers in [0, 1]")
    for key, low in (("cases_per_cell", 1), ("seed", 0)):
        v = block.get(key)
        if v is not None and (not _int(v) or v < low):
            out.append(f"{where}.{key} ({v!r}) must be an integer >= {low}")
    return out


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
    if gate.get(NEEDLE) is not None:
        problems = needle_problems(gate[NEEDLE])
        if problems:
            raise ValueError("; ".join(problems))


def needs(gate: dict[str, Any] | None) -> dict[str, bool]:
    """Which measurements a gate's thresholds need: {"kl": ..., "perplexity": ...,
    "needle": ...}."""
    g = gate or {}
    return {
        "kl": g.get("max_mean_kl") is not None or g.get("min_top1_agreement") is not None,
        "perplexity": g.get("max_ppl_increase_pct") is not None,
        "needle": g.get(NEEDLE) is not None,
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
    needle_accuracy: float | None = None  # passkey exact match over the needle grid
    needle_num_cases: int | None = None
    reference_needle_accuracy: float | None = None
    needle_worst_cells: list[tuple[int, float, float]] | None = None  # (length, depth, acc)
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
            "needle_accuracy": self.needle_accuracy,
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
        reasons += self._needle_reasons(gate.get(NEEDLE))
        return not reasons, reasons

    def _needle_reasons(self, block: dict[str, Any] | None) -> list[str]:
        if not block:
            return []
        bound = block["min_accuracy"]
        if self.needle_accuracy is None:
            return [f"needle accuracy was not measured (needle.min_accuracy: {bound})"]
        if self.needle_accuracy >= bound:
            return []
        worst = ", ".join(f"length {n} depth {d:g}: {a:.2f}"
                          for n, d, a in self.needle_worst_cells or [])
        ref = self.reference_needle_accuracy
        base = "" if ref is None else f"; baseline {ref:.3f}" + (
            " (below the bar too: the model does not retrieve; use model: needle)"
            if ref < bound else "")
        return [f"needle accuracy {self.needle_accuracy:.3f} < {bound} over "
                f"{self.needle_num_cases} cases (worst cells: {worst or '-'}){base}"]

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
            "needle_accuracy": self.needle_accuracy,
        }
