"""Passkey (needle-in-a-haystack) cases: exact token counts, exact depths, seeded passkeys.

One case is a prompt of exactly `context_tokens` tokens (the model's own tokenizer, "<s>"
included) that hides one needle line in a haystack of Python standard-library code and asks
for it at the end:

    <s> [haystack: round(depth * H) tokens] PASSKEY = 48213\n [haystack: the rest] # What is
    PASSKEY?\nPASSKEY =                                  -> the answer: " 48213" (5 digits)

H is what the needle and the question leave of `context_tokens`; depth 0.0 puts the needle
right after "<s>", 1.0 right before the question. The haystack is whole top-level blocks
("chunks": a line starting in column 0 and the indented lines under it, trailing blank lines
dropped) of consecutive stdlib files, from a seeded position; the last piece is a chunk cut
to the tokens left and closed with "\\n". Every piece starts with a non-space character and
ends with one "\\n" after a non-space one, so byte-level BPE cannot merge across pieces:
tokenizing the prompt text gives back exactly the ids the case was built from (checked for
every case; a case that would break this is built from another chunk).

The held-out split (every HOLDOUT_EVERY-th file of `demo_pair.corpus_files()`, which the demo
and needle models never trained on) feeds evaluation cases; the training split feeds
`workbench.testing.needle_model`. A case's passkey and haystack position come from
`random.Random(f"{seed}/{context_tokens}/{depth}/{index}")`: the same grid on the same Python
and tokenizer is the same bytes. Scoring (`passkey_correct`): the first digits of the
generated text, after optional spaces, must equal the passkey exactly.

Torch-free (tokenizers only), a shared leaf: the trainer and the experiments layer import it.
"""

from __future__ import annotations

import random
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

NEEDLE_KEY = "PASSKEY"
NEEDLE_LINE = NEEDLE_KEY + " = {passkey}\n"
QUESTION = f"# What is {NEEDLE_KEY}?\n{NEEDLE_KEY} ="
PASSKEY_DIGITS = 5
MIN_CONTEXT_TOKENS = 64
DEFAULT_LENGTHS = (128, 256, 512, 1024)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_CASES_PER_CELL = 4
DEFAULT_SEED = 0
EXTRA_ANSWER_TOKENS = 2  # max_tokens = the answer's tokens + this (room to see it stop)
SPLITS = ("held_out", "train")

_DIGITS = re.compile(r"\s*(\d+)")


@dataclass(frozen=True)
class NeedleCase:
    """One prompt and its answer. `prompt_token_ids` = tokenizer(prompt) with "<s>"."""

    case_id: str
    context_tokens: int
    depth: float
    answer: str  # the passkey's digits
    prompt: str  # the whole text fed to the model (haystack with needle + question)
    prompt_token_ids: tuple[int, ...]
    needle_token_index: int  # index of the needle line's first token in prompt_token_ids
    max_tokens: int

    def as_json(self) -> dict[str, Any]:
        """The export row (docs/kv_compression.md, `## Quality gate`)."""
        return {
            "case_id": self.case_id, "context_tokens": self.context_tokens,
            "depth": self.depth, "prompt": self.prompt, "answer": self.answer,
            "max_tokens": self.max_tokens, "needle_token_index": self.needle_token_index,
        }


def passkey_of(text: str) -> str | None:
    """The digits a generated text answers with (leading spaces allowed), or None."""
    m = _DIGITS.match(text)
    return m.group(1) if m else None


def passkey_correct(text: str, answer: str) -> bool:
    """Exact match: the generated text's first run of digits is the passkey, no more."""
    return passkey_of(text) == answer


# ----------------------------------------------------------------------------- haystack


def code_chunks(text: str) -> list[str]:
    """`text` cut into top-level blocks: each starts at a line whose first character is not
    whitespace and holds the lines up to the next one; trailing spaces and trailing blank
    lines dropped, one "\\n" at the end."""
    chunks: list[list[str]] = []
    for line in text.splitlines():
        line = line.rstrip()
        if line and not line[0].isspace():
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
    out = []
    for lines in chunks:
        body = "\n".join(lines).rstrip()
        if body and NEEDLE_KEY not in body:
            out.append(body + "\n")
    return out


