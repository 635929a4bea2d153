"""TritonAttentionBackend against TorchAttentionBackend (the reference) on the same batches, its
CUDA-graph contract on the decode path, and the engine end to end with attention_backend="triton".

The kernels run under Triton's interpreter here (CPU), so batches and the model are tiny.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch

from workbench.attention.metadata import (
    FP8_KV_DTYPE,
    AttentionMetadata,
    KVCacheScales,
    attach_kv_scales,
    get_kv_scales,
)
from workbench.attention.selector import get_attention_backend
from workbench.attention.torch_backend import TorchAttentionBackend
from workbench.attention.triton_backend import TritonAttentionBackend

HKV, HEAD_DIM = 2, 16


class HostListTouched(AssertionError):
    pass


class PoisonedList(list):
    """A host list the decode path must never read: any access raises."""

    def _touched(self, *args: object, **kwargs: object) -> None:
        raise HostListTouched("the decode path read a host-side list of the metadata")

    __iter__ = __len__ = __getitem__ = __contains__ = __eq__ = __reversed__ = _touched  # type: ignore[assignment]


def make_batch(
    seqs: list[tuple[int, int]],
    pad_tokens: int,
    block_size: int,
    group: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    kv_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """query/key/value for the flat batch, a KV cache whose earlier context is random, and the
    metadata. seqs = [(seq_len, query_len)]; `pad_tokens` trailing padding tokens (slot -1).
    Block tables: shuffled block ids, one spare column padded with the null block 0."""
    width = max(-(-s // block_size) for s, _ in seqs) + 1
    num_blocks = len(seqs) * width + 3
    cache = (torch.randn(2, num_blocks, block_size, HKV, HEAD_DIM, generator=gen) * 2).to(
        kv_dtype or dtype
    )
    ids = torch.randperm(num_blocks - 1, generator=gen)[: len(seqs) * width] + 1
    tables = ids.view(len(seqs), width).clone()
    slots, starts = [], [0]
    for i, (s, q) in enumerate(seqs):
        tables[i, -(-s // block_size) :] = 0
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size
                  for p in range(s - q, s)]  # fmt: skip
        starts.append(starts[-1] + q)
    slots += [-1] * pad_tokens
    t = len(slots)
    query = torch.randn(t, HKV * group, HEAD_DIM, generator=gen).to(dtype)
    key = torch.randn(t, HKV, HEAD_DIM, generator=gen).to(dtype)
    value = torch.randn(t, HKV, HEAD_DIM, generator=gen).to(dtype)
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor([s for s, _ in seqs]),
        block_tables=tables,
        query_lens_cpu=[q for _, q in seqs],
        seq_lens_cpu=[s for s, _ in seqs],
        max_query_len=max(q for _, q in seqs),
        max_seq_len=max(s for s, _ in seqs),
    )
    return query, key, value, cache, md


def run_both(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    md: AttentionMetadata,
    scales: tuple[KVCacheScales, KVCacheScales] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(triton out, triton cache, torch out, torch cache), each backend on its own cache copy."""
    caches = [cache.clone(), cache.clone()]
    if scales is not None:
        for c, s in zip(caches, scales, strict=True):
            attach_kv_scales(c, s)
    scale = HEAD_DIM**-0.5
    out_triton = TritonAttentionBackend().forward(query, key, value, caches[0], md, scale)
    out_torch = TorchAttentionBackend().forward(query, key, value, caches[1], md, scale)
    return out_triton, caches[0], out_torch, caches[1]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.isfinite(a).all()
    return (a.double() - b.double()).abs().max().item()


def test_registered_and_graph_safe() -> None:
    assert get_attention_backend("triton") is TritonAttentionBackend
    assert TritonAttentionBackend.name == "triton" and TritonAttentionBackend.cudagraph_safe


@pytest.mark.parametrize(
    "block_size,group,dtype,atol", [(16, 4, torch.float32, 1e-5), (32, 1, torch.float16, 2e-3)]
)
def test_mixed_batch_matches_torch_backend(
    block_size: int, group: int, dtype: torch.dtype, atol: float
) -> None:
    """Decode rows, a fresh prefill, a prefix hit and a chunk, then padding tokens: the prefill
    kernel for the whole batch."""
    gen = torch.Generator().manual_seed(block_size)
    seqs = [(block_size + 3, 1), (21, 21), (2 * block_size + 7, 9), (5, 1), (40, 2)]
    q, k, v, cache, md = make_batch(seqs, 3, block_size, group, dtype, gen)
    out, cache_t, ref, cache_r = run_both(q, k, v, cache, md)
    assert torch.equal(cache_t, cache_r)
    assert max_err(out, ref) <= atol
    assert torch.equal(out[-3:], torch.zeros_like(out[-3:]))


