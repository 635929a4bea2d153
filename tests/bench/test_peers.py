"""The transformers peers return each request's own greedy tokens (padding and truncation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.harness.offline_workload import (
    OfflineRequest,
    make_offline_workload,
    non_special_token_range,
)

tiny_checkpoint = pytest.importorskip("workbench.testing").tiny_checkpoint
hf = pytest.importorskip("workbench.bench.peers.hf_generate")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), arch="llama", seed=0))


@pytest.fixture(scope="module")
def model(ckpt: Path):  # noqa: ANN201
    return hf.load_hf_model(ckpt)


@pytest.fixture(scope="module")
def requests(ckpt: Path) -> list[OfflineRequest]:
    # Different prompt lengths (left padding) and output lengths (truncation per row).
    return make_offline_workload(7, num_requests=4, prompt_len_range=(3, 12),
                                 output_len_range=(2, 9), token_range=non_special_token_range(ckpt))


@torch.inference_mode()
def one_at_a_time(model, reqs: list[OfflineRequest]) -> list[list[int]]:  # noqa: ANN001
    out = []
    for r in reqs:
        ids = torch.tensor([r.prompt_token_ids])
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=False, max_new_tokens=r.max_tokens)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


def test_static_batches_match_single_requests(model, requests) -> None:  # noqa: ANN001
    assert len({len(r.prompt_token_ids) for r in requests}) > 1
    assert len({r.max_tokens for r in requests}) > 1
    expected = one_at_a_time(model, requests)
    assert [len(t) for t in expected] == [r.max_tokens for r in requests]
    # One padded batch of 4, and batches of 3 + 1 (the last one smaller).
    assert hf.generate_static(model, requests, batch_size=4) == expected
    assert hf.generate_static(model, requests, batch_size=3) == expected


def test_eos_is_ignored(model, requests) -> None:  # noqa: ANN001
    """Make the first greedy token the EOS id: the static peer still runs to max_tokens."""
    first = one_at_a_time(model, requests[:1])[0][0]
    try:
        model.generation_config.eos_token_id = first
        stopped = one_at_a_time(model, requests[:1])[0]
        hf.disable_eos(model)
        out = hf.generate_static(model, requests[:1], batch_size=1)
    finally:
        hf.disable_eos(model)
    assert len(stopped) == 1  # the check is real: with EOS set, generate stops at once
    assert len(out[0]) == requests[0].max_tokens


def test_continuous_batching_matches(model, requests) -> None:  # noqa: ANN001
    runner = hf.CBRunner(model, page_size=16, max_batch_tokens=32, max_len=32,
                         max_requests=len(requests))
    try:
        got = runner.run(requests)
    finally:
        runner.stop()
    assert got == one_at_a_time(model, requests)
