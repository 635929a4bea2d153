"""One speculative-decoding measurement point: one engine config (speculation off, or on with
one speculative_config) at one concurrency, its timed runs and its spec-decode counters.

    SpecPoint                  wall times, output tokens, the counters of its last timed run,
                               identical output, others' CPU share and validity; derived:
                               output tok/s, acceptance rate, mean acceptance length (1 +
                               accepted / drafts), predicted speed-up (output / (output -
                               accepted): forward passes saved), acceptance by position
    spec_counters(snapshot)    (drafts, draft tokens, accepted, accepted per position) from
                               `LLM.stats()` or a server's /metrics delta (`harness.prom`:
                               `name_total`, per position `name_total{position="i"}`)
    table(points)              Markdown, one row per point; the speed-up against the "off"
                               point at the same concurrency, none when either is invalid
    position_table(points)     acceptance by draft position, one row per speculative point

`workbench bench spec` measures points on the engine directly; notebook 07 measures them
through the runner (`workbench.experiments.studies.speculation`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from workbench.planning import spec_predicted_speedup

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_POSITION = re.compile(r'position="(\d+)"')


@dataclass
class SpecPoint:
    label: str  # "off", "ngram k=5", "draft k=3"
    concurrency: int
    run_s: list[float]
    output_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    identical: bool | None = None  # output equal to the "off" point's
    others_cpu: float = float("nan")  # largest share of the CPUs others used in a timed run
    valid: bool = True  # False: others_cpu above the threshold
    token_ids: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / median(self.run_s)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted / self.num_drafts if self.num_drafts else 1.0

    @property
    def predicted_speedup(self) -> float:
        if not self.num_drafts:
            return 1.0
        return spec_predicted_speedup(self.output_tokens, self.num_drafts, self.num_accepted)

    @property
    def acceptance_by_position(self) -> list[float]:
        return [c / self.num_drafts for c in self.accepted_per_pos] if self.num_drafts else []

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("token_ids")
        d.update(output_tok_s=self.output_tok_s, acceptance_rate=self.acceptance_rate,
                 mean_acceptance_length=self.mean_acceptance_length,
                 predicted_speedup=self.predicted_speedup,
                 acceptance_by_position=self.acceptance_by_position)
        return d


def _count(snapshot: Mapping[str, Any], name: str) -> int:
    for key in (name, name + "_total"):  # LLM.stats() names / Prometheus counter names
        v = snapshot.get(key)
        if isinstance(v, int | float):
            return int(v)
    return 0


def spec_counters(snapshot: Mapping[str, Any]) -> tuple[int, int, int, list[int]]:
    """(drafts, draft tokens, accepted tokens, accepted tokens per position) in `snapshot`:
    `LLM.stats()` (the per-position counter a list) or a /metrics delta (one
    `..._per_pos_total{position="i"}` key per position). Absent counters count 0."""
    per_pos = snapshot.get(PER_POS)
    if isinstance(per_pos, list | tuple):
        positions = [int(v) for v in per_pos]
    else:
        found: dict[int, int] = {}
        for key, value in snapshot.items():
            if key.startswith((PER_POS + "{", PER_POS + "_total{")) and \
                    isinstance(value, int | float):
                m = _POSITION.search(key)
                if m is not None:
                    found[int(m.group(1))] = int(value)
        positions = [found.get(i, 0) for i in range(max(found) + 1)] if found else []
    return (_count(snapshot, DRAFTS), _count(snapshot, DRAFT_TOKENS), _count(snapshot, ACCEPTED),
            positions)


def table(points: list[SpecPoint]) -> str:
    """One row per point; no measured speed-up when the point or its "off" is invalid."""
    rows = ["| concurrency | config | output tok/s | speed-up | predicted | acceptance | "
            "mean acc. len | drafts | identical | others' CPU |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    base = {p.concurrency: p for p in points if p.label == "off"}
    for p in points:
        off = base.get(p.concurrency)
        if off is None:
            speed = "nan"
        elif p.valid and off.valid:
            speed = f"{p.output_tok_s / off.output_tok_s:.2f}x"
        else:
            speed = "n/a (invalid)"
        ident = "" if p.identical is None else ("yes" if p.identical else "**NO**")
        others = "-" if math.isnan(p.others_cpu) else f"{p.others_cpu:.0%}"
        rows.append(
            f"| {p.concurrency} | {p.label} | {p.output_tok_s:.1f} | {speed} | "
            f"{p.predicted_speedup:.2f}x | {p.acceptance_rate:.1%} | "
            f"{p.mean_acceptance_length:.2f} | {p.num_drafts} | {ident} | "
            f"{others}{'' if p.valid else ' INVALID'} |"
        )
    return "\n".join(rows)


def position_table(points: list[SpecPoint]) -> str:
    k = max((len(p.accepted_per_pos) for p in points), default=0)
    rows = ["| config | " + " | ".join(f"pos {i}" for i in range(k)) + " |",
            "|---|" + "---:|" * k]
    for p in points:
        if p.num_drafts:
            acc = p.acceptance_by_position + [float("nan")] * (k - len(p.accepted_per_pos))
            rows.append(f"| {p.label}, C={p.concurrency} | "
                        + " | ".join(f"{a:.1%}" for a in acc) + " |")
    return "\n".join(rows)