def test_decode_batch_matches_torch_backend() -> None:
    """max_query_len 1 (the decode kernel), with padding tokens past the last sequence."""
    gen = torch.Generator().manual_seed(2)
    seqs = [(17, 1), (1, 1), (50, 1), (32, 1)]
    q, k, v, cache, md = make_batch(seqs, 2, 16, 4, torch.float32, gen)
    out, cache_t, ref, cache_r = run_both(q, k, v, cache, md)
    assert torch.equal(cache_t, cache_r)
    assert max_err(out, ref) <= 1e-5
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))


def test_fp8_cache_matches_torch_backend() -> None:
    """Calibration on the first prefill gives both backends the same scales and cache bytes;
    a decode batch after it reads them through the scale tensors."""
    gen = torch.Generator().manual_seed(3)
    scales = (KVCacheScales(calibrate=True), KVCacheScales(calibrate=True))
    seqs = [(20, 20), (9, 9)]  # fresh prefills, then a padding token
    q, k, v, cache, md = make_batch(seqs, 1, 16, 4, torch.float32, gen, kv_dtype=FP8_KV_DTYPE)
    k, v = k * 3, v * 0.5
    k[-1] = 1000.0  # the padding token: calibration must not see it
    caches = [cache.clone(), cache.clone()]
    for c, s in zip(caches, scales, strict=True):
        attach_kv_scales(c, s)
    triton_be, torch_be = TritonAttentionBackend(), TorchAttentionBackend()
    out = triton_be.forward(q, k, v, caches[0], md, 0.25)
    ref = torch_be.forward(q, k, v, caches[1], md, 0.25)
    assert not scales[0].calibrate and scales[0] == scales[1]
    assert scales[0].k_scale == pytest.approx(float(k[:-1].abs().max()) / 448)
    assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))
    assert max_err(out, ref) <= 1e-5
    k_t, v_t = triton_be.kv_scale_tensors(caches[0])
    assert k_t.dtype == torch.float32 and k_t.shape == (1,)
    assert (k_t.item(), v_t.item()) == pytest.approx((scales[0].k_scale, scales[0].v_scale))

    # next step: one decode token per sequence
    q2, k2, v2 = (torch.randn(2, n, HEAD_DIM, generator=gen) for n in (HKV * 4, HKV, HKV))
    tables = md.block_tables
    md2 = AttentionMetadata(
        slot_mapping=torch.stack([tables[0, 1] * 16 + 4, tables[1, 0] * 16 + 9]),
        query_start_loc=torch.tensor([0, 1, 2]),
        seq_lens=torch.tensor([21, 10]), block_tables=md.block_tables,
        query_lens_cpu=[1, 1], seq_lens_cpu=[21, 10], max_query_len=1, max_seq_len=21,
    )  # fmt: skip
    out2 = triton_be.forward(q2, k2, v2, caches[0], md2, 0.25)
    ref2 = torch_be.forward(q2, k2, v2, caches[1], md2, 0.25)
    assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))
    assert max_err(out2, ref2) <= 1e-5


def test_scale_tensors_are_updated_in_place() -> None:
    """The same [1] float32 tensors for a cache on every call (a captured graph keeps their
    address), refreshed when the layer's KVCacheScales change."""
    cache = torch.zeros(2, 2, 16, HKV, HEAD_DIM, dtype=FP8_KV_DTYPE)
    attach_kv_scales(cache, KVCacheScales(k_scale=0.5, v_scale=0.25))
    be = TritonAttentionBackend()
    k_t, v_t = be.kv_scale_tensors(cache)
    assert (k_t.item(), v_t.item()) == (0.5, 0.25)
    scales = get_kv_scales(cache)
    assert scales is not None
    scales.k_scale, scales.v_scale = 0.125, 4.0
    k_t2, v_t2 = be.kv_scale_tensors(cache)
    assert k_t2 is k_t and v_t2 is v_t
    assert (k_t.item(), v_t.item()) == (0.125, 4.0)
    other = torch.zeros_like(cache)  # another layer's cache: its own tensors (scales 1.0)
    assert be.kv_scale_tensors(other)[0] is not k_t and be.kv_scale_tensors(other)[0].item() == 1


