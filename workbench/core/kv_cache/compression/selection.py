"""Shared arithmetic of the score-based policies (h2o, snapkv, pyramidkv): which logical
block a score column belongs to, and top-k selection with a fixed tie rule.

    score columns   the worker reports column k for row position k of the table the
                    forward ran with: logical block view.kept_blocks[k]; columns past the
                    view's kept blocks are blocks allocated for that step, which take the
                    next logical indices (view.num_logical_blocks on).
    ties            a higher score wins; between equal scores the older (lower logical
                    index) block wins, so every selection is a pure function of its inputs.
"""

from __future__ import annotations

from collections.abc import Iterable

from workbench.core.kv_cache.compression.policy import RequestKVView


def column_blocks(view: RequestKVView, num_columns: int) -> list[int]:
    """Logical block index of each of the `num_columns` score columns."""
    kept = list(view.kept_blocks[:num_columns])
    nxt = max(view.num_logical_blocks, kept[-1] + 1 if kept else 0)
    while len(kept) < num_columns:
        kept.append(nxt)
        nxt += 1
    return kept


def layer_block_scores(view: RequestKVView, scores: Iterable[Iterable[float]]
                       ) -> list[dict[int, float]]:
    """[num_layers, num_columns] (a numpy array or nested lists) -> per layer,
    {logical block: score}."""
    out: list[dict[int, float]] = []
    for row in scores:
        values = [float(v) for v in row]
        out.append(dict(zip(column_blocks(view, len(values)), values, strict=True)))
    return out


def summed_block_scores(view: RequestKVView, scores: Iterable[Iterable[float]]
                        ) -> dict[int, float]:
    """[num_layers, num_columns] -> {logical block: score summed over layers}."""
    total: dict[int, float] = {}
    for per_layer in layer_block_scores(view, scores):
        for block, value in per_layer.items():
            total[block] = total.get(block, 0.0) + value
    return total


def top_blocks(candidates: Iterable[int], scores: dict[int, float], k: int) -> list[int]:
    """The k highest-scoring candidates (a missing score counts 0; ties: older first),
    ascending."""
    if k <= 0:
        return []
    ranked = sorted(candidates, key=lambda b: (-scores.get(b, 0.0), b))
    return sorted(ranked[:k])


def bottom_blocks(candidates: Iterable[int], scores: dict[int, float], k: int) -> list[int]:
    """The k candidates a top-k selection would drop first: the lowest scores (a missing
    score counts 0; ties: the newer block goes first, so the older one is kept), ascending."""
    if k <= 0:
        return []
    ranked = sorted(candidates, key=lambda b: (scores.get(b, 0.0), -b))
    return sorted(ranked[:k])


def window_blocks(first_token: int, end_token: int, block_size: int) -> list[int]:
    """Logical blocks holding any token of [first_token, end_token)."""
    if end_token <= first_token:
        return []
    return list(range(first_token // block_size, (end_token - 1) // block_size + 1))
