"""tensor_parallel_size=2 on CPU (gloo, 2 processes): greedy tokens identical to TP=1.

One TP=2 engine per case (module-scoped and parametrized, so pytest builds them one at a time:
one TP group per process), each with chunked prefill (max_num_batched_tokens=16 < the longest
prompt), a shared prefix (prefix-cache hits) and a pool small enough to preempt:

    llama         4 heads, 2 KV heads -> 1 KV head per rank (sharded)
    qwen3         q/k norm, qkv + o bias
    llama_kv1     1 KV head -> replicated on both ranks; vocab 1001 (padded to 1002), tied
                  embeddings, qkv/o/mlp bias (RowParallel adds its bias once)
    llama_int8    quantization="int8" per rank on its shard (see test_int8_...)
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.core.kv_cache.utils import kv_bytes_per_token, tp_kv_heads_per_rank
from workbench.layers.cpu_gemm import pack_linear_weights
from workbench.layers.linear import LinearBase, RowParallelLinear
from workbench.layers.quantization.int8 import dequantize, quantize
from workbench.testing import tiny_checkpoint

ENGINE = dict(dtype="float32", max_model_len=128, block_size=4, max_num_seqs=8,
              max_num_batched_tokens=16, num_gpu_blocks_override=40)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
CASES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {"attention_bias": True}),
    "llama_kv1": ("llama", {"num_key_value_heads": 1, "vocab_size": 1001,
                            "tie_word_embeddings": True, "attention_bias": True,
                            "mlp_bias": True}),
    "llama_int8": ("llama", {}),
}


def prompts_for(vocab: int) -> list[list[int]]:
    """Lengths 3, 40, 17, 9, then four sharing a 21-token prefix."""
    rng = random.Random(0)
    out = [[rng.randrange(10, vocab) for _ in range(n)] for n in (3, 40, 17, 9)]
    shared = [rng.randrange(10, vocab) for _ in range(21)]
    return out + [shared + [rng.randrange(10, vocab) for _ in range(n)] for n in (2, 9, 1, 14)]


def shard_quantized_int8(model: torch.nn.Module, tp: int) -> tuple[int, float]:
    """Replace every linear weight of a TP=1 fp32 model by what TP=`tp` int8 multiplies by:
    column-parallel layers quantize whole rows (per-output-channel scales, the same as TP=1);
    RowParallelLinear quantizes each rank's input slice on its own (its own per-row scale).
    Returns (number of row-parallel layers, max |difference| from whole-row int8 there)."""
    n_row, max_diff = 0, 0.0
    with torch.no_grad():
        for m in model.modules():
            if not isinstance(m, LinearBase):
                continue
            w = m.weight.data
            whole = dequantize(*quantize(w))
            if isinstance(m, RowParallelLinear):
                parts = [dequantize(*quantize(p)) for p in w.chunk(tp, dim=1)]
                sharded = torch.cat(parts, dim=1)
                max_diff = max(max_diff, float((sharded - whole).abs().max()))
                n_row += 1
                w.copy_(sharded)
            else:
                w.copy_(whole)
    return n_row, max_diff


@dataclass
class TPCase:
    name: str
    path: Path
    hf: dict
    prompts: list[list[int]]
    reference: list[list[int]]  # TP=1 greedy tokens
    tp1_kv_bytes_per_token: int
    llm: LLM
    tokens: list[list[int]]  # TP=2 greedy tokens
    notes: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp_ckpt")
    return {name: tiny_checkpoint(root / name, arch=arch, seed=0, **over)
            for name, (arch, over) in CASES.items() if name != "llama_int8"}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Iterator[TPCase]:
    name = request.param
    path = checkpoints["llama" if name == "llama_int8" else name]
    hf = json.loads((path / "config.json").read_text())
    prompts = prompts_for(hf["vocab_size"])
    quant = {"quantization": "int8"} if name == "llama_int8" else {}
    notes: dict = {}
    ref_llm = LLM(path, **ENGINE)
    if quant:
        notes["row_layers"], notes["max_shard_scale_diff"] = shard_quantized_int8(
            ref_llm.engine.runner.model, 2)
        pack_linear_weights(ref_llm.engine.runner.model)  # weights changed in place: repack
        tp1_int8 = LLM(path, **ENGINE, **quant).generate(prompts, GREEDY)
        notes["tp1_int8"] = [o.outputs[0].token_ids for o in tp1_int8]
    reference = [o.outputs[0].token_ids for o in ref_llm.generate(prompts, GREEDY)]
    tp1_bytes = ref_llm.memory_readout()["kv_bytes_per_token"]
    del ref_llm
    llm = LLM(path, tensor_parallel_size=2, **ENGINE, **quant)
    try:
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        yield TPCase(name, path, hf, prompts, reference, tp1_bytes, llm, tokens, notes)
    finally:
        llm.close()


def test_greedy_tokens_match_tp1(case: TPCase) -> None:
    assert all(len(t) == GREEDY.max_tokens for t in case.tokens)
    assert case.tokens == case.reference
    stats = case.llm.stats()
    assert stats["vllm:prefix_cache_hits"] > 0  # the shared prefix was reused on every rank
    assert stats["vllm:num_preemptions"] > 0  # the 39-block pool forces recompute preemption


def test_per_rank_kv_bytes_follow_calc(case: TPCase) -> None:
    hf = case.hf
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    per_rank_heads = tp_kv_heads_per_rank(hf["num_key_value_heads"], 2)
    want = kv_bytes_per_token(hf["num_hidden_layers"], per_rank_heads, head_dim, 4)
    readout = case.llm.memory_readout()
    assert readout["kv_bytes_per_token"] == want
    ranks = case.llm.engine.runner.memory_per_rank()
    assert [r["tp_rank"] for r in ranks] == [0, 1]
    shape = (2, ENGINE["num_gpu_blocks_override"], 4, per_rank_heads, head_dim)
    for r in ranks:
        assert r["bytes_per_block"] == want * ENGINE["block_size"]
        assert r["num_blocks"] == ENGINE["num_gpu_blocks_override"]
        assert r["kv_shapes"] == [shape] * hf["num_hidden_layers"]
    assert ranks[0]["weight_bytes"] == readout["weight_bytes"]
    # sharded KV heads halve the per-rank bytes; one replicated KV head keeps them
    ratio = 1 if hf["num_key_value_heads"] == 1 else 2
    assert case.tp1_kv_bytes_per_token == ratio * want


def test_broadcast_is_one_message_per_step(case: TPCase) -> None:
    runner = case.llm.engine.runner
    stats = runner.broadcast_stats()
    steps = sum(1 for r in case.llm.step_trace()
                if r["prefill_tokens"] + r["decode_tokens"] > 0)
    assert stats["num_broadcasts"] == steps
    assert 0 < stats["mean_bytes"] < 2000
    print(f"\n{case.name}: {stats}")


def test_int8_matches_the_shard_quantized_reference(case: TPCase) -> None:
    """int8 scales are per output row. Column-parallel layers split rows, so their scales
    equal TP=1's; RowParallelLinear splits each row's inputs, so each rank's scale comes from
    its half of the row and the dequantized weight differs from TP=1 int8. The right reference
    is therefore a TP=1 fp32 model whose weights are quantized per shard as TP=2 does."""
    if case.name != "llama_int8":
        pytest.skip("int8 case only")
    assert case.notes["row_layers"] == 2 * case.hf["num_hidden_layers"]  # o_proj, down_proj
    assert case.notes["max_shard_scale_diff"] > 0  # per-shard scales really differ
    assert case.tokens == case.reference
    same = sum(a == b for a, b in zip(case.notes["tp1_int8"], case.tokens, strict=True))
    print(f"\nint8 TP=2 vs TP=1 int8: {same}/{len(case.tokens)} prompts identical")


def test_torchrun_external_launcher_gives_the_same_tokens(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    path = checkpoints["llama"]
    prompts = prompts_for(1024)[:3]
    kwargs = {**ENGINE, "tensor_parallel_size": 2}
    want = [o.outputs[0].token_ids for o in LLM(path, **ENGINE).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
    script = Path(__file__).with_name("torchrun_generate.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(path), json.dumps(prompts), json.dumps(kwargs), str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["tokens"] for r in ranks] == [want, want]
    assert ranks[0]["kv_bytes_per_token"] == kv_bytes_per_token(2, 1, 16, 4)
