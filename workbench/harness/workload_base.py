"""What every workload is made of: `BenchRequest`, `Workload` (with its checksum) and the
synthetic text fixtures draw their prompts from.

Place in the flow: the fixtures (`workloads.py`: balanced-chat ... repetitive; `sessions.py`:
multi_turn_chat, long_doc_qa) and the JSONL reader (`workload_jsonl.py`) build these; the
runner replays them. `workloads.py` re-exports every public name here, so
`from workbench.harness.workloads import BenchRequest, Workload` stays the way to import them.

A request may follow another (`follows`, a later turn of a chat session): the runner sends it
`think_s` seconds after the request it follows has finished, successfully or not.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from workbench.harness.lengths import LengthDist

WORDS = tuple(
    "the of to and a in is for that return value list file data name type object default "
    "string set key line text result method class function module field group first new "
    "start end check count add format match number error time user system request model "
    "token cache block memory queue batch server client prompt output input length word "
    "order state table call test case path buffer stream event thread process page record "
    "index entry node tree graph point range share short long fast slow last next old open "
    "close read write send receive stop begin build run load save copy move find sort "
    "remove update create delete parse print split join river mountain garden window light "
    "music letter story city market winter summer morning evening travel simple quiet".split()
)


@dataclass(frozen=True)
class BenchRequest:
    """One request: exact prompt token ids, how many tokens to generate, and optional extras."""

    request_id: str
    prompt_token_ids: list[int]  # always token ids (exact for the in-process engine)
    max_tokens: int
    prompt: str | None = None  # the text, when known (HTTP targets may prefer it)
    arrival_s: float | None = None  # only from a user JSONL; else the arrival process decides
    group: str | None = None  # e.g. the prefix group, the chat session, the document
    follows: str | None = None  # request_id of the request this one follows (the last turn)
    think_s: float = 0.0  # with follows: seconds after that request finished to send this one
    turn: int | None = None  # the turn index in its session (group), 0 for the first

    def __post_init__(self) -> None:
        f, think = self.follows, self.think_s
        if f is not None and (not isinstance(f, str) or not f or f == self.request_id):
            raise ValueError(f"request {self.request_id!r}: follows ({f!r}) must be another "
                             "request's id (a non-empty string) or None")
        if (isinstance(think, bool) or not isinstance(think, int | float)
                or not 0 <= think < math.inf):
            raise ValueError(f"request {self.request_id!r}: think_s ({think!r}) must be a "
                             "finite number >= 0 (seconds)")
        if f is None and think != 0:
            raise ValueError(f"request {self.request_id!r}: think_s ({think}) needs follows "
                             "(the request it waits for); without it the arrival process "
                             "decides when the request is sent")
        t = self.turn
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"request {self.request_id!r}: turn ({t!r}) must be an integer "
                             ">= 0 or None")


def _percentile(values: list[int], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def checksum_row(r: BenchRequest) -> dict[str, Any]:
    """The canonical fields of one request: request_id, prompt_token_ids, max_tokens,
    arrival_s, plus follows and think_s when it follows a request and turn when set (so a
    workload without them keeps the checksum it had before these fields existed)."""
    row: dict[str, Any] = {"request_id": r.request_id,
                           "prompt_token_ids": list(r.prompt_token_ids),
                           "max_tokens": r.max_tokens, "arrival_s": r.arrival_s}
    if r.follows is not None:
        row["follows"], row["think_s"] = r.follows, float(r.think_s)
    if r.turn is not None:
        row["turn"] = r.turn
    return row


@dataclass(frozen=True)
class Workload:
    """A named, seeded request list and the parameters that made it."""

    name: str
    seed: int
    params: dict[str, Any]  # the fixture parameters after defaults, JSON-serialisable
    requests: tuple[BenchRequest, ...]

    @cached_property
    def checksum(self) -> str:
        """sha256 hex of the canonical JSON of `checksum_row` of every request, in request
        order."""
        rows = [checksum_row(r) for r in self.requests]
        blob = json.dumps(rows, separators=(",", ":"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def summary(self) -> dict[str, Any]:
        """Counts, token totals, measured p50/p95 input and output lengths, params, checksum."""
        ins = [len(r.prompt_token_ids) for r in self.requests]
        outs = [r.max_tokens for r in self.requests]
        return {
            "name": self.name, "seed": self.seed, "num_requests": len(self.requests),
            "total_input_tokens": sum(ins), "total_output_tokens": sum(outs),
            "input_len_p50": _percentile(ins, 50), "input_len_p95": _percentile(ins, 95),
            "output_len_p50": _percentile(outs, 50), "output_len_p95": _percentile(outs, 95),
            "params": self.params, "checksum": self.checksum,
        }


class _Text:
    """Synthetic text of an exact token length for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        ids = tokenizer([" " + w for w in WORDS], add_special_tokens=False)["input_ids"]
        self.cost = {w: len(i) for w, i in zip(WORDS, ids, strict=True)}
        self.singles = [w for w in WORDS if self.cost[w] == 1]

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def ids(self, rng: random.Random, n: int) -> list[int]:
        """`n` token ids of space-led words (" w1 w2 ..."), whole words when possible."""
        words, total = [], 0
        while True:
            w = rng.choice(WORDS)
            if total + self.cost[w] > n:
                break
            words.append(w)
            total += self.cost[w]
        if self.singles:
            words += [rng.choice(self.singles) for _ in range(n - total)]
        ids = self.encode("".join(" " + w for w in words))
        while len(ids) < n:  # fallback: the tokenizer is not additive over words
            words += [rng.choice(WORDS) for _ in range(n - len(ids))]
            ids = self.encode("".join(" " + w for w in words))
        return ids[:n]


def merged_params(name: str, allowed: dict[str, Any], params: dict[str, Any]
                  ) -> dict[str, Any]:
    """A fixture's params over its defaults; an unknown one is refused naming the allowed."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"fixture {name!r} got unknown params {unknown}; allowed: {sorted(allowed)}"
        )
    return {**allowed, **params}


def _int_param(p: dict[str, Any], name: str, low: int) -> int:
    v = p[name]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"{name} ({v!r}) must be an integer >= {low}")
    return v


def _upper(d: LengthDist) -> int | None:
    """The largest length `d` can produce (None: unbounded)."""
    top = {"fixed": d.value, "uniform": d.high}.get(d.kind)
    return d.max if top is None else d.clamp(top)
