"""CUDA-graph bookkeeping on CPU: capture sizes, padding and static buffers (EagerReplay stands
in for torch.cuda.CUDAGraph: it re-runs the recorded forward on the same static buffers, so a
forward that reads anything but those buffers' current contents gives a wrong answer)."""

from __future__ import annotations

import pytest
import torch

from workbench.attention.metadata import AttentionMetadata
from workbench.worker.cuda_graph import (
    DecodeGraphRunner,
    cudagraph_capture_sizes,
    eager_graph_factory,
    padded_batch_size,
)


def test_capture_sizes_follow_vllm_buckets() -> None:
    assert cudagraph_capture_sizes(1) == [1]
    assert cudagraph_capture_sizes(3) == [1, 2, 3]
    assert cudagraph_capture_sizes(4) == [1, 2, 4]
    assert cudagraph_capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert cudagraph_capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = cudagraph_capture_sizes(300)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-5:] == [248, 256, 272, 288, 300]
    assert len(cudagraph_capture_sizes(256)) == 3 + 31 + 1
    with pytest.raises(ValueError, match="max_num_seqs"):
        cudagraph_capture_sizes(0)


def test_padded_batch_size() -> None:
    sizes = [1, 2, 4, 8, 16]
    assert [padded_batch_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert padded_batch_size(17, sizes) is None


class _SlotModel(torch.nn.Module):
    """A graph-safe toy forward: reads only device tensors; writes each token's id into a
    'cache' at its slot (skipping -1) and returns a row mixing the token, its position and the
    sum of its block-table row up to its context (what a paged kernel would read)."""

    def __init__(self, num_slots: int, block_size: int) -> None:
        super().__init__()
        self.cache = torch.zeros(num_slots, dtype=torch.int64)
        self.block_size = block_size

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        valid = meta.slot_mapping >= 0
        slots = torch.where(valid, meta.slot_mapping, 0)
        self.cache.index_put_((slots,), torch.where(valid, input_ids, self.cache[slots]))
        nblocks = (meta.seq_lens + self.block_size - 1) // self.block_size
        cols = torch.arange(meta.block_tables.shape[1])
        table_sum = torch.where(cols[None, :] < nblocks[:, None], meta.block_tables, 0).sum(1)
        return torch.stack([input_ids, positions, meta.seq_lens, table_sum], dim=1).float()


def _decode_meta(
    slots: list[int], seq_lens: list[int], tables: list[list[int]]
) -> AttentionMetadata:
    n = len(slots)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.arange(n + 1),
        seq_lens=torch.tensor(seq_lens),
        block_tables=torch.tensor(tables),
        query_lens_cpu=[1] * n,
        seq_lens_cpu=list(seq_lens),
        max_query_len=1,
        max_seq_len=max(seq_lens),
    )


def test_replay_pads_and_matches_eager() -> None:
    bs = 4
    model = _SlotModel(num_slots=64, block_size=bs)
    runner = DecodeGraphRunner(model, [1, 2, 4, 8], max_model_len=24, block_size=bs,
                               device=torch.device("cpu"), graph_factory=eager_graph_factory)
    runner.capture()
    assert sorted(runner.graphs) == [1, 2, 4, 8] and runner.max_blocks == 6
    model.cache.zero_()  # capture wrote nothing (all padding), but start clean anyway

    # 3 sequences -> the 4-graph; block tables narrower than the static ones (width 3 of 6)
    ids, pos = torch.tensor([11, 12, 13]), torch.tensor([9, 4, 0])
    meta = _decode_meta([2 * bs + 1, 5 * bs + 0, 7 * bs + 0],
                        [10, 5, 1], [[3, 1, 2], [4, 5, 0], [7, 0, 0]])
    assert runner.can_run(meta, 3)
    out = runner.run(ids, pos, meta)
    expected = torch.tensor([[11, 9, 10, 3 + 1 + 2], [12, 4, 5, 4 + 5], [13, 0, 1, 7]]).float()
    assert torch.equal(out, expected)
    written = {s: int(model.cache[s]) for s in range(64) if model.cache[s] != 0}
    assert written == {9: 11, 20: 12, 28: 13}  # padding row (slot -1) wrote nothing
    assert runner.num_replays == 1
    # The padding row of the 4-graph reads as a null sequence
    assert runner.seq_lens[3] == 0 and runner.slot_mapping[3] == -1

    # A later, smaller batch in the same graph must not see the previous batch's rows
    out = runner.run(torch.tensor([21]), torch.tensor([3]), _decode_meta([6], [4], [[1]]))
    assert torch.equal(out, torch.tensor([[21, 3, 4, 1]]).float())
    assert int(model.cache[6]) == 21


def test_can_run_rejects_what_graphs_cannot_take() -> None:
    model = _SlotModel(num_slots=64, block_size=4)
    runner = DecodeGraphRunner(model, [1, 2], max_model_len=8, block_size=4,
                               device=torch.device("cpu"), graph_factory=eager_graph_factory)
    runner.capture()
    assert not runner.can_run(_decode_meta([1, 2, 3], [1, 1, 1], [[1], [1], [1]]), 3)  # > 2
    wide = _decode_meta([1], [8], [[1, 2, 3]])  # table wider than max_model_len needs
    assert not runner.can_run(wide, 1)
    prefill = _decode_meta([1, 2], [2, 2], [[1], [1]])
    prefill.max_query_len = 2
    assert not runner.can_run(prefill, 2)
    assert not runner.can_run(_decode_meta([1], [1], [[1]]), 2)  # padding tokens in the batch
    with pytest.raises(ValueError, match="ascending"):
        DecodeGraphRunner(model, [2, 1], 8, 4, torch.device("cpu"))
