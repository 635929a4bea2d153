"""Speculative decoding's counters and their read-out (vLLM's `v1/spec_decode/metrics.py`).

`SpecDecodingStats` is what the scheduler counts in one step (vLLM's names): one draft per
request whose drafts were verified, the draft tokens, the accepted ones, and per position
how many drafts had that position accepted. Acceptance is a run from position 0, so the
per-position counters are non-increasing and give the accepted-length distribution:

    P(accepted length = i) = (c_i - c_{i+1}) / num_drafts,  c_0 = num_drafts, c_{k+1} = 0
    mean acceptance length = 1 + accepted / drafts   (the accepted tokens + the bonus one)

Bad arguments raise ValueError naming the argument and its value.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _need_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class SpecDecodingStats:
    """One step's verifications (vLLM's SpecDecodingStats)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [i] = drafts whose position i was accepted (as long as the longest draft seen)
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's verification: num_draft_tokens drafts, the first
        num_accepted_tokens of them kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        per_pos = self.num_accepted_tokens_per_pos
        if len(per_pos) < num_draft_tokens:
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted_tokens):
            per_pos[i] += 1


def accepted_length_counts(num_drafts: int, accepted_per_position: list[int]) -> list[int]:
    """Drafts that accepted exactly i tokens, i = 0..k, from vLLM's per-position counters.

    Acceptance is a run from position 0, so counter c_i (drafts whose position i was accepted)
    is cumulative: count(i) = c_{i-1} - c_i with c_{-1} = num_drafts and c_k = 0; written with
    lengths: count(len = i) = c'_i - c'_{i+1} where c'_0 = num_drafts, c'_{i+1} = c_i.
    """
    _need_int("num_drafts", num_drafts, 1)
    if not accepted_per_position:
        raise ValueError("accepted_per_position must list one counter per draft position, got []")
    cum = [num_drafts, *accepted_per_position, 0]
    for i, c in enumerate(accepted_per_position):
        _need_int(f"accepted_per_position[{i}]", c, 0)
    if any(b > a for a, b in zip(cum, cum[1:], strict=False)):
        raise ValueError(
            f"accepted_per_position {accepted_per_position} must be non-increasing and at most "
            f"num_drafts ({num_drafts}): acceptance at position i implies all positions before"
        )
    return [a - b for a, b in zip(cum, cum[1:], strict=False)]


def accepted_length_distribution(num_drafts: int, accepted_per_position: list[int]) -> list[float]:
    """P(accepted length = i) = (c_i - c_{i+1}) / num_drafts for i = 0..k (c_0 = num_drafts)."""
    return [n / num_drafts for n in accepted_length_counts(num_drafts, accepted_per_position)]


def mean_acceptance_length(num_drafts: int, num_accepted_tokens: int) -> float:
    """1 + accepted / drafts: tokens one verification step yields (accepted + the bonus one)."""
    _need_int("num_drafts", num_drafts, 1)
    _need_int("num_accepted_tokens", num_accepted_tokens, 0)
    return 1 + num_accepted_tokens / num_drafts
