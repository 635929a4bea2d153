"""KV eviction policies: the interface the scheduler calls, and a registry by method name.

A policy decides, per request and step, which *logical* KV blocks to drop; the cache
manager (`KVCacheManager.evict_blocks`) releases them from the request's block table. The
policy never touches blocks, the pool or the worker: it reads a `RequestKVView` (lengths and
the logical indices of the blocks the request still holds) and, for score-based methods,
the per-block attention scores the worker reported.

Words used throughout:

    logical block index   block i holds the request's tokens i*bs .. (i+1)*bs - 1 (bs =
                          block_size), whatever has been evicted: the index a block had in
                          the uncompressed table. Policies speak in logical indices only.
    kept blocks           `view.kept_blocks`: the logical indices the request still holds,
                          ascending; the block table row on the worker is exactly these
                          blocks in this order (row position k holds logical block
                          kept_blocks[k]).
    evictable             a full block whose KV is already written: logical index <
                          num_computed_tokens // bs. The block being written (the partial
                          last block, or any block the step's new tokens go to) never is.

The scheduler's calls, in a step (only for running requests, before their slots are
allocated; a request admitted from the waiting queue computes its first chunk
uncompressed and is considered from its next step on):

    1. decision = policy.select(view)        -> EvictionDecision | None
       the manager drops decision.evict from the shared table (every layer) and records
       decision.layer_drop (per layer; see "per-layer budgets" below)
    2. slots are allocated for the step's new tokens (in the compacted table)
    3. if policy.needs_scores: span = policy.score_queries(view) for every scheduled request
       (also those admitted this step): the logical query positions [first, end) among this
       step's scheduled tokens whose attention the worker must report
       (`SchedulerOutput.kv_score_queries[req_id] = span`)
    4. after the forward, `ModelRunnerOutput.kv_block_scores[req_id]` (see below) ->
       policy.observe(req_id, view, scores); the view is the one the forward ran with
    5. a finished or preempted request: policy.forget(req_id) (a preempted request
       recomputes from its tokens, uncompressed, and is evicted again as it grows)

(a) score-free policies (streaming_llm) decide from lengths alone: needs_scores = False,
    select() only.
(b) score-based policies (h2o every decode step, snapkv / pyramidkv once after the
    prefill) set `needs_scores = True` and `score_when` ("decode": every step whose
    scheduled tokens are all past the prompt; "prefill_end": the step whose scheduled tokens
    reach the end of the prompt; the policy's score_queries() decides the exact span).
    The worker's contract (`ModelRunnerOutput.kv_block_scores`):

        kv_block_scores[req_id]: np.ndarray float32 [num_layers, len(kept_blocks)]
            column k: the attention probability (softmax weight, after scaling and the
            causal mask) that the span's queries gave to the tokens of row position k
            (= logical block kept_blocks[k] of the table the forward ran with, including
            blocks allocated for this step), summed over the block's tokens, over all
            query heads and over the span's queries; one row per layer. A policy that
            wants one figure per block sums over rows itself. With `score_granularity =
            "token"` the worker reports [num_layers, kept_tokens] instead (row position k's
            token t at column k*bs + t; kept_tokens = the request's kept cache length after
            the step), for policies that pool over neighbouring tokens (SnapKV's kernel).
            With per-layer drops, a layer's dropped positions score 0.

    A score-based policy keeps its own per-request accumulators (keyed by request id and
    logical block index, so compaction does not move them) and drops them in forget().
(c) per-layer budgets (pyramidkv): the mechanism is per-layer block tables. The decision
    carries `layer_drop[layer]`: logical blocks that layer stops attending while another
    layer still keeps them. The shared table frees a block only when every layer dropped it
    (put it in `evict`, not in layer_drop; the manager also moves a block dropped by every
    layer into `evict` itself). Each layer attends over its own subset: the scheduler sends,
    for every scheduled request with any per-layer drop, the row positions each layer
    skips (`SchedulerOutput.kv_layer_drops[req_id][layer]`, positions in this step's table
    row), and the worker's attention builds that layer's table / seq_len from them. Writes
    (slot_mapping) always go to the shared table: a new token's KV is written in every
    layer. Split of the work: the shared eviction (this interface, the manager, the
    scheduler, the worker's shared table) is helper B1's; the per-layer subset in attention
    and the score computation are helper B2's (h2o.py, snapkv.py, pyramidkv.py here).

Budget: `KVCompressionConfig.budget_for(num_prompt_tokens)` tokens per layer, in blocks
`view.budget_blocks` = ceil(budget / bs). With the budget at or above the request's length
a policy must evict nothing (the output then equals the uncompressed engine's).

Positions: KV already written keeps the RoPE position it was written with (its logical
position: StreamingLLM's "original positions" variant); new tokens get their logical
position; attention's sequence length and the slot mapping count kept tokens only. See
docs/kv_compression.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import numpy as np

    from workbench.config.kv_compression import KVCompressionConfig

SCORE_WHEN = ("never", "decode", "prefill_end")
SCORE_GRANULARITIES = ("block", "token")


@dataclass(frozen=True)
class RequestKVView:
    """What a policy may read about one request (a snapshot; never the live Request).

    num_computed_tokens: logical tokens whose KV is written (the request's
        num_computed_tokens), before this step's tokens.
    num_new_tokens: tokens scheduled this step (0 when select() runs before the token
        budget is known: the scheduler passes the count it is about to schedule).
    kept_blocks: logical indices of the blocks the request holds, ascending.
    num_logical_blocks: the blocks it ever allocated since it last started (held +
        evicted): the next new block gets this logical index.
    layer_drop: per layer, logical blocks that layer no longer attends (empty tuple: none).
    budget_tokens: this request's budget (`KVCompressionConfig.budget_for`).
    """

    request_id: str
    num_prompt_tokens: int
    num_tokens: int  # prompt + output tokens so far
    num_computed_tokens: int
    num_new_tokens: int
    block_size: int
    kept_blocks: tuple[int, ...]
    num_logical_blocks: int
    budget_tokens: int
    num_layers: int
    layer_drop: tuple[tuple[int, ...], ...] = ()

    @property
    def budget_blocks(self) -> int:
        return -(-self.budget_tokens // self.block_size)

    @property
    def num_evictable_limit(self) -> int:
        """Logical blocks below this index are full and written (evictable)."""
        return self.num_computed_tokens // self.block_size

    @property
    def evictable(self) -> list[int]:
        """The kept blocks a policy may evict this step, ascending."""
        limit = self.num_evictable_limit
        return [b for b in self.kept_blocks if b < limit]

    @property
    def num_blocks_after_step(self) -> int:
        """Blocks the request holds once this step's tokens are written, if nothing is
        evicted: the kept blocks plus those the new tokens need beyond them."""
        end = self.num_computed_tokens + self.num_new_tokens  # logical
        needed = -(-end // self.block_size)  # logical blocks covering the tokens
        return len(self.kept_blocks) + max(0, needed - self.num_logical_blocks)

    @property
    def prompt_done(self) -> bool:
        """The prompt's KV is written (the request decodes)."""
        return self.num_computed_tokens >= self.num_prompt_tokens


