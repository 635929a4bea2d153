"""CompiledForward: the model forward through torch.compile (compilation_config modes 1 and 3).

Place in the flow: `ModelRunner.initialize_kv_cache` builds it once the KV cache is bound (and
before decode CUDA graphs are captured, so they capture it); `ModelRunner.forward` calls it
instead of the model. `compute_logits`, the sampler and the draft model stay eager.

    build     every Attention layer's backend -> OpaqueAttentionBackend (the paged attention
              is one opaque op per layer, workbench::unified_attention); the decoder's linear
              plans dropped (inductor cannot lower a packed oneDNN/MKL weight that is a graph
              input; with freezing it packs the frozen weights itself); inductor's caches ->
              cache_dir; torch.compile(fn(input_ids, positions, static_size))
    warm_up   mode 3, at engine start: one dummy forward per graph -- 1 token (dynamo
              specializes sizes 0/1), 2 tokens (the dynamic graph, every other count), each
              compile size -- timed: `compile_s`, `graphs`, what inductor's caches gave
    __call__  scope the forward context (metadata, real backend) and the inductor options, mark
              the token dim dynamic (mode 3), call; a graph compiled after warm-up is a
              recompile, counted and logged

The inductor options (`inductor_compile_config` over the device defaults) are set around every
call, not passed to the backend: `freezing` is read while dynamo traces, before any backend
runs, and `torch.compile(options=...)` / `compile_fx(config_patches=...)` silently leave the
weights unfrozen (measured: aten::mm instead of packed MKL / oneDNN GEMMs). Setting and
restoring one option costs ~3 us a call.

Shapes (mode 3): `torch._dynamo.mark_dynamic` on dim 0 of input_ids and positions, so one graph
serves every token count >= 2 with no padding (vLLM's default). Counts listed in
`compile_sizes` run their own static graph: the Python int `static_size` argument (the count,
or 0 for the dynamic graph) is read in the traced function, so dynamo guards its value and the
static graphs' cache entries never serve the dynamic graph's calls, nor the other way round.
Bucketing (padding to capture sizes, one static graph each) was measured against this on the
2-core box and lost on compile time with no runtime gain (docs/compile.md).

Each instance compiles its own copy of the traced function's code object: dynamo keeps its
cache (and the recompile limit) per code object, so engines in one process (tests build
dozens) would otherwise evict each other's graphs.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from workbench.attention.backends import AttentionBackend
from workbench.attention.custom_op import make_attention_opaque
from workbench.attention.forward_context import ForwardContext, set_forward_context
from workbench.attention.metadata import AttentionMetadata
from workbench.config.compilation import CompilationConfig, CompilationMode

if TYPE_CHECKING:
    from workbench.layers.linear_backend import PackableLinear

logger = logging.getLogger(__name__)

# What the traced forward passes the layers as attn_metadata: the opaque attention op reads the
# real one from the forward context, so nothing in the graph may depend on it.
_IN_CONTEXT = cast(AttentionMetadata, None)
_instances = itertools.count()
# dynamo's per-code-object recompile limit must hold: 1 token, the dynamic graph, each compile
# size, plus slack for a KV cache rebound after compile (a new tensor identity recompiles)
_RECOMPILE_SLACK = 6


@dataclass
class CompileStats:
    """What compiling cost and what the caches gave: the engine report's `compilation`."""

    mode: str
    backend: str
    cache_dir: str
    compile_s: float = 0.0  # the warm-up forwards' wall time (dynamo + inductor + first runs)
    graphs: int = 0  # graphs compiled (warm-up and later)
    recompiles: int = 0  # graphs compiled after warm-up (each a stall of a serving step)
    # during warm-up: inductor's FX-graph cache (whole compiled graphs; bypassed when frozen
    # weights are packed: mkldnn tensors do not pickle) and its kernel cache (the generated
    # C++ built into .so files under cache_dir, keyed by their source: 0 new = all reused)
    fx_cache_hits: int = 0
    fx_cache_misses: int = 0
    fx_cache_bypasses: int = 0
    kernels_built: int = 0
    warm_sizes: tuple[int, ...] = ()

    def describe(self) -> str:
        if not self.warm_sizes:
            return f"{self.mode}, backend {self.backend}, compiled on first use"
        fx = ("FX cache bypassed (frozen weights)" if self.fx_cache_bypasses
              and not self.fx_cache_hits + self.fx_cache_misses else
              f"FX cache {self.fx_cache_hits} hits / {self.fx_cache_misses} misses")
        return (f"{self.mode}, backend {self.backend}: {self.graphs} graphs in "
                f"{self.compile_s:.1f} s ({fx}; {self.kernels_built} kernels built; "
                f"{self.recompiles} recompiles since)")


