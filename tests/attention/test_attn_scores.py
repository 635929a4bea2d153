"""The scoring path of KV eviction (workbench.attention.scores, kernels/cpu/attn_scores):

- the torch twin equals a naive dense softmax in float64 (GQA, paged random block tables,
  spans of queries inside a step, keys cut before a window) to 2e-6 absolute;
- the C++ kernel equals the twin in fp32 to atol 1e-6 / rtol 1e-5 (the same bf16 / fp16
  inputs too: both upcast to fp32); skipped, with the reason, when it cannot be built;
- pooling and per-block sums on hand-made numbers, exactly;
- `KVScoreRequest.record` through the torch backend's forward (h2o and snapkv jobs) against
  the reference, and per-layer tables (`AttentionMetadata.layer_metadata`): a layer attends
  exactly over its own kept blocks, on the C++ decode kernel and on the torch path.

Tolerances: probabilities are <= 1 and summed over <= 8 queries here; fp32 softmax rounding
is ~1e-7 per term, so 2e-6 against float64 and 1e-6 between two fp32 orders leave ~10x room.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels.cpu import attn_scores as ks
from tests.kernels.cpu_kernels import load_or_skip
from workbench.attention import scores as sc
from workbench.attention import torch_backend
from workbench.attention.metadata import AttentionMetadata
from workbench.attention.scores import KVScoreRequest, ScoreJob
from workbench.attention.torch_backend import TorchAttentionBackend

HQ, HKV, D, BS = 4, 2, 16, 4
SCALE = D**-0.5


def make_cache(num_blocks: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, num_blocks, BS, HKV, D, generator=g) * 1.5).to(dtype)


def random_tables(seq_lens: list[int], num_blocks: int, seed: int) -> torch.Tensor:
    """Distinct random non-null block ids per row, padded with the null block 0."""
    g = torch.Generator().manual_seed(seed)
    width = max(-(-s // BS) for s in seq_lens) + 1
    ids = torch.randperm(num_blocks - 1, generator=g)[: len(seq_lens) * width] + 1
    tables = ids.view(len(seq_lens), width).clone()
    for i, s in enumerate(seq_lens):
        tables[i, -(-s // BS):] = 0
    return tables


def dense_reference(query: torch.Tensor, k_cache: torch.Tensor, tables: torch.Tensor,
                    ctx_lens: list[int], q_start: list[int], q_count: list[int],
                    key_end: list[int], out_len: int) -> torch.Tensor:
    """float64: gather K through the table, full softmax row by row, sum over queries."""
    n = len(ctx_lens)
    out = torch.zeros(n, HQ, out_len, dtype=torch.float64)
    for i in range(n):
        s = ctx_lens[i]
        k = k_cache[tables[i, : -(-s // BS)]].reshape(-1, HKV, D)[:s].double()
        for j in range(q_count[i]):
            pos = s - q_count[i] + j
            q = query[q_start[i] + j].double()
            for h in range(HQ):
                logits = (k[: pos + 1, h // (HQ // HKV)] @ q[h]) * SCALE
                p = torch.softmax(logits, dim=0)
                end = min(key_end[i], pos + 1, out_len)
                out[i, h, :end] += p[:end]
    return out


CASES = [  # ctx_lens, q_count, key_end
    ([1, 5, 17, 9], [1, 1, 1, 1], [1, 5, 17, 9]),  # decodes (h2o)
    ([12, 23, 8], [6, 4, 8], [12, 23, 8]),  # prefill chunks (h2o over every query)
    ([23, 30, 11], [3, 8, 5], [20, 22, 6]),  # observation windows: keys before the window
    ([37, 9], [20, 9], [37, 9]),  # more queries than the kernel's tile of 16
    ([150, 70], [3, 1], [140, 70]),  # more keys than the kernel's chunk of 64
]


def case_inputs(ctx_lens: list[int], q_count: list[int], seed: int,
                dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    num_blocks = 128
    kv = make_cache(num_blocks, seed, dtype)
    tables = random_tables(ctx_lens, num_blocks, seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    total = sum(q_count) + 3  # + rows of other sequences' tokens around them
    query = (torch.randn(total, HQ, D, generator=g)).to(dtype)
    q_start = [1 + s for s in itertools.accumulate([0, *q_count[:-1]])]
    return query, kv[0], tables, q_start


def as_long(*lists: list[int]) -> list[torch.Tensor]:
    return [torch.tensor(v, dtype=torch.long) for v in lists]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_twin_equals_dense_float64_reference(case: int) -> None:
    ctx_lens, q_count, key_end = CASES[case]
    query, k_cache, tables, q_start = case_inputs(ctx_lens, q_count, seed=case)
    out_len = max(key_end)
    got = sc.window_probs_torch(query, k_cache, tables, *as_long(ctx_lens, q_start, q_count,
                                                                 key_end), SCALE, out_len)
    want = dense_reference(query, k_cache, tables, ctx_lens, q_start, q_count, key_end,
                           out_len)
    assert got.dtype == torch.float32 and got.shape == (len(ctx_lens), HQ, out_len)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


def test_twin_chunks_queries_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx_lens, q_count, key_end = CASES[1]
    query, k_cache, tables, q_start = case_inputs(ctx_lens, q_count, seed=7)
    args = (query, k_cache, tables, *as_long(ctx_lens, q_start, q_count, key_end), SCALE, 23)
    whole = sc.window_probs_torch(*args)
    monkeypatch.setattr(sc, "_QUERY_CHUNK", 3)
    # the same terms summed in another grouping: an ulp of sums up to ~8
    torch.testing.assert_close(sc.window_probs_torch(*args), whole, atol=1e-6, rtol=0)


def test_fp8_cache_twin_equals_reference_on_dequantized_keys() -> None:
    ctx_lens, q_count, key_end = CASES[0]
    query, k_cache, tables, q_start = case_inputs(ctx_lens, q_count, seed=3)
    k8 = (k_cache / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = k8.float() * 0.05
    args = (*as_long(ctx_lens, q_start, q_count, key_end), SCALE, 17)
    got = sc.window_probs(query, k8, tables, *args, k_scale=0.05)
    torch.testing.assert_close(got, sc.window_probs_torch(query, deq, tables, *args),
                               atol=1e-7, rtol=0)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kernel_equals_twin(case: int, dtype: torch.dtype) -> None:
    load_or_skip(ks.EXTENSION)
    ctx_lens, q_count, key_end = CASES[case]
    query, k_cache, tables, q_start = case_inputs(ctx_lens, q_count, seed=10 + case,
                                                  dtype=dtype)
    out_len = max(key_end) + 2  # columns past key_end stay zero
    ints = as_long(ctx_lens, q_start, q_count, key_end)
    got = ks.attention_scores(query, k_cache, tables, *ints, SCALE, out_len)
    assert got is not None
    want = sc.window_probs_torch(query, k_cache, tables, *ints, SCALE, out_len)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_kernel_reads_a_non_contiguous_query_and_cache_view() -> None:
    load_or_skip(ks.EXTENSION)
    ctx_lens, q_count, key_end = CASES[1]
    query, _, tables, q_start = case_inputs(ctx_lens, q_count, seed=21)
    kv = make_cache(128, seed=21)
    ints = as_long(ctx_lens, q_start, q_count, key_end)
    wide = torch.cat([query, query], dim=1)[:, :HQ]  # strided rows
    got = ks.attention_scores(wide, kv[0], tables, *ints, SCALE, 23)
    assert got is not None
    torch.testing.assert_close(
        got, sc.window_probs_torch(query, kv[0], tables, *ints, SCALE, 23), atol=1e-6,
        rtol=1e-5)


# ----------------------------------------------------------------- pooling and block sums
def test_max_pooling_with_padding() -> None:
    x = torch.tensor([[1.0, 5.0, 2.0, 0.0, 3.0, 0.5]])
    assert sc.pool_tokens(x, 3, "max").tolist() == [[5.0, 5.0, 5.0, 3.0, 3.0, 3.0]]
    assert sc.pool_tokens(x, 1, "max").tolist() == x.tolist()


def test_avg_pooling_counts_the_padding_as_zeros() -> None:
    x = torch.tensor([[3.0, 6.0, 0.0, 9.0]])
    # windows (pad 1): [0,3,6] [3,6,0] [6,0,9] [0,9,0], each divided by 3
    assert sc.pool_tokens(x, 3, "avg").tolist() == [[3.0, 3.0, 5.0, 3.0]]


def test_block_sums_per_block_and_zero_past_the_tokens() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 0.25])
    assert sc.block_sums(x, 4, 3).tolist() == [10.0, 0.75, 0.0]
    assert sc.block_sums(x, 2, 2).tolist() == [3.0, 7.0]


def test_score_request_validates_its_knobs() -> None:
    with pytest.raises(ValueError, match="kernel_size"):
        KVScoreRequest([], 1, {}, kernel_size=4)
    with pytest.raises(ValueError, match="pooling"):
        KVScoreRequest([], 1, {}, pooling="median")


# ----------------------------------------------------------------- through the backend
def make_metadata(seq_lens: list[int], q_lens: list[int], tables: torch.Tensor
                  ) -> AttentionMetadata:
    slots = []
    for i, (s, q) in enumerate(zip(seq_lens, q_lens, strict=True)):
        for p in range(s - q, s):
            slots.append(int(tables[i, p // BS]) * BS + p % BS)
    cu = [0, *itertools.accumulate(q_lens)]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        query_start_loc=torch.tensor(cu, dtype=torch.long),
        seq_lens=torch.tensor(seq_lens, dtype=torch.long),
        block_tables=tables.clone(),
        query_lens_cpu=list(q_lens),
        seq_lens_cpu=list(seq_lens),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
    )


def test_record_through_the_backend_matches_the_reference() -> None:
    seq_lens, q_lens = [13, 22, 9], [1, 10, 1]  # two decodes around a prefill chunk
    kv = make_cache(48, seed=5)
    tables = random_tables(seq_lens, 48, seed=6)
    g = torch.Generator().manual_seed(7)
    t = sum(q_lens)
    query = torch.randn(t, HQ, D, generator=g)
    key = torch.randn(t, HKV, D, generator=g)
    md = make_metadata(seq_lens, q_lens, tables)
    # job 0: h2o on the decode; job 1: snapkv window of the chunk's last 4 queries, 6 window
    # keys, pooled (max, 3); job 2: h2o on the other decode
    jobs = [ScoreJob(0, "a", 0, 1), ScoreJob(1, "b", 6, 4, window=6), ScoreJob(2, "c", 0, 1)]
    req = KVScoreRequest(jobs, num_layers=2, layer_of={kv.data_ptr(): 1}, kernel_size=3,
                         pooling="max")
    md.kv_scores = req
    TorchAttentionBackend().forward(query, key, key.clone(), kv, md, SCALE)
    assert set(req.scores) == {"a", "b", "c"}
    k_cache = kv[0]
    for rid, i, q0, nq, window in (("a", 0, 0, 1, 0), ("c", 2, 11, 1, 0), ("b", 1, 7, 4, 6)):
        s = seq_lens[i]
        end = s - window
        ref = dense_reference(query, k_cache, tables[i : i + 1], [s], [q0], [nq], [end], end)
        per_head = ref[0].float()
        if window:
            per_head = sc.pool_tokens(per_head, 3, "max")
        want = sc.block_sums(per_head.sum(0), BS, -(-s // BS))
        got = req.scores[rid]
        assert got.shape == (2, -(-s // BS)) and got.dtype.name == "float32"
        assert not got[0].any()  # layer 0 never ran
        torch.testing.assert_close(torch.from_numpy(got[1]), torch.from_numpy(want),
                                   atol=4e-6, rtol=0)


def test_record_maps_a_layers_own_row_back_to_the_shared_row() -> None:
    req = KVScoreRequest([], num_layers=2, layer_of={},
                         row_positions={("r", 1): [0, 2, 3]})
    import numpy as np

    req._store("r", 1, np.array([1.0, 2.0, 3.0], dtype=np.float32))
    req._store("r", 0, np.array([4.0, 5.0, 6.0, 7.0], dtype=np.float32))
    assert req.scores["r"].tolist() == [[4.0, 5.0, 6.0, 7.0], [1.0, 0.0, 2.0, 3.0]]


@pytest.mark.parametrize("use_kernel", [True, False])
def test_per_layer_table_attends_over_the_layers_kept_blocks_only(
        monkeypatch: pytest.MonkeyPatch, use_kernel: bool) -> None:
    """Layer A's metadata names a compacted row (blocks 1 and 3 of sequence 0 skipped): its
    output equals a plain forward whose table is that compacted row; layer B (no entry)
    attends over the whole row."""
    monkeypatch.setattr(torch_backend, "USE_CPU_DECODE_KERNEL", use_kernel)
    seq_lens, q_lens = [22, 7], [1, 1]
    tables = random_tables(seq_lens, 40, seed=11)
    kv_a, kv_b = make_cache(40, seed=12), make_cache(40, seed=12)
    g = torch.Generator().manual_seed(13)
    query = torch.randn(2, HQ, D, generator=g)
    key, value = torch.randn(2, HKV, D, generator=g), torch.randn(2, HKV, D, generator=g)
    compact = tables.clone()
    kept = [0, 2, 4, 5]
    compact[0].zero_()
    compact[0, : len(kept)] = tables[0, kept]
    layer_md = make_metadata([22 - 2 * BS, 7], q_lens, compact)
    layer_md.slot_mapping = make_metadata(seq_lens, q_lens, tables).slot_mapping
    md = make_metadata(seq_lens, q_lens, tables)
    md.layer_metadata = {kv_a.data_ptr(): layer_md}
    backend = TorchAttentionBackend()
    out_a = backend.forward(query, key, value, kv_a, md, SCALE)
    out_b = backend.forward(query, key, value, kv_b, md, SCALE)
    ref_a = TorchAttentionBackend().forward(query, key, value, make_cache(40, 12), layer_md,
                                            SCALE)
    ref_b = TorchAttentionBackend().forward(query, key, value, make_cache(40, 12),
                                            make_metadata(seq_lens, q_lens, tables), SCALE)
    torch.testing.assert_close(out_a, ref_a, atol=0, rtol=0)
    torch.testing.assert_close(out_b, ref_b, atol=0, rtol=0)
    assert not torch.equal(out_a[0], out_b[0])  # the skipped blocks mattered
    torch.testing.assert_close(out_a[1], out_b[1], atol=0, rtol=0)  # sequence 1 untouched
