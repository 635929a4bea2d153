"""Synthetic prompt token ids for traces that record only lengths (and, for Mooncake, the
hash ids of shared prefix blocks).

Each piece of a prompt is drawn from its own `random.Random("<seed>:<key>")`, so a piece
depends only on the seed and its key, never on which other requests were kept:

    ("block", h)      a Mooncake hash id's block: block_size tokens, the same list in every
                      request that names h (a partial last block is its first tokens), so
                      prefix caching sees exactly the sharing the trace records
    ("request", i)    the unshared tokens of the file's i-th record

With a tokenizer the ids are the workload fixtures' space-led words (`_Text`), so the prompt
decodes to readable text; without one they are uniform in [0, vocab_size).
"""

from __future__ import annotations

import random
from typing import Any

from workbench.harness.workload_base import _Text


class PromptIds:
    """Deterministic token ids for one (seed, tokenizer or vocab_size)."""

    def __init__(self, seed: int, tokenizer: Any | None, vocab_size: int,
                 block_size: int) -> None:
        self.seed, self.vocab, self.block_size = seed, vocab_size, block_size
        self.text = _Text(tokenizer) if tokenizer is not None else None
        self._blocks: dict[int, list[int]] = {}

    def _draw(self, key: str, n: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{key}")
        if self.text is not None:
            return self.text.ids(rng, n)
        return rng.choices(range(self.vocab), k=n)

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
