"""Synthetic prompt token ids for traces that record only lengths (and, for Mooncake, the
hash ids of shared prefix blocks).

Each piece of a prompt is keyed, and depends only on the seed and its key, never on which
other requests were kept:

    ("block", h)      a Mooncake hash id's block: block_size tokens, the same list in every
                      request that names h (a partial last block is its first tokens), so
                      prefix caching sees exactly the sharing the trace records
    ("request", i)    the unshared tokens of the file's i-th record

A piece is HEAD (8) tokens drawn from `random.Random("<seed>:<key>")`, then a slice of a
seeded random tape (TAPE tokens, wrapping) at an offset drawn from the same generator: the
drawn head makes two pieces differ from their first block on (prefix-cache hashes chain, so
nothing after it can be shared by chance), and the slice costs a list copy, not a draw per
token (a 200k-request trace in seconds, the ids shared int objects).

With a tokenizer the ids are the workload fixtures' space-led words (`_Text`), so the prompt
decodes to readable text; without one they are uniform in [0, vocab_size).
"""

from __future__ import annotations

import random
from typing import Any

from workbench.harness.workload_base import _Text

HEAD = 8
TAPE = 1 << 18  # tokens of the tape without a tokenizer
TAPE_TEXT = 1 << 15  # with one (tokenizing it is the cost)


class PromptIds:
    """Deterministic token ids for one (seed, tokenizer or vocab_size)."""

    def __init__(self, seed: int, tokenizer: Any | None, vocab_size: int,
                 block_size: int) -> None:
        self.seed, self.block_size = seed, block_size
        self.text = _Text(tokenizer) if tokenizer is not None else None
        self._pool = list(range(vocab_size))  # drawn ids share these int objects
        self._blocks: dict[int, list[int]] = {}
        self._tape: list[int] | None = None

    def _random(self, rng: random.Random, n: int) -> list[int]:
        return self.text.ids(rng, n) if self.text is not None else rng.choices(self._pool, k=n)

    def tape(self) -> list[int]:
        """The seeded tape pieces are sliced from (built on first use)."""
        if self._tape is None:
            rng = random.Random(f"{self.seed}:tape")
            self._tape = self._random(rng, TAPE_TEXT if self.text is not None else TAPE)
        return self._tape

    def _draw(self, key: str, n: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{key}")
        ids = self._random(rng, min(n, HEAD))
        if len(ids) < n:
            tape = self.tape()
            off = rng.randrange(len(tape))
            ids += tape[off:off + n - len(ids)]
            while len(ids) < n:
                ids += tape[:n - len(ids)]
        return ids

    def block(self, hash_id: int) -> list[int]:
        """The block_size token ids of hash id `hash_id` (cached)."""
        ids = self._blocks.get(hash_id)
        if ids is None:
            ids = self._blocks[hash_id] = self._draw(f"block:{hash_id}", self.block_size)
        return ids

    def prompt(self, index: int, length: int, hash_ids: tuple[int, ...] = ()) -> list[int]:
        """`length` ids: the blocks of `hash_ids` in order (cut at `length`), then the
        record's own tokens for what they do not cover."""
        ids: list[int] = []
        for h in hash_ids:
            ids += self.block(h)[:length - len(ids)]
        if len(ids) < length:
            ids += self._draw(f"request:{index}", length - len(ids))
        return ids

    def decode(self, ids: list[int]) -> str | None:
        """The text of `ids` with the tokenizer (HTTP targets may send it); None without."""
        return None if self.text is None else str(self.text.tok.decode(ids))
