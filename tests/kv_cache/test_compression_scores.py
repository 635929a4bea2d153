"""The score-based eviction policies (h2o, snapkv, pyramidkv): selection on hand-made scores
(exact block indices), PyramidKV's per-layer budgets (exact), and end to end through `LLM`:
at a budget at or above the full length the greedy output equals the uncompressed engine
token for token; at a small budget the blocks a request holds follow the policy exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workbench.config.kv_compression import KVCompressionConfig
from workbench.core.kv_cache.compression import RequestKVView, make_policy
from workbench.core.kv_cache.compression.pyramidkv import pyramid_budgets
from workbench.core.kv_cache.compression.selection import (
    bottom_blocks,
    column_blocks,
    top_blocks,
    window_blocks,
)


def view(*, prompt: int, computed: int, new: int = 1, budget: int = 16, bs: int = 4,
         layers: int = 2, kept: tuple[int, ...] | None = None, rid: str = "r"
         ) -> RequestKVView:
    if kept is None:
        kept = tuple(range(-(-computed // bs)))
    return RequestKVView(
        request_id=rid, num_prompt_tokens=prompt, num_tokens=max(prompt, computed + new),
        num_computed_tokens=computed, num_new_tokens=new, block_size=bs, kept_blocks=kept,
        num_logical_blocks=(kept[-1] + 1) if kept else 0, budget_tokens=budget,
        num_layers=layers)


def policy(method: str, layers: int = 2, **kw: Any):  # type: ignore[no-untyped-def]
    return make_policy(KVCompressionConfig.from_value({"method": method, **kw}), 4, layers)


# ----------------------------------------------------------------- selection helpers
def test_top_and_bottom_blocks_break_ties_towards_the_older_block() -> None:
    scores = {0: 1.0, 1: 2.0, 2: 1.0, 3: 2.0}
    assert top_blocks([0, 1, 2, 3, 4], scores, 3) == [0, 1, 3]
    assert bottom_blocks([0, 1, 2, 3, 4], scores, 2) == [2, 4]  # 4 has no score: 0
    assert top_blocks([1, 2], scores, 0) == [] and bottom_blocks([1], scores, -1) == []


def test_columns_map_to_kept_then_new_logical_blocks() -> None:
    v = view(prompt=8, computed=20, kept=(0, 3, 4))  # logical blocks 1, 2 evicted
    assert column_blocks(v, 3) == [0, 3, 4]
    assert column_blocks(v, 5) == [0, 3, 4, 5, 6]
    assert window_blocks(26, 30, 4) == [6, 7] and window_blocks(5, 5, 4) == []


# ----------------------------------------------------------------- h2o
def h2o_scores(per_block: list[float]) -> np.ndarray:
    """Two layers whose sum is per_block."""
    a = np.array(per_block, dtype=np.float32)
    return np.stack([a * 0.25, a * 0.75])


def test_h2o_keeps_heavy_hitters_and_the_recent_window() -> None:
    p = policy("h2o", budget_tokens=16)  # 4 blocks: recent 8 tokens (2 blocks) + 2 heavy
    v = view(prompt=10, computed=21)  # decoding position 21: blocks 0..5
    assert p.score_queries(v) == (21, 22)
    p.observe("r", v, h2o_scores([4.0, 0.25, 1.0, 0.5, 0.0, 0.0]))
    p.observe("r", v, h2o_scores([5.0, 0.25, 2.0, 0.5, 7.0, 1.0]))
    assert p.totals("r") == {0: 9.0, 1: 0.5, 2: 3.0, 3: 1.0, 4: 7.0, 5: 1.0}
    decision = p.select(v)
    assert decision is not None and decision.evict == [1, 3] and decision.layer_drop is None
    assert p.totals("r") == {0: 9.0, 2: 3.0, 4: 7.0, 5: 1.0}  # evicted totals dropped


def test_h2o_recent_tokens_knob_and_nothing_before_the_prompt_is_written() -> None:
    p = policy("h2o", budget_tokens=16, recent_tokens=4)  # 1 recent block + 3 heavy
    v = view(prompt=10, computed=21)
    p.observe("r", v, h2o_scores([4.0, 0.25, 1.0, 0.5, 0.125, 0.0]))
    decision = p.select(v)
    assert decision is not None and decision.evict == [1, 4]  # block 4 is no longer recent
    prefill = view(prompt=40, computed=24, new=8)  # a chunk of a long prompt: held whole
    assert p.select(prefill) is None and p.score_queries(prefill) == (24, 32)


def test_h2o_evicts_nothing_at_a_budget_covering_the_request() -> None:
    p = policy("h2o", budget_tokens=24)
    v = view(prompt=10, computed=21, budget=24)  # 6 blocks after the step == budget
    p.observe("r", v, h2o_scores([1.0] * 6))
    assert p.select(v) is None
    p.forget("r")
    assert p.totals("r") == {}


# ----------------------------------------------------------------- snapkv
def test_snapkv_scores_the_observation_window_once_at_the_prompt_end() -> None:
    p = policy("snapkv", budget_tokens=16, window_size=6)
    assert p.score_queries(view(prompt=22, computed=16, new=6)) == (16, 22)
    assert p.score_queries(view(prompt=22, computed=20, new=2)) == (20, 22)  # last chunk
    assert p.score_queries(view(prompt=22, computed=0, new=12)) is None  # a middle chunk
    assert p.score_queries(view(prompt=22, computed=22)) is None  # decoding
    assert p.score_queries(view(prompt=16, computed=0, new=16)) is None  # fits the budget


def test_snapkv_keeps_the_window_and_the_best_prompt_blocks() -> None:
    p = policy("snapkv", budget_tokens=16, window_size=6)  # window tokens 16..21: blocks 4, 5
    at_end = view(prompt=22, computed=16, new=6)
    p.observe("r", at_end, h2o_scores([2.5, 0.25, 1.5, 2.5, 0.0, 0.0]))
    decision = p.select(view(prompt=22, computed=22))
    assert decision is not None and decision.evict == [1, 2]
    after = view(prompt=22, computed=23, kept=(0, 3, 4, 5))
    assert p.select(after) is None  # once only: decode then grows the cache


def test_snapkv_budget_within_the_window_keeps_the_window_alone() -> None:
    p = policy("snapkv", budget_tokens=4, window_size=6)
    p.observe("r", view(prompt=22, computed=16, new=6, budget=4), h2o_scores([9.0] * 6))
    decision = p.select(view(prompt=22, computed=22, budget=4))
    assert decision is not None and decision.evict == [0, 1, 2, 3]


# ----------------------------------------------------------------- pyramidkv
def test_pyramid_budgets_follow_the_arithmetic_series() -> None:
    assert pyramid_budgets(64, 8, 200, 4, 4) == [106, 78, 50, 22]  # K 56: 98 .. 14 step 28
    # layer 0 capped at the prompt: max 92, min 2 * 56 - 92 = 20, step 24
    assert pyramid_budgets(64, 8, 100, 4, 4) == [100, 76, 52, 28]
    # fractional steps round half up: 70, 51.33, 32.67, 14
    assert pyramid_budgets(50, 8, 300, 3, 4) == [78, 59, 41, 22]
    assert pyramid_budgets(8, 8, 300, 3, 4) == [8, 8, 8, 8]  # no room beyond the window
    assert pyramid_budgets(40, 8, 300, 3, 1) == [40]
    for b, w, p, beta, n in [(64, 8, 200, 4, 4), (128, 32, 1000, 20, 8), (50, 8, 300, 3, 5)]:
        budgets = pyramid_budgets(b, w, p, beta, n)
        assert abs(sum(budgets) / n - b) <= 0.5 and budgets == sorted(budgets, reverse=True)


def test_pyramidkv_drops_per_layer_and_evicts_what_every_layer_dropped() -> None:
    # bs 4, prompt 30 (blocks 0..7), window 4 (tokens 26..29: blocks 6, 7), budget 12, beta 2,
    # 3 layers: budgets 16, 12, 8 tokens -> 4, 3, 2 blocks -> 2, 1, 0 beyond the window
    p = policy("pyramidkv", layers=3, budget_tokens=12, window_size=4, beta=2.0)
    at_end = view(prompt=30, computed=26, new=4, budget=12, layers=3)
    assert p.score_queries(at_end) == (26, 30)
    scores = np.array([[5, 1, 4, 0, 0, 3, 0, 0],
                       [0, 0, 1, 0, 0, 9, 0, 0],
                       [1, 1, 1, 1, 1, 1, 0, 0]], dtype=np.float32)
    p.observe("r", at_end, scores)
    decision = p.select(view(prompt=30, computed=30, budget=12, layers=3))
    assert decision is not None
    assert decision.evict == [1, 3, 4]
    assert decision.layer_drop == [[5], [0, 2], [0, 2, 5]]
    # held: {0, 2, 5} + window {6, 7} = 5 blocks for a mean budget of 3


# ----------------------------------------------------------------- end to end
ENGINE: dict[str, Any] = {"dtype": "float32", "max_model_len": 128, "block_size": 4,
                          "num_gpu_blocks_override": 160, "enable_prefix_caching": False}
NUM_OUTPUT = 12


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workbench.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("kvscores") / "llama", arch="llama", seed=0)


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(10, 1000, size=n).tolist() for n in (30, 17, 45)]


def generate(ckpt: Path, prompt_list: list[list[int]], kc: dict[str, Any] | None,
             trace: list[tuple[str, int, int, Any]] | None = None) -> list[list[int]]:
    """Greedy token ids; `trace` gets (request, num_computed, blocks held, layer drops) of
    every scheduled request after each schedule()."""
    from workbench import LLM, SamplingParams

    llm = LLM(ckpt, kv_compression_config=kc, **ENGINE)
    sched = llm.engine.scheduler
    if trace is not None:
        inner = sched.schedule

        def schedule() -> Any:
            out = inner()
            kv = sched.kv_cache_manager
            for rid in out.num_scheduled_tokens:
                trace.append((rid, sched.requests[rid].num_computed_tokens,
                              len(kv.block_ids_view(rid)), kv.layer_drop(rid)))
            return out

        sched.schedule = schedule  # type: ignore[method-assign]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_list, greedy)]


@pytest.fixture(scope="module")
def uncompressed(ckpt: Path) -> list[list[int]]:
    return generate(ckpt, prompts(), None)


@pytest.mark.parametrize("method", ["h2o", "snapkv", "pyramidkv"])
def test_full_budget_output_equals_the_uncompressed_engine(
        ckpt: Path, uncompressed: list[list[int]], method: str) -> None:
    kc: dict[str, Any] = {"method": method, "budget_tokens": 64}  # >= 45 + 12 tokens
    if method != "h2o":
        kc["window_size"] = 4
    out = generate(ckpt, prompts(), kc)
    assert out == uncompressed
    assert all(len(t) == NUM_OUTPUT for t in out)


def decode_trace(ckpt: Path, kc: dict[str, Any]) -> list[tuple[int, int, Any]]:
    trace: list[tuple[str, int, int, Any]] = []
    out = generate(ckpt, prompts()[:1], kc, trace)
    assert len(out[0]) == NUM_OUTPUT
    assert trace[0][1:3] == (0, 8)  # the 30-token prefill holds its 8 blocks
    return [(nc, held, drop) for _, nc, held, drop in trace[1:]]


def test_h2o_small_budget_holds_exactly_the_budget(ckpt: Path) -> None:
    steps = decode_trace(ckpt, {"method": "h2o", "budget_tokens": 16})
    assert [nc for nc, _, _ in steps] == list(range(30, 30 + NUM_OUTPUT - 1))
    assert all(held == 4 for _, held, _ in steps)  # 4 blocks from the first decode on


def test_snapkv_small_budget_compresses_the_prompt_once(ckpt: Path) -> None:
    steps = decode_trace(ckpt, {"method": "snapkv", "budget_tokens": 16, "window_size": 4,
                                "kernel_size": 3})
    # window blocks 6, 7 + the 2 best prompt blocks, then one block per 4 generated tokens
    assert [held for _, held, _ in steps] == [4 + nc // 4 - 7 for nc, _, _ in steps]


def test_pyramidkv_holds_the_union_of_the_layers_kept_blocks(ckpt: Path) -> None:
    # 2 layers, budget 16, window 4, beta 20: K 12 -> 23.4 / 0.6 -> 27 and 5 tokens ->
    # 7 and 2 blocks: layer 0 drops 1 prompt block (evicted), layer 1 five more (held)
    steps = decode_trace(ckpt, {"method": "pyramidkv", "budget_tokens": 16, "window_size": 4,
                                "beta": 20.0})
    for nc, held, drop in steps:
        assert held == 7 + nc // 4 - 7
        assert drop is not None and drop[0] == [] and len(drop[1]) == 5


@pytest.mark.parametrize(("kv_cache_dtype", "kernel", "chunk"),
                         [("auto", True, None), ("fp8", True, None), ("auto", False, 16)])
def test_worker_scores_are_probabilities_per_block_of_the_table(
        ckpt: Path, monkeypatch: pytest.MonkeyPatch, kv_cache_dtype: str, kernel: bool,
        chunk: int | None) -> None:
    """Every step of an h2o run reports [layers, blocks of the table it ran with], and each
    layer's row sums to (queries scored) x (query heads): every query's softmax sums to 1
    per head. Holds on the model-dtype and FP8 caches (KIVI caches refuse eviction), on the
    C++ kernel and on the torch twin, with the prompt in one step or in chunks of 16."""
    from workbench import LLM, SamplingParams
    from workbench.attention import scores

    monkeypatch.setattr(scores, "USE_CPU_SCORES_KERNEL", kernel)
    extra = {} if chunk is None else {"max_num_batched_tokens": chunk, "max_num_seqs": 4}
    llm = LLM(ckpt, kv_compression_config={"method": "h2o", "budget_tokens": 16},
              kv_cache_dtype=kv_cache_dtype, **ENGINE, **extra)
    sched = llm.engine.scheduler
    seen: list[tuple[int, tuple[int, ...], list[float]]] = []
    inner = sched.update_from_output

    def update(out: Any, mro: Any, *args: Any, **kwargs: Any) -> Any:
        for rid, arr in mro.kv_block_scores.items():
            first, end = out.kv_score_queries[rid]
            assert len(sched.kv_cache_manager.block_ids_view(rid)) == arr.shape[1]
            seen.append((end - first, arr.shape, arr.sum(axis=1).tolist()))
        return inner(out, mro, *args, **kwargs)

    sched.update_from_output = update  # type: ignore[method-assign]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    llm.generate(prompts()[:1], greedy)
    prefill = [(30, (2, 8))] if chunk is None else [(16, (2, 4)), (14, (2, 8))]
    assert [(n, shape) for n, shape, _ in seen] == prefill + [(1, (2, 4))] * (NUM_OUTPUT - 1)
    for n, _, sums in seen:
        assert sums == pytest.approx([4.0 * n] * 2, abs=1e-4 * n)


def test_snapkv_with_a_chunked_prompt_scores_the_last_chunks_window(ckpt: Path) -> None:
    """Prompt 30 in chunks of 16 + 14: the window (4) lies in the last chunk, the prompt is
    compressed on the first decode step exactly as without chunking."""
    trace: list[tuple[str, int, int, Any]] = []
    kc = {"method": "snapkv", "budget_tokens": 16, "window_size": 4, "kernel_size": 3}
    from workbench import LLM, SamplingParams

    llm = LLM(ckpt, kv_compression_config=kc, max_num_batched_tokens=16, max_num_seqs=4,
              **ENGINE)
    sched = llm.engine.scheduler
    inner = sched.schedule

    def schedule() -> Any:
        out = inner()
        for rid in out.num_scheduled_tokens:
            trace.append((rid, sched.requests[rid].num_computed_tokens,
                          len(sched.kv_cache_manager.block_ids_view(rid)),
                          out.kv_score_queries.get(rid)))
        return out

    sched.schedule = schedule  # type: ignore[method-assign]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    out = llm.generate(prompts()[:1], greedy)
    assert len(out[0].outputs[0].token_ids) == NUM_OUTPUT
    assert [t[1:] for t in trace[:3]] == [(0, 4, None), (16, 8, (26, 30)), (30, 4, None)]
    assert [held for _, nc, held, _ in trace[2:]] == [4 + nc // 4 - 7 for _, nc, _, _ in trace[2:]]
