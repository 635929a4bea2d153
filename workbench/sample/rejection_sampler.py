"""Verification of speculative drafts: greedy matching and exact rejection sampling.

Greedy requests (temperature 0) use `greedy_verify`: keep drafts while they equal the target's
argmax, then emit the target's argmax at the first mismatch (or the bonus position).

Sampled requests use `rejection_sample` (Leviathan et al. 2023, Chen et al. 2023; vLLM's
RejectionSampler). At one position let p be the target distribution, q the draft distribution
the draft token x was drawn from. Accept x with probability min(1, p[x] / q[x]); on rejection
emit a token drawn from the residual r = max(0, p - q) / sum(max(0, p - q)). For every token y

    P(emit y) = q[y] * min(1, p[y] / q[y]) + (1 - beta) * r[y]
              = min(p[y], q[y]) + max(0, p[y] - q[y])                    = p[y],

because the rejection probability 1 - beta = 1 - sum(min(p, q)) = sum(max(0, p - q)) is exactly
the residual's mass. So each emitted token has the target's distribution whatever q is; q only
sets the acceptance rate beta. After an acceptance the next position is verified the same way;
when all k drafts are accepted a bonus token is drawn from the target's row k. If the residual
has zero mass (p == q, where a rejection has probability 0) we draw from p instead.

n-gram drafts have no distribution: pass draft_probs=None, meaning q is one-hot at x, so x is
accepted with probability p[x] and a rejection draws from p with x removed. A greedy draft
model is one-hot too: pass None, not its softmax. Otherwise q must be the exact (temperature,
top-k, top-p processed) distribution the draft token was sampled from.

Randomness: every call draws, from the given generator and in this order, k uniforms
(`torch.rand`) and then one categorical (`torch.multinomial`, one sample over a V-wide row,
which on CPU consumes V exponentials), whatever is accepted. Rows must be valid distributions
(non-negative, finite, positive mass); values are not checked here (shapes are), and
`torch.multinomial` raises RuntimeError on rows it cannot sample.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch


def greedy_verify(draft_token_ids: list[int], target_argmax: list[int]) -> list[int]:
    """Accept drafts while `draft[i] == target_argmax[i]`, then emit one target token.

    `target_argmax` holds the target's argmax at the k + 1 scored positions. Returns the
    accepted drafts followed by `target_argmax[first mismatch]`, or by `target_argmax[k]` (the
    bonus token) when all k drafts match; length 1..k+1.
    """
    k = len(draft_token_ids)
    if len(target_argmax) != k + 1:
        raise ValueError(
            f"target_argmax must have len(draft_token_ids) + 1 = {k + 1} entries, "
            f"got {len(target_argmax)}"
        )
    out: list[int] = []
    for draft, target in zip(draft_token_ids, target_argmax, strict=False):
        if draft != target:
            break
        out.append(draft)
    out.append(target_argmax[len(out)])
    return out


def rejection_sample(
    draft_token_ids: list[int],
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """Exact speculative sampling of one request; returns accepted drafts + one token.

    draft_token_ids: the k >= 0 proposed tokens. target_probs: [k + 1, V] target distributions
    (already temperature/top-k/top-p processed). draft_probs: [k, V] distributions the drafts
    were sampled from, or None for one-hot drafts (n-gram, greedy draft model). generator: the
    request's generator (None: torch's default RNG). Returns a list of length 1..k+1.
    """
    if not isinstance(draft_token_ids, Sequence):
        raise ValueError(
            f"draft_token_ids must be a list of int token ids, got {type(draft_token_ids).__name__}"
        )
    k = len(draft_token_ids)
    vocab = _check_probs((), k, target_probs, draft_probs, generator)
    ids: list[int] = []
    for i, given in enumerate(draft_token_ids):
        tok: int | None
        try:
            tok = operator.index(given)
        except TypeError:
            tok = None
        if tok is None or not 0 <= tok < vocab:
            raise ValueError(
                f"draft_token_ids[{i}] must be an int token id in [0, V={vocab}), "
                f"got {draft_token_ids[i]!r}"
            )
        ids.append(tok)
    draft = torch.tensor([ids], dtype=torch.int64, device=target_probs.device).view(1, k)
    q = None if draft_probs is None else draft_probs.unsqueeze(0)
    row = _sample(draft, target_probs.unsqueeze(0), q, generator)[0]
    return row[row >= 0].tolist()


def rejection_sample_batch(
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """`rejection_sample` for N independent trials at once, sharing one generator.

    draft_token_ids: [N, k] integer tensor. target_probs: [N, k + 1, V]. draft_probs:
    [N, k, V] or None (one-hot drafts). Returns int64 [N, k + 1]: row n holds its emitted
    tokens (accepted drafts + one) followed by -1 padding. Draws rand([N, k]) then one
    multinomial over [N, V]; for N = 1 this is exactly `rejection_sample`.
    """
    if (
        not isinstance(draft_token_ids, torch.Tensor)
        or draft_token_ids.dim() != 2
        or draft_token_ids.dtype.is_floating_point
        or draft_token_ids.dtype == torch.bool
    ):
        raise ValueError(
            "draft_token_ids must be an integer tensor of shape [N, k], got "
            f"{_describe(draft_token_ids)}"
        )
    lead, k = tuple(draft_token_ids.shape[:1]), draft_token_ids.shape[1]
    vocab = _check_probs(lead, k, target_probs, draft_probs, generator)
    draft = draft_token_ids.to(device=target_probs.device, dtype=torch.int64)
    if draft.numel() and not (0 <= int(draft.min()) and int(draft.max()) < vocab):
        raise ValueError(
            f"draft_token_ids must be token ids in [0, V={vocab}), got values in "
            f"[{int(draft.min())}, {int(draft.max())}]"
        )
    return _sample(draft, target_probs, draft_probs, generator)


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)} and dtype {x.dtype}"
    return type(x).__name__


def _check_probs(
    lead: tuple[int, ...],
    k: int,
    target_probs: object,
    draft_probs: object,
    generator: object,
) -> int:
    """Validate shapes/dtypes against k drafts and leading dims `lead`; return V."""
    dims = "".join(f"{d}, " for d in lead)
    if (
        not isinstance(target_probs, torch.Tensor)
        or not target_probs.dtype.is_floating_point
        or tuple(target_probs.shape[:-1]) != (*lead, k + 1)
        or target_probs.dim() != len(lead) + 2
        or target_probs.shape[-1] == 0
    ):
        raise ValueError(
            f"target_probs must be a floating tensor of shape [{dims}k + 1 = {k + 1}, V > 0] "
            f"for k = {k} drafts, got {_describe(target_probs)}"
        )
    vocab = target_probs.shape[-1]
    if draft_probs is not None and (
        not isinstance(draft_probs, torch.Tensor)
        or not draft_probs.dtype.is_floating_point
        or tuple(draft_probs.shape) != (*lead, k, vocab)
        or draft_probs.device != target_probs.device
    ):
        raise ValueError(
            f"draft_probs must be None (one-hot drafts) or a floating tensor of shape "
            f"[{dims}k = {k}, V = {vocab}] on {target_probs.device} (k drafts, V from "
            f"target_probs), got {_describe(draft_probs)}"
            + (f" on {draft_probs.device}" if isinstance(draft_probs, torch.Tensor) else "")
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    return vocab


def _sample(
    draft: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Core on validated inputs: draft [N, k] int64, target [N, k+1, V], draft_probs [N, k, V]."""
    n, k = draft.shape
    device = target_probs.device
    rows = torch.arange(n, device=device)
    p_x = target_probs[:, :k].gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [N, k]
    q_x = 1.0 if draft_probs is None else draft_probs.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    u = torch.rand((n, k), generator=generator, device=device)
    accept = (p_x > 0) & (u * q_x < p_x)
    num_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [N], in 0..k

    # Final token: residual max(0, p - q) at the first rejection, the bonus row p_k otherwise.
    p = target_probs[rows, num_accepted]  # [N, V]
    q = torch.zeros_like(p)
    rejected = num_accepted < k
    if rejected.any():
        pos = num_accepted[rejected]
        if draft_probs is None:
            q[rejected] = q[rejected].scatter_(1, draft[rejected, pos].unsqueeze(1), 1.0)
        else:
            q[rejected] = draft_probs[rejected, pos].to(q.dtype)
    residual = (p - q).clamp_(min=0)
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p)
    if residual.dtype == torch.float16:
        # float16 exponentials can round to 0 inside multinomial's race, picking p = 0 tokens.
        residual = residual.float()
    final = torch.multinomial(residual, 1, generator=generator).squeeze(1)

    out = torch.full((n, k + 1), -1, dtype=torch.int64, device=device)
    keep = torch.arange(k, device=device) < num_accepted.unsqueeze(1)
    out[:, :k] = torch.where(keep, draft, -1)
    out[rows, num_accepted] = final
    return out
