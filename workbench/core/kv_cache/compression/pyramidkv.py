"""PyramidKV (Cai et al. 2024): SnapKV's selection with a budget per layer, larger in the
lower layers (attention there is spread wide) and smaller in the higher ones (it funnels onto
a few tokens).

Per-layer budgets (the paper's arithmetic series, as its reference code and kvpress compute
it; here in exact rationals): with B the budget per layer (the mean), w the window, P the
prompt length and L layers, the selectable mean is K = B - w and

    min = K / beta,  max = 2K - min              (mean of the series = K)
    if max >= P - w:  max = P - w,  min = 2K - max   (layer 0 cannot keep more than the prompt)
    layer l keeps  round(max - l * (max - min) / (L - 1)) + w  tokens   (round half up)

K <= 0 (a budget within the window) or L = 1 gives every layer B. In blocks a layer keeps
its window blocks W plus ceil(budget_l / bs) - |W| prompt blocks chosen by *its own* scores.

    B 64, w 8, P 200, beta 4, L 4:  K 56, min 14, max 98, step 28
    -> layer budgets 106, 78, 50, 22 tokens (mean 64)

Memory: a block is freed only when every layer dropped it (the decision's `evict`); a block
some layer still keeps stays in the pool and the other layers skip it through their own
block table (`layer_drop`). So the blocks a request holds are the union of the layers' kept
sets: at least layer 0's ceil(budget_0 / bs), about 2 x the mean budget, and up to the whole
prompt when the layers pick different blocks. What shrinks with the mean budget is the
attention work of the upper layers, not the pool. docs/kv_compression.md.
"""

from __future__ import annotations

from fractions import Fraction

from workbench.core.kv_cache.compression.policy import (
    EvictionDecision,
    RequestKVView,
    register_policy,
)
from workbench.core.kv_cache.compression.selection import top_blocks
from workbench.core.kv_cache.compression.snapkv import SnapKVPolicy


def pyramid_budgets(budget_tokens: int, window: int, num_prompt_tokens: int, beta: float,
                    num_layers: int) -> list[int]:
    """Tokens each layer keeps (window included), layer 0 first (see the module docstring)."""
    k = Fraction(budget_tokens - window)
    if k <= 0 or num_layers == 1:
        return [budget_tokens] * num_layers
    lo = k / Fraction(beta)
    hi = 2 * k - lo
    room = num_prompt_tokens - window
    if hi >= room:
        hi = Fraction(room)
        lo = 2 * k - hi
    step = (hi - lo) / (num_layers - 1)
    return [int((hi - layer * step + Fraction(1, 2)) // 1) + window
            for layer in range(num_layers)]


@register_policy
class PyramidKVPolicy(SnapKVPolicy):
    method = "pyramidkv"
    per_layer = True

    def layer_budget_blocks(self, view: RequestKVView) -> list[int]:
        """Blocks each layer keeps of the prompt (window blocks included)."""
        budgets = pyramid_budgets(view.budget_tokens, self.config.window_size,
                                  view.num_prompt_tokens, self.config.beta, self.num_layers)
        return [-(-b // self.block_size) for b in budgets]

    def decide(self, view: RequestKVView, per_layer: list[dict[int, float]]
               ) -> EvictionDecision | None:
        win, cands = self.candidates(view)
        drops: list[set[int]] = []
        for layer, blocks in enumerate(self.layer_budget_blocks(view)):
            scores = per_layer[layer] if layer < len(per_layer) else {}
            keep = set(top_blocks(cands, scores, blocks - len(win)))
            drops.append({b for b in cands if b not in keep})
        everywhere = set.intersection(*drops) if drops else set()
        layer_drop = [sorted(d - everywhere) for d in drops]
        if not everywhere and not any(layer_drop):
            return None
        return EvictionDecision(evict=sorted(everywhere),
                                layer_drop=layer_drop if any(layer_drop) else None)