@dataclass
class EvictionDecision:
    """evict: logical blocks dropped from the shared table (every layer); each must be
    evictable (kept and < num_computed_tokens // block_size).
    layer_drop: None, or one list per layer of logical blocks that layer alone stops
    attending (still held for the others); cumulative: the layer's whole drop set after this
    decision, not the increment."""

    evict: list[int] = field(default_factory=list)
    layer_drop: list[list[int]] | None = None

    @property
    def is_empty(self) -> bool:
        return not self.evict and self.layer_drop is None


class KVCompressionPolicy(ABC):
    """One eviction method (see the module docstring for the calls and their order)."""

    method: ClassVar[str]
    needs_scores: ClassVar[bool] = False
    score_when: ClassVar[str] = "never"  # one of SCORE_WHEN
    score_granularity: ClassVar[str] = "block"  # one of SCORE_GRANULARITIES
    per_layer: ClassVar[bool] = False  # may return layer_drop

    def __init__(self, config: KVCompressionConfig, block_size: int, num_layers: int) -> None:
        self.config = config
        self.block_size = block_size
        self.num_layers = num_layers

    def budget_tokens(self, num_prompt_tokens: int) -> int:
        return self.config.budget_for(num_prompt_tokens)

    @abstractmethod
    def select(self, view: RequestKVView) -> EvictionDecision | None:
        """The blocks to drop before this step's slots are allocated (None: nothing)."""

    def score_queries(self, view: RequestKVView) -> tuple[int, int] | None:
        """Logical query positions [first, end), within this step's scheduled tokens
        [num_computed_tokens, num_computed_tokens + num_new_tokens), whose attention the
        worker reports this step; None: no scores this step."""
        return None

    def observe(self, request_id: str, view: RequestKVView, scores: np.ndarray) -> None:
        """This step's scores for `request_id` (shape: see the module docstring)."""
        return

    def forget(self, request_id: str) -> None:
        """The request finished or was preempted: drop any state kept for it."""
        return


PolicyFactory = Callable[["KVCompressionConfig", int, int], KVCompressionPolicy]
_REGISTRY: dict[str, type[KVCompressionPolicy]] = {}


def register_policy(cls: type[KVCompressionPolicy]) -> type[KVCompressionPolicy]:
    """Class decorator: make `cls` the policy for `cls.method`."""
    if cls.score_when not in SCORE_WHEN:
        raise ValueError(f"{cls.__name__}.score_when ({cls.score_when!r}) must be one of "
                         f"{', '.join(repr(w) for w in SCORE_WHEN)}")
    if cls.score_granularity not in SCORE_GRANULARITIES:
        raise ValueError(f"{cls.__name__}.score_granularity ({cls.score_granularity!r}) must "
                         f"be one of {', '.join(repr(g) for g in SCORE_GRANULARITIES)}")
    _REGISTRY[cls.method] = cls
    return cls


def _load_builtin() -> None:
    """Import the shipped policies (each registers itself); a missing module is skipped so
    methods can land one at a time."""
    import importlib

    for name in ("streaming_llm", "h2o", "snapkv", "pyramidkv"):
        try:
            importlib.import_module(f"workbench.core.kv_cache.compression.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"workbench.core.kv_cache.compression.{name}":
                raise


def registered_methods() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def make_policy(config: KVCompressionConfig, block_size: int,
                num_layers: int) -> KVCompressionPolicy:
    """The policy for `config.method` (ValueError naming what exists if it is missing)."""
    _load_builtin()
    cls = _REGISTRY.get(config.method)
    if cls is None:
        raise ValueError(
            f"kv_compression_config.method ({config.method!r}) has no policy implemented yet "
            f"(implemented: {', '.join(repr(m) for m in sorted(_REGISTRY)) or 'none'})")
    return cls(config, block_size, num_layers)