class Haystack:
    """The chunk stream of one split, tokenized once (no "<s>")."""

    def __init__(self, tokenizer: Tokenizer, texts: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        chunks = [c for t in texts for c in code_chunks(t)]
        encs = tokenizer.encode_batch(chunks, add_special_tokens=False)
        self.chunks: list[list[int]] = [list(e.ids) for e in encs]
        nl = tokenizer.encode("\n", add_special_tokens=False).ids
        if len(nl) != 1:
            raise ValueError(f"the tokenizer spells '\\n' as {len(nl)} tokens; one is needed")
        self.newline_id = int(nl[0])
        if not self.chunks:
            raise ValueError("the haystack texts hold no code chunks")

    @classmethod
    def from_stdlib(cls, tokenizer: Tokenizer, split: str = "held_out") -> Haystack:
        """The demo corpus's `split` (held_out | train) of this Python's standard library."""
        from workbench.testing.demo_pair import HOLDOUT_EVERY, corpus_files

        if split not in SPLITS:
            raise ValueError(f"split ({split!r}) must be one of {', '.join(SPLITS)}")
        root = Path(sysconfig.get_paths()["stdlib"])
        files = corpus_files(root)
        names = [f for i, f in enumerate(files) if (i % HOLDOUT_EVERY == 0) == (split ==
                                                                                 "held_out")]
        return cls(tokenizer, [(root / n).read_text(encoding="utf-8") for n in names])

    def _piece(self, ids: list[int]) -> bool:
        """Can `ids` (ending in "\\n") stand between two pieces and re-tokenize to itself?"""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return (len(text) >= 2 and not text[0].isspace() and not text[-2].isspace()
                and self.tokenizer.encode(text, add_special_tokens=False).ids == ids)

    def fill(self, n: int, rng: random.Random) -> list[int]:
        """Exactly `n` tokens (0 or >= 2) of consecutive chunks from a random start."""
        if n == 0:
            return []
        if n < 2:
            raise ValueError(f"a haystack piece needs 0 or >= 2 tokens, not {n}")
        count = len(self.chunks)
        i = rng.randrange(count)
        out: list[int] = []
        while True:
            c = self.chunks[i % count]
            left = n - len(out) - len(c)
            if left < 0 or left == 1:
                break
            out += c
            i += 1
            if left == 0:
                return out
        r = n - len(out)  # >= 2: the rest is one chunk cut to r - 1 tokens + "\n"
        for j in range(i, i + count):
            c = self.chunks[j % count]
            if len(c) >= r:
                piece = c[: r - 1] + [self.newline_id]
                if self._piece(piece):
                    return out + piece
        raise RuntimeError(f"no chunk can be cut to {r} tokens")  # pragma: no cover


# ----------------------------------------------------------------------------- cases


def random_passkey(rng: random.Random, digits: int = PASSKEY_DIGITS) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def case_rng(seed: int, context_tokens: int, depth: float, index: int) -> random.Random:
    return random.Random(f"{seed}/{context_tokens}/{depth}/{index}")


def check_grid(lengths: Sequence[int], depths: Sequence[float]) -> None:
    """ValueError naming a bad length or depth."""
    if not lengths or not depths:
        raise ValueError("the needle grid needs at least one length and one depth")
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < MIN_CONTEXT_TOKENS:
            raise ValueError(f"needle length ({n!r}) must be an integer >= "
                             f"{MIN_CONTEXT_TOKENS} (prompt tokens)")
    for d in depths:
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d <= 1:
            raise ValueError(f"needle depth ({d!r}) must be a number in [0, 1]")


def _split(h: int, depth: float) -> int:
    """Haystack tokens before the needle: round(depth * h), moved off 1 and h - 1 (a piece
    is 0 or >= 2 tokens)."""
    a = round(depth * h)
    if a == 1:
        a = 0 if depth * h < 1 else 2
    if h - a == 1:
        a = h if depth * h > h - 1 else a - 1
    return a


def make_case(
    haystack: Haystack,
    context_tokens: int,
    depth: float,
    rng: random.Random,
    case_id: str = "",
    passkey: str | None = None,
) -> NeedleCase:
    """One case of exactly `context_tokens` tokens with the needle at `depth`."""
    check_grid([context_tokens], [depth])
    tok = haystack.tokenizer
    key = random_passkey(rng) if passkey is None else passkey
    bos = list(tok.encode("", add_special_tokens=True).ids)
    needle = list(tok.encode(NEEDLE_LINE.format(passkey=key), add_special_tokens=False).ids)
    question = list(tok.encode(QUESTION, add_special_tokens=False).ids)
    answer_ids = tok.encode(" " + key, add_special_tokens=False).ids
    h = context_tokens - len(bos) - len(needle) - len(question)
    if h < 2:
        raise ValueError(f"needle length ({context_tokens}) leaves no room for a haystack")
    a = _split(h, depth)
    before = haystack.fill(a, rng)
    after = haystack.fill(h - a, rng)
    body = before + needle + after + question
    prompt = tok.decode(body, skip_special_tokens=False)
    ids = bos + body
    if list(tok.encode(prompt, add_special_tokens=True).ids) != ids:  # pragma: no cover
        raise RuntimeError(f"needle case {case_id!r} does not re-tokenize to its own ids")
    return NeedleCase(
        case_id=case_id, context_tokens=context_tokens, depth=float(depth), answer=key,
        prompt=prompt, prompt_token_ids=tuple(ids), needle_token_index=len(bos) + len(before),
        max_tokens=len(answer_ids) + EXTRA_ANSWER_TOKENS,
    )


def keep_ends(case: NeedleCase, head: int, tail: int, tokenizer: Tokenizer) -> NeedleCase:
    """A control: the case with only its first `head` and last `tail` tokens kept (what
    attention sinks + a recent window leave, re-indexed), `needle_token_index` -1 when the
    needle is cut. Full KV on this prompt shows what losing the middle costs."""
    ids = list(case.prompt_token_ids)
    if head < 1 or tail < 1 or head + tail >= len(ids):
        raise ValueError(f"keep_ends needs head, tail >= 1 and head + tail < {len(ids)}; got "
                         f"{head} + {tail}")
    kept = ids[:head] + ids[len(ids) - tail:]
    n_needle = len(tokenizer.encode(NEEDLE_LINE.format(passkey=case.answer),
                                    add_special_tokens=False).ids)
    i = case.needle_token_index
    if i + n_needle <= head:
        index = i
    elif i >= len(ids) - tail:
        index = i - (len(ids) - tail - head)
    else:
        index = -1
    return NeedleCase(
        case_id=f"{case.case_id}-ends{head}+{tail}", context_tokens=len(kept), depth=case.depth,
        answer=case.answer, prompt=tokenizer.decode(kept, skip_special_tokens=True),
        prompt_token_ids=tuple(kept), needle_token_index=index, max_tokens=case.max_tokens)


def make_grid(
    haystack: Haystack,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    cases_per_cell: int = DEFAULT_CASES_PER_CELL,
    seed: int = DEFAULT_SEED,
) -> list[NeedleCase]:
    """`cases_per_cell` seeded cases per (length, depth), lengths outer, depths inner."""
    check_grid(lengths, depths)
    if isinstance(cases_per_cell, bool) or not isinstance(cases_per_cell, int) \
            or cases_per_cell < 1:
        raise ValueError(f"cases_per_cell ({cases_per_cell!r}) must be an integer >= 1")
    return [
        make_case(haystack, n, d, case_rng(seed, n, float(d), i),
                  case_id=f"len{n}-depth{float(d):g}-{i}")
        for n in lengths for d in depths for i in range(cases_per_cell)
    ]
