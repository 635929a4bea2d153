"""The calibrated model's form and its fit: step time linear in the analytic model's terms.

    step_s = c_overhead                              fixed per step
           + c_token x (prefill_tokens + decode_tokens)   the GEMMs, per token
           + c_token_low x min(tokens, TOKEN_KNEE)        ... and the first TOKEN_KNEE tokens'
                                                           extra (a small GEMM runs below the
                                                           CPU's per-token rate)
           + c_prefill_attn_pair x prefill_attn_pairs      prefill attention
           + c_decode_kv_token x decode_context_tokens     decode attention (KV read)
           + c_seq x num_seqs                              per-request work (inputs, metadata)
           + c_prefill_seq x prefill_seqs                  per prefill chunk (its own gather
                                                           and attention call, every layer)
           + c_sampled_row x sampled_rows                  LM head and sampling
           + c_draft_token x draft_tokens                  speculation: proposing and
                                                           verifying each draft token

The two terms after the first four came from the served steps' residuals (2026-12-06, AMD
EPYC, 2 cores): with tokens alone, steps of 2-128 tokens ran 20-50% over the fit and steps of
1024+ tokens 13-27% under it, and a prefill chunk of a few tokens cost ~2 ms more than a
decode token.

`fit_step_times(samples)` finds non-negative coefficients (scipy's NNLS) minimizing the
*relative* squared error (each step's row divided by its time, so short decode steps weigh as
much as long prefills), on a training part of the steps; the rest (`heldout_fraction`, drawn
by a seeded permutation) measure it: median and p95 relative error. Columns are scaled to
unit norm before NNLS (the pair counts dwarf the constant) and scaled back.

Timing noise on a shared CPU is one-sided (another process, the OS tick or the garbage
collector only ever stretch a step), so: `fastest_per_batch` keeps the fastest time of each
distinct batch (the calibration design repeats its batches exactly), and up to
OUTLIER_PASSES times, training steps slower than predicted by more than
max(OUTLIER_FACTOR x the median relative error, OUTLIER_FLOOR) are dropped and the fit is
repeated; how many is reported. Steps faster than predicted are never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from workbench.sim.batch import BatchComposition

TERMS = ("overhead", "token", "prefill_attn_pair", "decode_kv_token", "seq", "sampled_row",
         "token_low", "prefill_seq", "draft_token")
TOKEN_KNEE = 128
OUTLIER_FACTOR = 3.0
OUTLIER_FLOOR = 0.15
OUTLIER_PASSES = 3


def features(batch: BatchComposition) -> tuple[float, ...]:
    """The batch's value of each of TERMS (the overhead's is 1)."""
    return (1.0, float(batch.num_tokens), float(batch.prefill_attn_pairs),
            float(batch.decode_context_tokens), float(batch.num_seqs), float(batch.sampled_rows),
            float(min(batch.num_tokens, TOKEN_KNEE)), float(batch.prefill_seqs),
            float(batch.draft_tokens))


def predict(coefficients: Mapping[str, float], batch: BatchComposition) -> float:
    """Seconds: sum over TERMS of coefficient x feature."""
    return sum(coefficients[t] * x for t, x in zip(TERMS, features(batch), strict=True))


@dataclass(frozen=True)
class FitResult:
    """Coefficients (seconds per unit of each term) and how well they predict."""

    coefficients: dict[str, float]
    num_train: int
    num_heldout: int
    num_outliers: int  # training steps dropped by the outlier pass
    train_median_rel_error: float
    heldout_median_rel_error: float | None  # None without held-out steps
    heldout_p95_rel_error: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"coefficients_s": dict(self.coefficients), "num_train": self.num_train,
                "num_heldout": self.num_heldout, "num_outliers": self.num_outliers,
                "train_median_rel_error": self.train_median_rel_error,
                "heldout_median_rel_error": self.heldout_median_rel_error,
                "heldout_p95_rel_error": self.heldout_p95_rel_error}


def fastest_per_batch(samples: Sequence[tuple[BatchComposition, float]]
                      ) -> list[tuple[BatchComposition, float]]:
    """The fastest time of each distinct batch, in first-seen order."""
    best: dict[BatchComposition, float] = {}
    for batch, seconds in samples:
        best[batch] = min(seconds, best.get(batch, seconds))
    return list(best.items())


def _nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative c minimizing sum(((x c - y) / y)^2)."""
    a = x / y[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    c, _ = nnls(a / scale, np.ones_like(y))
    return np.asarray(c / scale)


def _rel_errors(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.asarray(np.abs(x @ c - y) / y)


def fit_step_times(samples: Sequence[tuple[BatchComposition, float]],
                   heldout_fraction: float = 0.25, seed: int = 0,
                   drop_outliers: bool = True) -> FitResult:
    """Fit TERMS' coefficients to (batch, seconds) steps (see the module docstring). Needs at
    least len(TERMS) training steps; every time must be > 0. `drop_outliers=False` keeps
    every slow step (a served step's garbage collection or a neighbour's burst is part of
    what a served run costs: `calibrate --serving`)."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction ({heldout_fraction}) must be in [0, 1)")
    n = len(samples)
    num_heldout = int(n * heldout_fraction)
    if n - num_heldout < len(TERMS):
        raise ValueError(f"fit_step_times needs at least {len(TERMS)} training steps; got "
                         f"{n - num_heldout} of {n} (heldout_fraction {heldout_fraction})")
    bad = [i for i, (_, s) in enumerate(samples) if not s > 0]
    if bad:
        raise ValueError(f"step times must be > 0; steps {bad[:5]} are not")
    x = np.array([features(b) for b, _ in samples], dtype=np.float64)
    y = np.array([s for _, s in samples], dtype=np.float64)
    order = np.random.default_rng(seed).permutation(n)
    held, train = order[:num_heldout], order[num_heldout:]
    c = _nnls_relative(x[train], y[train])
    num_outliers = 0
    for _ in range(OUTLIER_PASSES if drop_outliers else 0):
        pred = x[train] @ c
        slower = (y[train] - pred) / y[train]
        limit = max(OUTLIER_FACTOR * float(np.median(np.abs(slower))), OUTLIER_FLOOR)
        keep = slower <= limit
        if keep.all() or int(keep.sum()) < len(TERMS):
            break
        num_outliers += int((~keep).sum())
        train = train[keep]
        c = _nnls_relative(x[train], y[train])
    train_err = _rel_errors(x[train], y[train], c)
    held_err = _rel_errors(x[held], y[held], c) if num_heldout else np.zeros(0)
    return FitResult(
        coefficients={t: float(v) for t, v in zip(TERMS, c, strict=True)},
        num_train=len(train), num_heldout=num_heldout, num_outliers=num_outliers,
        train_median_rel_error=float(np.median(train_err)),
        heldout_median_rel_error=float(np.median(held_err)) if num_heldout else None,
        heldout_p95_rel_error=float(np.percentile(held_err, 95)) if num_heldout else None)
