"""CUDA graphs for decode: one captured forward per padded batch size, replayed every step.

A decode step launches a few hundred small kernels; at batch 1 the GPU finishes each faster
than Python can launch the next, so the step is launch-bound. A CUDA graph records the launches
once and replays them with one call. Its price: every tensor the kernels touch must live at a
fixed address with a fixed shape, so the inputs go through static buffers.

    capture (engine start, after the KV cache is allocated; largest size first, one shared pool)
        for bs in reversed(capture_sizes):           vLLM's buckets up to max_num_seqs
            static input_ids[:bs], positions[:bs], slot_mapping[:bs], seq_lens[:bs],
                   block_tables[:bs, :W]            W = cdiv(max_model_len, block_size)
            graph[bs] = record(model(...))  ->  static hidden[:bs]
    replay (a decode-only batch of n <= max capture size)
        bs = smallest capture size >= n
        copy the n real rows in; rows n..bs are padding: slot -1 (no KV write), seq_len 0
        (the attention kernel writes zeros), token 0, position 0, block table all null block
        graph[bs].replay();  hidden = static hidden[:n]

With compilation_config on, the graphs capture the compiled forward (vLLM's full decode graphs
over the compiled model). Anything else runs without a graph: prefills, mixed batches,
speculative verification (query_len > 1), decode batches larger than the largest size,
`enforce_eager=True`, the CPU, and attention backends that plan on the host
(`AttentionBackend.cudagraph_safe` False: the torch backend builds its plan from the metadata's
host lists, which a replay would never see).

The graph memory (the pool's intermediate tensors) comes out of the memory budget: the engine
measures one capture of the largest size on a temporary KV cache before sizing the KV pool
(`ModelRunner.profile_cudagraph_memory`) and reports the measured total after the real capture.

`EagerReplay` is a stand-in for `torch.cuda.CUDAGraph` that re-runs the recorded callable on the
same static buffers. On CPU it lets tests drive exactly the bookkeeping above (padding, copies,
slicing, host-list independence of the backend) without a GPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Protocol

import torch

from workbench.attention.metadata import AttentionMetadata
from workbench.core.kv_cache.utils import cdiv


def cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's decode buckets, [1, 2, 4] + multiples of 8 below 256 + multiples of 16 from 256,
    cut at max_num_seqs; max_num_seqs itself is added when it falls between buckets, so every
    decode batch the scheduler can form has a graph."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs ({max_num_seqs}) must be >= 1")
    buckets = [1, 2, 4, *range(8, 256, 8), *range(256, max(max_num_seqs, 256) + 1, 16)]
    sizes = [b for b in buckets if b <= max_num_seqs]
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_batch_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest capture size >= num_seqs (sizes ascending); None when none is."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


class Graph(Protocol):
    def replay(self) -> None: ...


GraphFactory = Callable[[Callable[[], torch.Tensor], Any], tuple[Graph, torch.Tensor]]
# what a graph captures: the model, or its compiled forward (workbench.compilation)
ModelForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


class EagerReplay:
    """A CPU stand-in for a captured graph: replay() calls the recorded function again (so it
    reads whatever the static buffers hold now) and writes the result into the static output."""

    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor) -> None:
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())


def eager_graph_factory(fn: Callable[[], torch.Tensor], pool: Any) -> tuple[Graph, torch.Tensor]:
    out = fn()
    return EagerReplay(fn, out), out


def cuda_graph_factory(fn: Callable[[], torch.Tensor], pool: Any) -> tuple[Graph, torch.Tensor]:
    """Warm up once on a side stream (lazy inits, Triton autotune/compile happen outside the
    capture), then record `fn` into a torch.cuda.CUDAGraph that allocates from `pool`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class DecodeGraphRunner:
    """Static buffers + one captured model forward per capture size (see the module doc)."""

    def __init__(
        self,
        model: ModelForward,
        capture_sizes: list[int],
        max_model_len: int,
        block_size: int,
        device: torch.device,
        graph_factory: GraphFactory | None = None,
    ) -> None:
        if not capture_sizes or capture_sizes != sorted(set(capture_sizes)):
            raise ValueError(f"capture_sizes ({capture_sizes}) must be ascending and unique")
        self.model = model
        self.capture_sizes = list(capture_sizes)
        self.block_size = block_size
        self.device = device
        self.max_bs = capture_sizes[-1]
        self.max_blocks = cdiv(max_model_len, block_size)
        if graph_factory is None:
            graph_factory = cuda_graph_factory if device.type == "cuda" else eager_graph_factory
        self.graph_factory = graph_factory
        n, dev, i64 = self.max_bs, device, torch.int64
        self.input_ids = torch.zeros(n, dtype=i64, device=dev)
        self.positions = torch.zeros(n, dtype=i64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=i64, device=dev)
        self.seq_lens = torch.zeros(n, dtype=i64, device=dev)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=i64, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=i64, device=dev)
        self.graphs: dict[int, tuple[Graph, torch.Tensor]] = {}
        self.pool: Any = None
        self.num_replays = 0

    def _metadata(self, bs: int) -> AttentionMetadata:
        """The metadata the captured kernels see: views of the static buffers. Its host lists
        describe the capture (all padding); a graph-safe backend never reads them on decode."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            query_lens_cpu=[1] * bs,
            seq_lens_cpu=[0] * bs,
            max_query_len=1,
            max_seq_len=self.max_blocks * self.block_size,
        )

    def capture(self) -> None:
        """Record every size, largest first so smaller graphs reuse the pool's memory."""
        if self.device.type == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
        self._fill_padding(0, self.max_bs)
        for bs in reversed(self.capture_sizes):
            meta = self._metadata(bs)

            def forward(bs: int = bs, meta: AttentionMetadata = meta) -> torch.Tensor:
                return self.model(self.input_ids[:bs], self.positions[:bs], meta)

            self.graphs[bs] = self.graph_factory(forward, self.pool)

    def _fill_padding(self, start: int, end: int) -> None:
        self.input_ids[start:end].zero_()
        self.positions[start:end].zero_()
        self.slot_mapping[start:end].fill_(-1)
        self.seq_lens[start:end].zero_()
        self.block_tables[start:end].zero_()

    def can_run(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """A decode-only batch (one token per sequence, no padding tokens) that fits a graph."""
        return (
            meta.max_query_len == 1
            and num_tokens == meta.num_seqs
            and num_tokens <= self.max_bs
            and meta.block_tables.shape[1] <= self.max_blocks
        )

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """hidden [n, hidden_size] for a decode-only batch of n sequences (can_run true)."""
        n = input_ids.shape[0]
        bs = padded_batch_size(n, self.capture_sizes)
        assert bs is not None and self.can_run(meta, n)
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        self.block_tables[:n, width:].zero_()
        if bs > n:
            self._fill_padding(n, bs)
        graph, out = self.graphs[bs]
        graph.replay()
        self.num_replays += 1
        return out[:n]
