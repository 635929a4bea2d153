"""The all-reduce timing behind notebook 09's "why": the collective count and the timer."""

from __future__ import annotations

import pytest

from workbench.harness.collectives import allreduce_latency, collectives_per_step


def test_collectives_per_step_is_embedding_plus_two_per_layer_plus_lm_head() -> None:
    assert [collectives_per_step(n) for n in (1, 2, 6, 32)] == [4, 6, 14, 66]
    with pytest.raises(ValueError, match=r"num_hidden_layers \(0\) must be >= 1"):
        collectives_per_step(0)


def test_allreduce_latency_times_every_size_on_fresh_ranks() -> None:
    rows = allreduce_latency(2, numels=(8, 4096), iters=20)
    assert [(r["numel"], r["bytes"]) for r in rows] == [(8, 32), (4096, 16384)]
    for r in rows:
        assert 0 < r["median_us"] <= r["p90_us"] < 1e6  # a microsecond-scale call, ordered


@pytest.mark.parametrize(("kw", "message"), [
    ({"world_size": 1}, r"world_size \(1\) must be >= 2"),
    ({"iters": 0}, r"iters \(0\) and every numel"),
    ({"numels": (0,)}, r"every numel \(\(0,\)\) must be >= 1"),
])
def test_bad_arguments_are_one_clear_error(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allreduce_latency(**kw)
