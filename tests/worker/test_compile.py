"""compilation_config: validation, the opaque attention op, greedy equality with compile on,
no recompiles across token counts, and the inductor cache on a second build.

Compiles are slow on 2 cores, so the inductor engines are built once per module (a tiny 2-layer
Llama, a cold cache in tmp) and shared; the graph-break checks use dynamo's "eager" backend (no
codegen). Compiles are counted (CompileStats / dynamo's counters), never timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.conftest import hf_greedy, mixed_prompts
from workbench import LLM, SamplingParams
from workbench.attention.custom_op import OpaqueAttentionBackend, make_attention_opaque
from workbench.attention.forward_context import (
    ForwardContext,
    get_forward_context,
    set_forward_context,
)
from workbench.compilation.compiled_forward import dummy_batch, own_code
from workbench.config import EngineConfig
from workbench.config.compilation import MODE_ENV, CompilationConfig, CompilationMode
from workbench.engine.arg_utils import add_engine_args, engine_kwargs
from workbench.testing import tiny_checkpoint

NUM_OUTPUT = 8
# chunked prefill and a small pool: mixed prefill/decode batches of many token counts
ENGINE = {"dtype": "float32", "max_model_len": 128, "block_size": 4,
          "max_num_batched_tokens": 24, "max_num_seqs": 8}


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(("given", "mode"), [
    (0, CompilationMode.NONE), (3, CompilationMode.VLLM_COMPILE), ("VLLM_COMPILE", 3),
    ("none", 0), ("1", 1), ({"mode": 3}, 3), ({"level": 3}, 3), ({"mode": 3, "level": 3}, 3),
    ({"mode": "STOCK_TORCH_COMPILE"}, 1), (None, None),
])
def test_config_accepts_vllm_spellings(given: Any, mode: int | None) -> None:
    assert CompilationConfig.from_any(given).mode == mode


@pytest.mark.parametrize(("given", "match"), [
    (2, r"mode \(2, DYNAMO_TRACE_ONCE\) is not implemented"),
    (7, r"mode \(7\) must be one of 0 \(NONE\)"),
    ("fast", r"mode \('fast'\) must be one of"),
    (True, r"compilation_config \(True\) must be a mode"),
    ({"mode": 3, "level": 0}, r"level \(0\) and mode \(3\) disagree"),
    ({"mode": 3, "backend": "tvm"}, r"backend \('tvm'\) must be one of inductor"),
    ({"mode": 3, "compile_sizes": [0, 4]}, r"compile_sizes \(\[0, 4\]\) must be a list"),
    ({"mode": 1, "compile_sizes": [4]}, r"compile_sizes \(\[4\]\) needs mode 3"),
    ({"mode": 3, "inductor_compile_config": 1}, r"inductor_compile_config \(1\) must be a dict"),
    ({"mode": 3, "splitting_ops": []}, r"unknown key\(s\) splitting_ops; allowed: backend"),
])
def test_config_refuses_with_named_errors(given: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CompilationConfig.from_any(given)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("compile") / "llama", arch="llama", seed=0)


def test_engine_config_resolves_the_mode(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODE_ENV, raising=False)
    cfg = EngineConfig.from_kwargs(str(ckpt), device="cpu")
    assert cfg.compilation.mode == CompilationMode.NONE  # the CPU default (docs/compile.md)
    cfg = EngineConfig.from_kwargs(str(ckpt), device="cpu", compilation_config=3,
                                   enforce_eager=True)
    assert cfg.compilation.mode == CompilationMode.NONE  # enforce_eager wins, as in vLLM
    shared = CompilationConfig(mode=3)
    EngineConfig.from_kwargs(str(ckpt), device="cpu", compilation_config=shared,
                             enforce_eager=True)
    assert shared.mode == CompilationMode.VLLM_COMPILE  # the caller's object is not changed
    monkeypatch.setenv(MODE_ENV, "VLLM_COMPILE")
    assert EngineConfig.from_kwargs(str(ckpt), device="cpu").compilation.mode == 3
    explicit = EngineConfig.from_kwargs(str(ckpt), device="cpu", compilation_config=0)
    assert explicit.compilation.mode == 0  # the env var only moves the default
    tp2 = EngineConfig.from_kwargs(str(ckpt), device="cpu", tensor_parallel_size=2)
    assert tp2.compilation.mode == 0  # a default never asks for what cannot run
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(2\) is not supported yet"):
        EngineConfig.from_kwargs(str(ckpt), device="cpu", tensor_parallel_size=2,
                                 compilation_config={"mode": 3})
    monkeypatch.setenv(MODE_ENV, "5")
    with pytest.raises(ValueError, match=rf"mode from {MODE_ENV} \('5'\) must be one of"):
        EngineConfig.from_kwargs(str(ckpt), device="cpu")


@pytest.mark.parametrize(("argv", "value"), [
    (["-O3"], 3), (["-O", "0"], 0), (["-O", "VLLM_COMPILE"], "VLLM_COMPILE"),
    (["--compilation-config", '{"mode": 3, "compile_sizes": [4]}'],
     {"mode": 3, "compile_sizes": [4]}),
    ([], None),
])
def test_cli_flags(argv: list[str], value: Any) -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    kwargs = engine_kwargs(parser.parse_args(argv))
    assert kwargs.get("compilation_config") == value


# ------------------------------------------------------------------------ the opaque op
@pytest.fixture(scope="module")
def eager_llm(ckpt: Path) -> LLM:
    return LLM(ckpt, compilation_config=0, **ENGINE)


def test_forward_context_is_scoped(eager_llm: LLM) -> None:
    runner = eager_llm.engine.runner
    _, _, meta = dummy_batch(2, runner.device)
    with pytest.raises(RuntimeError, match="no forward context"):
        get_forward_context()
    with set_forward_context(ForwardContext(meta, runner.model.attn_backend)) as ctx:
        assert get_forward_context() is ctx
    with pytest.raises(RuntimeError, match="no forward context"):
        get_forward_context()


def _trace(model: torch.nn.Module, backend: Any, n: int, tag: str, fullgraph: bool = False
           ) -> list[torch.fx.GraphModule]:
    """The graphs dynamo traces from the model forward (run by dynamo's eager backend); a
    fresh code object per call, and no torch._dynamo.reset(): compiled engines keep theirs."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    ids, pos, meta = dummy_batch(n, torch.device("cpu"))

    def forward(i: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return model(i, p, meta)

    fn = torch.compile(own_code(forward, tag), backend=capture, fullgraph=fullgraph)
    with torch.inference_mode(), set_forward_context(ForwardContext(meta, backend)):
        fn(ids, pos)
    return graphs


def test_attention_is_one_opaque_op_per_layer(ckpt: Path) -> None:
    llm = LLM(ckpt, compilation_config=0, **ENGINE)  # its own model: the wrapper stays on it
    model = llm.engine.runner.model
    backend = model.attn_backend
    layers = model.arch.num_layers
    before = _trace(model, backend, 5, "before")  # the backend traced as is: breaks per layer
    assert len(before) > layers
    assert make_attention_opaque(model) == layers
    assert make_attention_opaque(model) == 0  # wrapped once
    assert all(isinstance(a.backend, OpaqueAttentionBackend) for a in model.attention_layers)
    after = _trace(model, backend, 5, "after", fullgraph=True)  # a break would raise
    assert len(after) == 1
    ops = [n for n in after[0].graph.nodes
           if n.op == "call_function" and "unified_attention" in str(n.target)]
    assert len(ops) == layers
    # outside torch.compile the wrapper calls the backend itself: eager output unchanged
    prompts = mixed_prompts(int(model.arch.vocab_size))[:3]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    ids = [{"prompt_token_ids": p} for p in prompts]
    eager = LLM(ckpt, compilation_config=0, **ENGINE)
    assert ([o.outputs[0].token_ids for o in llm.generate(ids, params)]
            == [o.outputs[0].token_ids for o in eager.generate(ids, params)])


def test_static_compile_sizes_and_stock_mode_with_dynamo_only(ckpt: Path, tmp_path: Path
                                                              ) -> None:
    cfg = {"mode": 3, "backend": "eager", "compile_sizes": [4], "cache_dir": str(tmp_path)}
    llm = LLM(ckpt, compilation_config=cfg, **ENGINE)
    runner = llm.engine.runner
    cf = runner.compiled_forward
    assert cf is not None and cf.stats.warm_sizes == (1, 2, 4)
    assert cf.stats.graphs == 3  # 1 token, the dynamic graph, the static 4
    with torch.inference_mode():
        for n in (4, 5, 3, 4, 17):
            runner.forward(*dummy_batch(n, runner.device))
    assert (cf.stats.graphs, cf.stats.recompiles) == (3, 0)
    stock = LLM(ckpt, compilation_config={"mode": 1, "backend": "eager",
                                          "cache_dir": str(tmp_path)}, **ENGINE)
    assert stock.engine.runner.compilation_status.startswith("on (STOCK_TORCH_COMPILE")
    prompts = [{"prompt_token_ids": p} for p in mixed_prompts(256)[:4]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    eager = LLM(ckpt, compilation_config=0, **ENGINE)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in stock.generate(prompts, params)] == want
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want


# ------------------------------------------------------------------- inductor, end to end
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inductor_cache")


def _forget_loaded_kernels() -> None:
    """Drop inductor's in-process code caches, so kernels come from the cache dir or a build
    (the same kernels loaded earlier in this process would otherwise be reused from memory)."""
    from torch._inductor.utils import clear_caches

    clear_caches()


@pytest.fixture(scope="module")
def compiled_llm(ckpt: Path, cache_dir: Path) -> LLM:
    _forget_loaded_kernels()
    return LLM(ckpt, compilation_config={"mode": 3, "cache_dir": str(cache_dir)}, **ENGINE)


def _greedy(llm: LLM, prompts: list[list[int]], n: int = NUM_OUTPUT) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_compiled_greedy_equals_eager_and_transformers(ckpt: Path, compiled_llm: LLM,
                                                       eager_llm: LLM) -> None:
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    prompts = mixed_prompts(vocab)
    want = hf_greedy(ckpt, prompts, NUM_OUTPUT)
    assert _greedy(eager_llm, prompts) == want
    assert _greedy(compiled_llm, prompts) == want
    stats = compiled_llm.engine.runner.compiled_forward.stats  # type: ignore[union-attr]
    assert stats.recompiles == 0  # every step's token count ran a warm-up graph
    status = compiled_llm.memory_readout()["compilation"]
    assert status.startswith("on (VLLM_COMPILE, backend inductor: 2 graphs in")


def test_no_recompile_across_token_counts(compiled_llm: LLM) -> None:
    from torch._dynamo.utils import counters

    runner = compiled_llm.engine.runner
    cf = runner.compiled_forward
    assert cf is not None and cf.stats.warm_sizes == (1, 2)
    graphs, unique = cf.stats.graphs, counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        for n in (1, 2, 3, 7, 8, 16, 24, 1, 5):
            hidden = runner.forward(*dummy_batch(n, runner.device))
            assert hidden.shape == (n, runner.model.arch.hidden_size)
    assert (cf.stats.graphs, cf.stats.recompiles) == (graphs, 0)
    assert counters["stats"]["unique_graphs"] == unique


def test_second_build_hits_the_inductor_cache(ckpt: Path, compiled_llm: LLM, cache_dir: Path,
                                              tmp_path: Path) -> None:
    """CPU freezes the weights (packed oneDNN tensors do not pickle), so inductor's FX-graph
    cache is bypassed and what a second build reuses is its kernel cache: the generated C++
    built into .so files under cache_dir, keyed by their source."""
    first = compiled_llm.engine.runner.compiled_forward
    assert first is not None
    assert first.stats.fx_cache_bypasses == first.stats.graphs
    assert first.stats.kernels_built >= 1
    built = sorted(cache_dir.rglob("*.so"))
    assert len(built) == first.stats.kernels_built
    cfg = {"mode": 3, "cache_dir": str(cache_dir)}
    _forget_loaded_kernels()  # the second build must find them on disk
    again = LLM(ckpt, compilation_config=cfg, **ENGINE)
    stats = again.engine.runner.compiled_forward.stats  # type: ignore[union-attr]
    assert (stats.graphs, stats.kernels_built) == (first.stats.graphs, 0)
    assert sorted(cache_dir.rglob("*.so")) == built
    assert "0 kernels built" in again.memory_readout()["compilation"]
    # the cached kernels take the weights as constants bound at load: a checkpoint of the same
    # shapes with other weights reuses every kernel and computes with its own weights
    other = tiny_checkpoint(tmp_path / "other", arch="llama", seed=1)
    prompts = mixed_prompts(256)[:4]
    other_llm = LLM(other, compilation_config=cfg, **ENGINE)
    assert other_llm.engine.runner.compiled_forward.stats.kernels_built == 0  # type: ignore[union-attr]
    want = _greedy(LLM(other, compilation_config=0, **ENGINE), prompts)
    assert _greedy(other_llm, prompts) == want
    assert want != _greedy(again, prompts)  # the two checkpoints do differ
