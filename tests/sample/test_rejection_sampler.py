"""Rejection sampler: exact greedy cases, exact degenerate cases, and chi-square tests that the
emitted tokens are distributed as the target (the whole point of speculative sampling)."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.sample.rejection_sampler import (
    greedy_verify,
    rejection_sample,
    rejection_sample_batch,
)

V = 6
ALPHA = 1e-3
# Upper ALPHA = 1e-3 quantiles of the chi-square distribution, {df: critical value}
# (scipy.stats.chi2.isf(1e-3, df)); used when scipy is not installed.
CHI2_CRIT_1E3 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}
# Two-sided normal quantile for ALPHA = 1e-3 (binomial acceptance-rate checks).
Z_1E3 = 3.2905


def _dist(*values: float) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float64)
    return (t / t.sum()).float()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _chi2_critical(df: int) -> float:
    try:
        from scipy.stats import chi2
    except ImportError:
        return CHI2_CRIT_1E3[df]
    return float(chi2.isf(ALPHA, df))


def assert_distributed_as(samples: torch.Tensor, p: torch.Tensor) -> None:
    """Chi-square goodness of fit of token samples to p at ALPHA; p == 0 tokens must not occur."""
    assert samples.numel() > 0
    assert int(samples.min()) >= 0 and int(samples.max()) < p.numel()
    counts = torch.bincount(samples, minlength=p.numel()).double()
    p = p.double() / p.double().sum()
    support = p > 0
    assert counts[~support].sum() == 0, f"zero-probability tokens emitted: {counts.tolist()}"
    df = int(support.sum()) - 1
    if df == 0:
        return
    expected = samples.numel() * p[support]
    assert float(expected.min()) >= 5, "too few samples for the chi-square approximation"
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    crit = _chi2_critical(df)
    assert stat < crit, f"chi2 {stat:.2f} >= {crit:.2f} (df {df}): {counts.tolist()} vs {p}"


def assert_binomial(successes: int, n: int, prob: float) -> None:
    """successes ~ Binomial(n, prob), two-sided normal test at ALPHA (+0.5 for rounding)."""
    sigma = math.sqrt(max(n * prob * (1 - prob), 0.0))
    assert abs(successes - n * prob) <= Z_1E3 * sigma + 0.5, (successes, n, prob)


def _accept_rate(p: torch.Tensor, q: torch.Tensor) -> float:
    return float(torch.minimum(p.double(), q.double()).sum())


def _num_accepted(out: torch.Tensor) -> torch.Tensor:
    return (out >= 0).sum(dim=1) - 1


# --- greedy_verify ---------------------------------------------------------------------------


def test_greedy_verify_all_accepted_appends_bonus() -> None:
    assert greedy_verify([4, 5, 6], [4, 5, 6, 9]) == [4, 5, 6, 9]


def test_greedy_verify_mismatch_at_first_position() -> None:
    assert greedy_verify([4, 5, 6], [7, 5, 6, 9]) == [7]


def test_greedy_verify_mismatch_in_middle() -> None:
    assert greedy_verify([4, 5, 6, 1], [4, 5, 8, 1, 9]) == [4, 5, 8]


def test_greedy_verify_k0() -> None:
    assert greedy_verify([], [3]) == [3]


def test_greedy_verify_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"target_argmax .* 3 entries, got 2"):
        greedy_verify([1, 2], [1, 2])


# --- rejection_sample: exact cases ------------------------------------------------------------


def _one_hot(*tokens: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_one_hot_target_equal_to_draft_always_accepted(with_draft_probs: bool) -> None:
    drafts = [2, 0, 4]
    target = _one_hot(2, 0, 4, 5)  # bonus row: one-hot at 5
    q = torch.full((3, V), 1.0 / V) if with_draft_probs else None
    for seed in range(30):
        assert rejection_sample(drafts, target, q, _gen(seed)) == [2, 0, 4, 5]


def test_k0_emits_bonus_token() -> None:
    assert rejection_sample([], _one_hot(3), None, _gen(0)) == [3]
    out = rejection_sample_batch(
        torch.zeros(5000, 0, dtype=torch.int64), _dist(1, 0, 2, 0, 3, 1).expand(5000, 1, V),
        None, _gen(1),
    )
    assert out.shape == (5000, 1)
    assert_distributed_as(out[:, 0], _dist(1, 0, 2, 0, 3, 1))


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_zero_target_prob_at_draft_always_rejected(with_draft_probs: bool) -> None:
    p0 = _dist(3, 1, 0, 2, 1, 1)  # p[2] == 0 at the draft token
    target = torch.stack([p0, _dist(1, 1, 1, 1, 1, 1), _dist(1, 1, 1, 1, 1, 1)])
    q = _dist(1, 1, 4, 1, 1, 1).expand(2, V) if with_draft_probs else None
    for seed in range(20):
        out = rejection_sample([2, 2], target, q, _gen(seed))
        assert len(out) == 1 and out[0] != 2
    n = 20000
    out = rejection_sample_batch(
        torch.full((n, 2), 2), target.expand(n, 3, V),
        None if q is None else q.expand(n, 2, V), _gen(7),
    )
    assert (out[:, 1:] == -1).all()
    # The replacement is drawn from max(0, p - q) normalised (q one-hot or not: p[2] = 0).
    expected = (p0 - (q[0] if q is not None else _one_hot(2)[0])).clamp(min=0)
    assert_distributed_as(out[:, 0], expected)


def test_zero_mass_residual_falls_back_to_target() -> None:
    # p == q, but the draft token has p = q = 0: rejected, residual max(0, p - q) is empty.
    target = _one_hot(3, 1)
    assert rejection_sample([1], target, _one_hot(3), _gen(0)) == [3]


def test_rejection_stops_at_first_rejected_position() -> None:
    # Position 0 accepted for sure, position 1 rejected for sure (p[x] = 0), replacement one-hot.
    target = torch.stack([_one_hot(2)[0], _dist(0, 0, 0, 0, 1, 0), _one_hot(5)[0]])
    for seed in range(20):
        assert rejection_sample([2, 3], target, None, _gen(seed)) == [2, 4]


# --- distribution tests -----------------------------------------------------------------------

DIST_CASES = {
    "generic": (_dist(30, 5, 25, 10, 20, 10), _dist(10, 30, 5, 25, 10, 20)),
    "q_has_zeros": (_dist(20, 10, 25, 15, 10, 20), _dist(0, 50, 0, 30, 20, 0)),
    "p_has_zeros": (_dist(40, 0, 30, 0, 30, 0), _dist(1, 1, 1, 1, 1, 1)),
    "both_have_zeros": (_dist(0, 35, 0, 40, 25, 0), _dist(30, 30, 0, 0, 20, 20)),
    "disjoint_supports": (_dist(50, 50, 0, 0, 0, 0), _dist(0, 0, 40, 30, 30, 0)),
    "p_equals_q": (_dist(5, 10, 15, 20, 25, 25), _dist(5, 10, 15, 20, 25, 25)),
    "peaked_p_flat_q": (_dist(90, 2, 2, 2, 2, 2), _dist(1, 1, 1, 1, 1, 1)),
}


@pytest.mark.parametrize("case", list(DIST_CASES))
def test_first_token_distribution_matches_target(case: str) -> None:
    p, q = DIST_CASES[case]
    n = 40000
    drafts = torch.multinomial(q, n, replacement=True, generator=_gen(100)).view(n, 1)
    bonus = _dist(1, 1, 1, 1, 1, 1)
    out = rejection_sample_batch(
        drafts, torch.stack([p, bonus]).expand(n, 2, V), q.expand(n, 1, V), _gen(200)
    )
    assert_distributed_as(out[:, 0], p)
    assert_binomial(int((_num_accepted(out) == 1).sum()), n, _accept_rate(p, q))


@pytest.mark.parametrize("draft_token", [0, 1, 2, 5])
def test_one_hot_draft_first_token_distribution_matches_target(draft_token: int) -> None:
    # n-gram drafts: a fixed token, q one-hot (draft_probs=None); p[2] = 0, p[0] large.
    p = _dist(45, 5, 0, 20, 10, 20)
    n = 40000
    out = rejection_sample_batch(
        torch.full((n, 1), draft_token), torch.stack([p, p]).expand(n, 2, V), None, _gen(300)
    )
    assert_distributed_as(out[:, 0], p)
    assert_binomial(int((_num_accepted(out) == 1).sum()), n, float(p[draft_token]))


def test_k2_later_tokens_distributed_as_their_target_rows() -> None:
    # Position-dependent p_i, q_i. Given position 0 accepted, token 1 ~ p_1; given both
    # accepted, the bonus ~ p_2; token 0 ~ p_0 unconditionally.
    p = torch.stack([_dist(30, 5, 25, 10, 20, 10), _dist(0, 20, 30, 10, 25, 15),
                     _dist(10, 10, 40, 0, 20, 20)])
    q = torch.stack([_dist(20, 10, 20, 10, 20, 20), _dist(10, 25, 25, 15, 25, 0)])
    n = 40000
    drafts = torch.stack(
        [torch.multinomial(q[i], n, replacement=True, generator=_gen(400 + i)) for i in range(2)],
        dim=1,
    )
    out = rejection_sample_batch(drafts, p.expand(n, 3, V), q.expand(n, 2, V), _gen(500))
    acc = _num_accepted(out)
    assert_distributed_as(out[:, 0], p[0])
    first_ok = acc >= 1
    assert_distributed_as(out[first_ok, 1], p[1])
    assert_distributed_as(out[acc == 2, 2], p[2])
    assert_binomial(int(first_ok.sum()), n, _accept_rate(p[0], q[0]))
    assert_binomial(int((acc == 2).sum()), int(first_ok.sum()), _accept_rate(p[1], q[1]))
    assert (out[:, 1:][acc.unsqueeze(1) < torch.arange(1, 3)] == -1).all()


def test_public_function_distribution_matches_target() -> None:
    # The per-request entry point itself (slower, so fewer draws), draft model and n-gram.
    p, q = DIST_CASES["q_has_zeros"]
    target = torch.stack([p, p])
    g_draft, g = _gen(600), _gen(601)
    drafts = torch.multinomial(q, 5000, replacement=True, generator=g_draft).tolist()
    firsts = [rejection_sample([x], target, q.view(1, V), g)[0] for x in drafts]
    assert_distributed_as(torch.tensor(firsts), p)
    firsts = [rejection_sample([3], target, None, g)[0] for _ in range(3000)]
    assert_distributed_as(torch.tensor(firsts), p)


# --- RNG contract -----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 3])
def test_public_function_equals_batch_of_one(k: int) -> None:
    p = torch.stack([_dist(30, 5, 25, 10, 20, 10), _dist(0, 20, 30, 10, 25, 15)] * 2)[: k + 1]
    q = torch.stack([_dist(20, 10, 20, 10, 20, 20)] * k) if k else torch.empty(0, V)
    for seed in range(40):
        drafts = torch.multinomial(q, 1, generator=_gen(seed)).view(k).tolist() if k else []
        for draft_probs in (q, None):
            got = rejection_sample(drafts, p, draft_probs, _gen(seed))
            row = rejection_sample_batch(
                torch.tensor([drafts], dtype=torch.int64).view(1, k), p.unsqueeze(0),
                None if draft_probs is None else draft_probs.unsqueeze(0), _gen(seed),
            )[0]
            assert got == row[row >= 0].tolist()
            assert 1 <= len(got) <= k + 1


def test_rng_consumption_is_k_uniforms_and_one_categorical_whatever_the_outcome() -> None:
    k = 2
    accept_all = _one_hot(1, 2, 3)
    reject_first = torch.stack([_dist(0, 1, 1, 1, 1, 1)] * 3)
    states = []
    for drafts, target, expected in (([1, 2], accept_all, [1, 2, 3]), ([0, 2], reject_first, None)):
        g = _gen(9)
        out = rejection_sample(drafts, target, None, g)
        assert out == expected if expected else len(out) == 1
        states.append(g.get_state())
    g = _gen(9)
    torch.rand(k, generator=g)
    torch.multinomial(torch.ones(V), 1, generator=g)
    assert torch.equal(states[0], states[1])
    assert torch.equal(states[0], g.get_state())


def test_none_generator_uses_default_rng() -> None:
    p = torch.stack([_dist(1, 1, 1, 1, 1, 1)] * 3)
    with torch.random.fork_rng(devices=[]):
        runs = []
        for _ in range(2):
            torch.manual_seed(1234)
            runs.append([rejection_sample([0, 1], p, None, None) for _ in range(20)])
    assert runs[0] == runs[1]
    g = _gen(1234)
    assert runs[0] == [rejection_sample([0, 1], p, None, g) for _ in range(20)]


# --- bad inputs -------------------------------------------------------------------------------

P3 = torch.full((3, V), 1.0 / V)  # valid target for k = 2
Q2 = torch.full((2, V), 1.0 / V)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([0, 1], P3[:2], None, None), r"^target_probs .*k \+ 1 = 3.*got tensor of shape \[2, 6\]"),
        (([0, 1], P3[0], None, None), r"^target_probs .*got tensor of shape \[6\]"),
        (([0, 1], P3.long(), None, None), r"^target_probs must be a floating tensor"),
        (([0, 1], P3.tolist(), None, None), r"^target_probs .*got list"),
        (([0, 1], torch.empty(3, 0), None, None), r"^target_probs .*V > 0"),
        (([0, 1], P3, Q2[:1], None), r"^draft_probs .*k = 2, V = 6.*got tensor of shape \[1, 6\]"),
        (([0, 1], P3, torch.ones(2, V + 1), None), r"^draft_probs .*got tensor of shape \[2, 7\]"),
        (([0, 1], P3, Q2.tolist(), None), r"^draft_probs .*got list"),
        (([0, 6], P3, None, None), r"^draft_token_ids\[1\] .*\[0, V=6\), got 6"),
        (([-1, 0], P3, None, None), r"^draft_token_ids\[0\] .*got -1"),
        (([0, 1.0], P3, None, None), r"^draft_token_ids\[1\] .*got 1.0"),
        ((torch.tensor([0, 1]), P3, None, None), r"^draft_token_ids must be a list"),
        (([0, 1], P3, None, 7), r"^generator must be a torch.Generator or None, got int"),
    ],
)
def test_rejection_sample_bad_inputs_name_the_argument(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rejection_sample(*args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(4, dtype=torch.int64), P3.expand(4, 3, V), None, None),
         r"^draft_token_ids must be an integer tensor of shape \[N, k\], got .*\[4\]"),
        ((torch.zeros(4, 2), P3.expand(4, 3, V), None, None), r"^draft_token_ids .*float32"),
        ((torch.zeros(4, 2, dtype=torch.int64), P3.expand(5, 3, V), None, None),
         r"^target_probs .*\[4, k \+ 1 = 3, V > 0\].*\[5, 3, 6\]"),
        ((torch.zeros(4, 2, dtype=torch.int64), P3.expand(4, 3, V), Q2, None),
         r"^draft_probs .*\[4, k = 2, V = 6\].*got tensor of shape \[2, 6\]"),
        ((torch.full((4, 2), V), P3.expand(4, 3, V), None, None),
         r"^draft_token_ids must be token ids in \[0, V=6\), got values in \[6, 6\]"),
    ],
)
def test_rejection_sample_batch_bad_inputs_name_the_argument(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rejection_sample_batch(*args)


def test_chi2_table_matches_scipy() -> None:
    chi2 = pytest.importorskip("scipy.stats").chi2
    for df, value in CHI2_CRIT_1E3.items():
        assert float(chi2.isf(ALPHA, df)) == pytest.approx(value, abs=1e-3)