def test_decode_path_never_reads_host_lists() -> None:
    """Decode metadata like a CUDA-graph replay: host lists that raise on any access, a wrong
    max_seq_len, padding rows with seq_len 0 / slot -1 / an all-null block table. The answer
    equals the one with honest metadata; the padding rows are zeros and write nothing."""
    gen = torch.Generator().manual_seed(4)
    seqs = [(23, 1), (40, 1), (2, 1)]
    q, k, v, cache, md = make_batch(seqs, 0, 16, 2, torch.float32, gen)
    pad = 2
    q = torch.cat([q, torch.randn(pad, *q.shape[1:], generator=gen)])
    k = torch.cat([k, torch.randn(pad, *k.shape[1:], generator=gen)])
    v = torch.cat([v, torch.randn(pad, *v.shape[1:], generator=gen)])
    n = len(seqs) + pad
    honest = AttentionMetadata(
        slot_mapping=torch.cat([md.slot_mapping, torch.full((pad,), -1)]),
        query_start_loc=torch.arange(n + 1),
        seq_lens=torch.cat([md.seq_lens, torch.zeros(pad, dtype=torch.long)]),
        block_tables=torch.cat([md.block_tables, torch.zeros(pad, md.block_tables.shape[1],
                                                             dtype=torch.long)]),
        query_lens_cpu=[1] * n, seq_lens_cpu=[23, 40, 2, 0, 0], max_query_len=1, max_seq_len=40,
    )  # fmt: skip
    blind = AttentionMetadata(
        slot_mapping=honest.slot_mapping, query_start_loc=honest.query_start_loc,
        seq_lens=honest.seq_lens, block_tables=honest.block_tables,
        query_lens_cpu=PoisonedList(), seq_lens_cpu=PoisonedList(), max_query_len=1,
        max_seq_len=-1,
    )  # fmt: skip
    with pytest.raises(HostListTouched):
        len(blind.seq_lens_cpu)
    be = TritonAttentionBackend()
    want_cache, got_cache = cache.clone(), cache.clone()
    want = be.forward(q, k, v, want_cache, honest, 0.25)
    got = be.forward(q, k, v, got_cache, blind, 0.25)
    assert torch.equal(got, want) and torch.equal(got_cache, want_cache)
    assert torch.equal(got[-pad:], torch.zeros_like(got[-pad:]))
    assert torch.equal(got_cache[:, 0], cache[:, 0])  # the null block was not written
    ref = TorchAttentionBackend().forward(q[:3], k[:3], v[:3], cache.clone(), md, 0.25)
    assert max_err(got[:3], ref) <= 1e-5


# ---------------------------------------------------------------------------- engine end to end
@pytest.fixture(scope="module")
def llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workbench.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", arch="llama", seed=0)


def test_llm_greedy_matches_torch_backend(llama_path: Path) -> None:
    """Token for token with attention_backend="torch": 4 prompts of mixed lengths, a 37-token
    prompt chunked by max_num_batched_tokens=24, two prompts sharing a 20-token prefix (a
    prefix-cache hit of one block), decode batches in between."""
    from workbench import LLM, SamplingParams

    rng = random.Random(0)
    shared = [rng.randrange(10, 1000) for _ in range(20)]
    prompts = [[rng.randrange(10, 1000) for _ in range(n)] for n in (3, 37)]
    prompts += [shared + [rng.randrange(10, 1000) for _ in range(n)] for n in (2, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    outputs, stats, seconds = {}, {}, {}
    for backend in ("torch", "triton"):
        llm = LLM(
            str(llama_path), dtype="float32", attention_backend=backend, block_size=16,
            max_model_len=64, max_num_batched_tokens=24, max_num_seqs=4,
        )  # fmt: skip
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        seconds[backend] = time.perf_counter() - start
        outputs[backend] = [o.outputs[0].token_ids for o in outs]
        stats[backend] = llm.stats()
    assert all(len(toks) == 6 for toks in outputs["triton"])
    assert outputs["triton"] == outputs["torch"]
    assert stats["triton"]["vllm:prefix_cache_hits"] >= 16
    print(f"generate: torch {seconds['torch']:.2f} s, triton {seconds['triton']:.2f} s")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_decode_graphs_replay_matches_eager(llama_path: Path, kv_cache_dtype: str) -> None:
    """The CUDA-graph path on CPU: capture every decode size with EagerReplay (re-runs the
    recorded forward on the static buffers, so anything read from the capture-time metadata
    would give wrong tokens), then generate 3 requests (padded to the 4-graph) and compare
    with the eager engine token for token; the fp8 cache calibrates on the first prefill,
    after capture."""
    from workbench import LLM, SamplingParams
    from workbench.worker.cuda_graph import eager_graph_factory

    rng = random.Random(1)
    prompts = [[rng.randrange(10, 1000) for _ in range(n)] for n in (5, 19, 11)]
    params = SamplingParams(temperature=0.0, max_tokens=5)
    outputs = {}
    for graphs in (False, True):
        llm = LLM(str(llama_path), dtype="float32", attention_backend="triton", block_size=16,
                  max_model_len=48, max_num_seqs=4, kv_cache_dtype=kv_cache_dtype,
                  calculate_kv_scales=kv_cache_dtype == "fp8")
        runner = llm.engine.runner
        if graphs:
            runner.capture_model(graph_factory=eager_graph_factory)
            assert sorted(runner.graph_runner.graphs) == [1, 2, 4]
        outputs[graphs] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        if graphs:
            assert runner.graph_runner.num_replays >= 4  # 3 sequences -> the 4-graph
    assert outputs[True] == outputs[False]