def _inductor_counter(name: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"][name])


def _built_kernels(cache_dir: str) -> int:
    """Compiled kernel libraries (.so) under inductor's cache dir."""
    return sum(1 for _ in Path(cache_dir).rglob("*.so"))


def strip_linear_plans(model: nn.Module, keep: nn.Module | None) -> int:
    """Drop the CPU linear backend plans and packed copies of every layer except `keep` (the
    LM head, which stays eager); returns the bytes of the packed copies released (their
    weights' bytes, as `cpu_gemm.pack_linear_weights` counts them)."""
    freed = 0
    for m in model.modules():
        if m is keep or getattr(m, "linear_plan", None) is None:
            continue
        # a layer with a plan is a PackableLinear (nn.Module types attributes Tensor | Module)
        layer = cast("PackableLinear", m)
        packed = getattr(layer, "packed_weight", None)
        if packed is not None:
            w = layer.weight
            freed += w.numel() * w.element_size()
        layer.linear_plan = None
        layer.packed_weight = None
    return freed


def own_code(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """`fn` with a code object of its own (dynamo caches compiled graphs per code object)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    out = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__,
                             fn.__closure__)
    return out


def _backend(config: CompilationConfig, on_graph: Callable[[], None]) -> Callable[..., Any]:
    """torch.compile's backend for `config`, counting every graph it compiles."""
    if config.backend == "inductor":
        from torch._inductor.compile_fx import compile_fx

        inner: Callable[..., Any] = compile_fx  # options: CompiledForward's config scope
    else:
        from torch._dynamo.backends.registry import lookup_backend

        inner = lookup_backend(config.backend)

    def counted(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        on_graph()
        return inner(gm, example_inputs)

    return counted


def _checked_options(options: dict[str, Any]) -> dict[str, Any]:
    """inductor options that exist (ValueError naming the first that does not)."""
    import torch._inductor.config as ic

    for key in options:
        if not hasattr(ic, key):
            raise ValueError(f"compilation_config inductor_compile_config key {key!r} is not "
                             "an inductor option (torch._inductor.config)")
    return dict(options)


class CompiledForward:
    """`compiled(input_ids, positions, attn_metadata) -> hidden`, the model's signature."""

    def __init__(self, model: nn.Module, config: CompilationConfig,
                 device: torch.device) -> None:
        if not config.compiles or config.mode is None:  # a mode that compiles is never None
            raise ValueError(f"compilation_config mode {config.describe()} compiles nothing")
        self.model = model
        self.config = config
        self.device = device
        self.mode = CompilationMode(config.mode)
        backend = getattr(model, "attn_backend", None)
        if not isinstance(backend, AttentionBackend):
            raise ValueError("compilation_config needs a model with an `attn_backend` "
                             "(workbench.models.llama)")
        self.backend: AttentionBackend = backend  # the real one: the op calls it
        make_attention_opaque(model)
        self.freed_packed_bytes = strip_linear_plans(model, getattr(model, "lm_head", None))
        cache_dir = config.resolved_cache_dir()
        cache_dir.mkdir(parents=True, exist_ok=True)
        # process-wide, as vLLM does: inductor reads it at every compile and cache lookup
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        self.stats = CompileStats(mode=self.mode.name, backend=config.backend,
                                  cache_dir=str(cache_dir))
        self._warm = False
        limit = 2 + len(config.compile_sizes) + _RECOMPILE_SLACK
        if torch._dynamo.config.recompile_limit < limit:
            torch._dynamo.config.recompile_limit = limit
        self.static_sizes = frozenset(config.compile_sizes)
        self.inductor_options = _checked_options(
            config.inductor_options(device.type) if config.backend == "inductor" else {})

        def forward(input_ids: torch.Tensor, positions: torch.Tensor,
                    static_size: int) -> torch.Tensor:
            if static_size:  # read, so dynamo guards its value: 0 never runs a static graph
                torch._check(input_ids.shape[0] == static_size)
            return model(input_ids, positions, _IN_CONTEXT)

        fn = own_code(forward, f"{next(_instances)}")
        stock = self.mode == CompilationMode.STOCK_TORCH_COMPILE
        self._compiled = torch.compile(
            fn, backend=_backend(config, self._on_graph),
            fullgraph=not stock,  # mode 3: a graph break is an error, not a slow path
            dynamic=None if stock else False,  # mode 3: only the marked token dim is dynamic
        )

    def _on_graph(self) -> None:
        self.stats.graphs += 1
        if self._warm:
            self.stats.recompiles += 1
            logger.warning("torch.compile recompiled the model forward after warm-up "
                           "(%d recompiles so far): a serving step waited for it",
                           self.stats.recompiles)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 attn_metadata: AttentionMetadata) -> torch.Tensor:
        n = input_ids.shape[0]
        static = n if n in self.static_sizes else 0
        if self.mode == CompilationMode.VLLM_COMPILE and not static and n > 1:
            torch._dynamo.mark_dynamic(input_ids, 0)
            torch._dynamo.mark_dynamic(positions, 0)
        ic = torch._inductor.config
        saved = {k: getattr(ic, k) for k in self.inductor_options}
        for k, v in self.inductor_options.items():
            setattr(ic, k, v)
        try:
            with set_forward_context(ForwardContext(attn_metadata, self.backend)):
                return self._compiled(input_ids, positions, static)
        finally:
            for k, v in saved.items():
                setattr(ic, k, v)

    # ------------------------------------------------------------------ warm-up
    def warm_up_sizes(self, max_num_tokens: int) -> list[int]:
        """The token counts whose forwards compile every graph mode 3 will use."""
        sizes = {1, 2}
        if 2 in self.static_sizes:  # the dynamic graph needs a count that is not static
            free = next(n for n in itertools.count(3) if n not in self.static_sizes)
            sizes = {1, free}
        sizes |= self.static_sizes
        return sorted(s for s in sizes if s <= max_num_tokens)

    @torch.inference_mode()
    def warm_up(self, max_num_tokens: int) -> CompileStats:
        """Compile at start (mode 3): one dummy forward per graph, on padding-only slots
        (slot -1: no KV write) of one-token sequences reading the null block. Mode 1 compiles
        on first use instead."""
        if self.mode != CompilationMode.VLLM_COMPILE:
            self._warm = True
            return self.stats
        names = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")
        before = [_inductor_counter(c) for c in names]
        libs = _built_kernels(self.stats.cache_dir)
        sizes = self.warm_up_sizes(max_num_tokens)
        t0 = time.perf_counter()
        for n in sizes:
            ids, pos, meta = dummy_batch(n, self.device)
            self(ids, pos, meta)
        self.stats.compile_s = time.perf_counter() - t0
        st = self.stats
        st.fx_cache_hits, st.fx_cache_misses, st.fx_cache_bypasses = (
            _inductor_counter(c) - b for c, b in zip(names, before, strict=True))
        st.kernels_built = _built_kernels(st.cache_dir) - libs
        self.stats.warm_sizes = tuple(sizes)
        self._warm = True
        logger.info("compiled the model forward: %s; cache %s", self.stats.describe(),
                    self.stats.cache_dir)
        return self.stats


def dummy_batch(n: int, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """n one-token sequences at position 0 whose K/V writes are skipped (slot -1) and whose
    context is the null block (zeros): any backend runs it without touching real blocks."""
    i64 = torch.int64
    meta = AttentionMetadata(
        slot_mapping=torch.full((n,), -1, dtype=i64, device=device),
        query_start_loc=torch.arange(n + 1, dtype=i64, device=device),
        seq_lens=torch.ones(n, dtype=i64, device=device),
        block_tables=torch.zeros(n, 1, dtype=i64, device=device),
        query_lens_cpu=[1] * n,
        seq_lens_cpu=[1] * n,
        max_query_len=1,
        max_seq_len=1,
    )
    ids = torch.zeros(n, dtype=i64, device=device)
    return ids, torch.zeros(n, dtype=i64, device=device), meta
