"""KVCacheManager: which blocks each request holds; prefix-cache lookup; copy-on-write.

    Scheduler --get_computed_blocks(req)--> (hit blocks, num hit tokens)   [waiting requests]
              --allocate_slots(req, n, hits, n_hit)--> new blocks | None    [every step]
              --free(req)-->                                               [finish / preempt]
    ModelRunner <--take_copy_ops()-- [(src_block_id, dst_block_id), ...]  (apply in order,
                                                                            before the forward)

Per request it keeps the block list, the chained hashes of its full blocks (extended
incrementally, never recomputed) and how many leading blocks were already offered to the
cache. It never modifies the Request: the scheduler advances `num_computed_tokens` itself.

    block_size 4, num_computed_tokens 6, num_new_tokens 3:
    | t0 t1 t2 t3 | t4 t5 __ __ | __ __ __ __ |
       block 0       block 1       block 2 (new)
    writes go to positions 6..8: block 1 (copied first if shared: ref_cnt > 1) and block 2.

KV compression (`evict_blocks`, docs/kv_compression.md): a request may release full,
written blocks from the middle of its table; the table is compacted and the request's
`num_evicted_tokens` (evicted blocks x block_size) maps a logical token position p at or
after the write position to row slot p - num_evicted_tokens. Every count below that reads
`request.num_computed_tokens` subtracts it. A request's blocks filled after its first
eviction are never offered to the prefix cache (their KV saw a compressed context); an
evicted block it held alone loses its key.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from workbench.core.kv_cache.block import KVCacheBlock
from workbench.core.kv_cache.block_pool import BlockPool
from workbench.core.kv_cache.hashing import (
    BlockHash,
    HashFn,
    extend_block_hashes,
    sha256_hash_fn,
)
from workbench.core.request import Request


class PrefixCacheStats(NamedTuple):
    """Tokens looked up and tokens hit since the last `make_prefix_cache_stats()`."""

    queries: int
    hits: int


class _RequestBlocks:
    """A request's blocks, their ids (kept in step) and the keys of its full blocks."""

    __slots__ = ("blocks", "block_ids", "block_hashes", "num_cached_blocks", "num_slots",
                 "next_full_at", "evicted_tokens", "logical", "layer_drop")

    def __init__(self, next_full_at: int) -> None:
        self.blocks: list[KVCacheBlock] = []
        self.block_ids: list[int] = []
        self.block_hashes: list[BlockHash] = []
        self.num_cached_blocks = 0  # leading blocks already offered to the cache
        self.num_slots = 0  # len(blocks) * block_size
        self.next_full_at = next_full_at  # (num_cached_blocks + 1) * block_size, or maxsize
        # KV compression: tokens of the evicted blocks (0: never evicted), each held block's
        # logical index (None: the identity, nothing evicted) and per-layer drops
        self.evicted_tokens = 0
        self.logical: list[int] | None = None
        self.layer_drop: list[list[int]] | None = None


class KVCacheManager:
    """Paged KV-cache bookkeeping for one attention type, vLLM V1 semantics."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_fn: HashFn | None = None,
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size ({block_size}) must be a positive integer")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_fn: HashFn = hash_fn if hash_fn is not None else sha256_hash_fn
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.num_blocks = num_blocks
        self._reqs: dict[str, _RequestBlocks] = {}
        self._first_full_at = block_size if enable_caching else sys.maxsize  # never caches
        self._copy_ops: list[tuple[int, int]] = []
        self._detached: list[KVCacheBlock] = []  # held by no request (detach_blocks)
        self._queries = 0
        self._hits = 0
        self.num_evicted_blocks = 0  # blocks released by evict_blocks, ever (a counter)

    # ---- prefix-cache lookup --------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest chain of cached full blocks from block 0 (takes no references).

        At most (num_tokens - 1) // block_size blocks are looked up, so the last token is
        always recomputed and the prefill produces logits. A request with prompt_logprobs
        gets no hit (and counts no query), as in vLLM: the logits of cached positions are
        never computed. Its blocks are still offered to the cache as they fill.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _RequestBlocks(self._first_full_at)
        bs = self.block_size
        tokens = request.all_token_ids
        max_blocks = (len(tokens) - 1) // bs  # the last token is always recomputed
        extend_block_hashes(
            self.hash_fn, st.block_hashes, tokens, bs, max_blocks, request.cache_salt
        )
        computed = self.block_pool.find_longest_cache_hit(
            st.block_hashes, tokens, bs, max_blocks
        )
        num_computed_tokens = len(computed) * bs
        self._queries += len(tokens)
        self._hits += num_computed_tokens
        return computed, num_computed_tokens

    # ---- allocation -----------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> list[KVCacheBlock] | None:
        """Own blocks for num_computed + num_new_computed + num_new + num_lookahead tokens.

        Returns the blocks appended at the end of the request's list (copy-on-write
        replacements are not included: see take_copy_ops / get_block_ids), or None, with
        nothing changed, when the free queue cannot supply them. `delay_cache_blocks` (vLLM's
        name): offer no new full block to the prefix cache yet, because its KV arrives later
        (an asynchronous load from a KV connector); `cache_blocks` offers them once it has.
        """
        st = self._reqs.get(request.request_id)
        if st is not None and not new_computed_blocks and not delay_cache_blocks:
            # Fast path (steady decode): the slots exist, the one block written is ours alone
            # and uncached, and no block becomes full.
            nc = request.num_computed_tokens - st.evicted_tokens
            end = nc + num_new_tokens + num_lookahead_tokens
            if end <= st.num_slots and num_new_tokens > 0 and num_lookahead_tokens >= 0:
                bs = self.block_size
                first = nc // bs
                if end <= (first + 1) * bs and not num_new_computed_tokens:
                    block = st.blocks[first]
                    if (
                        block.ref_cnt == 1
                        and block.block_hash is None
                        and (
                            nc + num_new_tokens < st.next_full_at
                            or len(request.all_token_ids) < st.next_full_at
                        )
                    ):
                        return []
        return self._allocate_slots_slow(
            request, st, num_new_tokens, new_computed_blocks or [],
            num_new_computed_tokens, num_lookahead_tokens, delay_cache_blocks,
        )

    def _allocate_slots_slow(
        self,
        request: Request,
        st: _RequestBlocks | None,
        num_new_tokens: int,
        new_computed: list[KVCacheBlock],
        num_new_computed_tokens: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> list[KVCacheBlock] | None:
        bs = self.block_size
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(
                f"num_new_tokens ({num_new_tokens}) and num_lookahead_tokens "
                f"({num_lookahead_tokens}) must be >= 0"
            )
        if new_computed or num_new_computed_tokens:
            self._check_new_computed(request, st, new_computed, num_new_computed_tokens)
        owned = st.blocks if st is not None else []
        num_owned = len(owned)
        evicted = st.evicted_tokens if st is not None else 0
        nc = request.num_computed_tokens - evicted  # row slots written
        if nc > num_owned * bs:
            raise ValueError(
                f"request {request.request_id!r} has num_computed_tokens={nc} but owns only "
                f"{num_owned} blocks of {bs}; reset num_computed_tokens to 0 after free()"
            )
        write_start = nc + num_new_computed_tokens
        end = write_start + num_new_tokens + num_lookahead_tokens
        num_required = (end + bs - 1) // bs
        num_grow = num_required - num_owned - len(new_computed)
        need = num_grow if num_grow > 0 else 0
        # Held blocks about to be written: a shared one is replaced (copy-on-write); a
        # sole-held cached one whose tokens differ from ours loses its key first.
        cow: list[int] = []
        uncache: list[KVCacheBlock] = []
        if end > write_start:
            tokens = request.all_token_ids
            shift = evicted // bs  # row index -> logical index at and after the write start
            for i in range(write_start // bs, num_required if num_required < num_owned
                           else num_owned):
                block = owned[i]
                li = i + shift
                if block.ref_cnt > 1:
                    cow.append(i)
                elif block.block_hash is not None and block.token_ids != tuple(
                    tokens[li * bs : (li + 1) * bs]
                ):
                    uncache.append(block)
            need += len(cow)
        for block in new_computed:
            if block.ref_cnt == 0:  # a free hit leaves the free queue
                need += 1
        pool = self.block_pool
        if need > pool.free_block_queue.num_free_blocks:
            return None

        # ---- commit: nothing below can fail ----
        if st is None:
            st = self._reqs[request.request_id] = _RequestBlocks(self._first_full_at)
        blocks, ids = st.blocks, st.block_ids
        if new_computed:
            pool.touch(new_computed)
            blocks.extend(new_computed)
            ids.extend([b.block_id for b in new_computed])
        for i in cow:
            shared = blocks[i]
            fresh = pool.get_new_blocks(1)[0]
            if i * bs < nc:  # holds computed KV: the runner must copy it first
                self._copy_ops.append((shared.block_id, fresh.block_id))
            blocks[i] = fresh
            ids[i] = fresh.block_id
            pool.free_blocks((shared,))
        for block in uncache:
            pool.uncache_block(block)
        new_blocks = pool.get_new_blocks(num_grow) if num_grow > 0 else []
        if new_blocks:
            if st.logical is not None:  # held + evicted = the logical blocks so far
                nxt = len(blocks) + st.evicted_tokens // bs
                st.logical.extend(range(nxt, nxt + len(new_blocks)))
            blocks.extend(new_blocks)
            ids.extend([block.block_id for block in new_blocks])
        st.num_slots = len(blocks) * bs

        if self.enable_caching and not delay_cache_blocks:
            self._cache_full(request, st, write_start + num_new_tokens)
        return new_blocks

    def _cache_full(self, request: Request, st: _RequestBlocks, num_tokens: int) -> None:
        """Offer the request's blocks full within its first `num_tokens` tokens (none once
        it has evicted: its later blocks' KV saw a compressed context)."""
        if st.logical is not None:
            return
        bs = self.block_size
        tokens = request.all_token_ids
        num_full = (num_tokens if num_tokens < len(tokens) else len(tokens)) // bs
        num_full = min(num_full, len(st.blocks))
        if num_full > st.num_cached_blocks:
            extend_block_hashes(
                self.hash_fn, st.block_hashes, tokens, bs, num_full, request.cache_salt
            )
            self.block_pool.cache_full_blocks(
                st.blocks, st.block_hashes, tokens, st.num_cached_blocks, num_full, bs
            )
            st.num_cached_blocks = num_full
            st.next_full_at = (num_full + 1) * bs

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """vLLM's name: offer the blocks full within the first `num_computed_tokens` tokens
        to the prefix cache (after an asynchronous load delayed it)."""
        st = self._reqs.get(request.request_id)
        if st is not None and self.enable_caching:
            self._cache_full(request, st, num_computed_tokens)

    def _check_new_computed(
        self, request: Request, st: _RequestBlocks | None, new: list[KVCacheBlock], n: int
    ) -> None:
        rid = request.request_id
        if n != len(new) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens ({n}) must equal len(new_computed_blocks) * "
                f"block_size ({len(new)} * {self.block_size}); pass get_computed_blocks' result"
            )
        if request.num_computed_tokens or (st is not None and st.blocks):
            raise ValueError(f"request {rid!r} already has computed tokens or blocks; "
                             "new_computed_blocks are only for a request that holds none")
        hashes = st.block_hashes if st is not None else []
        for i, block in enumerate(new):
            if i >= len(hashes) or block.block_hash != hashes[i]:
                raise ValueError(
                    f"new_computed_blocks[{i}] (block {block.block_id}) is no longer the cached "
                    f"block for request {rid!r}; call allocate_slots right after "
                    "get_computed_blocks, with no other allocation in between"
                )

    # ---- copy-on-write (n > 1 sampling) ---------------------------------------------------

    def fork(self, parent: Request, child: Request) -> None:
        """Make `child` share the parent's blocks (ref_cnt += 1 each, no copy yet).

        Shared: the blocks holding the first n = min(parent.num_computed_tokens,
        child.num_tokens) tokens, where both requests' token ids must agree. The caller sets
        child.num_computed_tokens (<= n, before or after fork). Writing into a shared block
        then gets a fresh block and a copy op; the last holder writes in place.
        """
        pst = self._reqs.get(parent.request_id)
        if pst is None or not pst.blocks:
            raise ValueError(f"fork: parent {parent.request_id!r} holds no blocks")
        if pst.logical is not None:
            raise ValueError(f"fork: parent {parent.request_id!r} has evicted blocks (KV "
                             "compression); a compressed table cannot be shared")
        cst = self._reqs.get(child.request_id)
        if cst is not None and cst.blocks:
            raise ValueError(f"fork: child {child.request_id!r} already holds blocks")
        n = min(parent.num_computed_tokens, len(child.all_token_ids))
        if child.all_token_ids[:n] != parent.all_token_ids[:n]:
            raise ValueError(
                f"fork: child {child.request_id!r}'s token ids differ from parent "
                f"{parent.request_id!r}'s within the parent's computed tokens"
            )
        num_shared = -(-n // self.block_size)  # blocks holding the shared computed tokens
        shared = pst.blocks[:num_shared]
        self.block_pool.touch(shared)
        cst = self._reqs[child.request_id] = _RequestBlocks(self._first_full_at)
        cst.blocks = shared
        cst.block_ids = pst.block_ids[:num_shared]
        num_shared_full = min(len(pst.block_hashes), n // self.block_size)
        cst.block_hashes = pst.block_hashes[:num_shared_full]
        cst.num_slots = len(shared) * self.block_size
        cst.num_cached_blocks = min(pst.num_cached_blocks, num_shared_full)
        if self.enable_caching:
            cst.next_full_at = (cst.num_cached_blocks + 1) * self.block_size

    def take_copy_ops(self) -> list[tuple[int, int]]:
        """(src_block_id, dst_block_id) copies recorded since the last call, in order."""
        ops, self._copy_ops = self._copy_ops, []
        return ops

    # ---- KV compression (eviction) --------------------------------------------------------

    def evict_blocks(self, request: Request, logical_blocks: list[int]) -> int:
        """Release the request's blocks at these logical indices from the middle of its
        table (KV compression); returns how many were released.

        Each must be held and full and written (logical index < num_computed_tokens //
        block_size: the block being written never is). The table is compacted; the
        request's num_evicted_tokens grows by block_size per block. A block held by this
        request alone loses its prefix-cache key and goes back to the free queue; one
        shared with another request (a prefix hit, ref_cnt > 1) only loses this request's
        reference and keeps its key (its KV is the other holder's valid prefix). From the
        first eviction on, no block of this request is offered to the prefix cache.
        """
        if not logical_blocks:
            return 0
        rid = request.request_id
        st = self._reqs.get(rid)
        if st is None or not st.blocks:
            raise ValueError(f"evict_blocks: request {rid!r} holds no blocks")
        bs = self.block_size
        logical = st.logical if st.logical is not None else list(range(len(st.blocks)))
        limit = request.num_computed_tokens // bs
        drop = set(logical_blocks)
        position = {li: k for k, li in enumerate(logical)}
        for li in sorted(drop):
            if li not in position:
                raise ValueError(f"evict_blocks: request {rid!r} does not hold logical block "
                                 f"{li} (holds {logical})")
            if li >= limit:
                raise ValueError(
                    f"evict_blocks: logical block {li} of request {rid!r} is not full and "
                    f"written (num_computed_tokens {request.num_computed_tokens}, block_size "
                    f"{bs}: blocks < {limit} are)")
        released: list[KVCacheBlock] = []
        keep_blocks: list[KVCacheBlock] = []
        keep_logical: list[int] = []
        for li, block in zip(logical, st.blocks, strict=True):
            if li in drop:
                released.append(block)
            else:
                keep_blocks.append(block)
                keep_logical.append(li)
        pool = self.block_pool
        for block in released:
            if block.ref_cnt == 1:
                pool.uncache_block(block)
        pool.free_blocks(released)
        st.blocks = keep_blocks
        st.block_ids = [b.block_id for b in keep_blocks]
        st.logical = keep_logical
        st.evicted_tokens += len(released) * bs
        st.num_slots = len(keep_blocks) * bs
        st.next_full_at = sys.maxsize  # nothing of it is cached from now on
        if st.layer_drop is not None:
            st.layer_drop = [[li for li in layer if li not in drop] for layer in st.layer_drop]
        self.num_evicted_blocks += len(released)
        return len(released)

    def set_layer_drop(self, request: Request, layer_drop: list[list[int]] | None) -> None:
        """The logical blocks each layer no longer attends while the request still holds
        them for another layer (per-layer budgets); None: every layer attends every block."""
        st = self._reqs.get(request.request_id)
        if st is None:
            raise ValueError(f"set_layer_drop: request {request.request_id!r} holds no blocks")
        if layer_drop is None:
            st.layer_drop = None
            return
        held = set(st.logical if st.logical is not None else range(len(st.blocks)))
        for layer, drops in enumerate(layer_drop):
            missing = sorted(set(drops) - held)
            if missing:
                raise ValueError(f"set_layer_drop: layer {layer} drops logical block(s) "
                                 f"{missing} that request {request.request_id!r} does not hold")
        st.layer_drop = [sorted(set(d)) for d in layer_drop]

    def layer_drop_positions(self, request_id: str) -> list[list[int]] | None:
        """Per layer, the row positions (in the current table) that layer skips; None."""
        st = self._reqs.get(request_id)
        if st is None or st.layer_drop is None:
            return None
        logical = st.logical if st.logical is not None else list(range(len(st.blocks)))
        position = {li: k for k, li in enumerate(logical)}
        return [[position[li] for li in layer] for layer in st.layer_drop]

    def layer_drop(self, request_id: str) -> list[list[int]] | None:
        st = self._reqs.get(request_id)
        return None if st is None or st.layer_drop is None else [list(d) for d in st.layer_drop]

    def num_evicted_tokens(self, request_id: str) -> int:
        """Tokens of the blocks the request evicted since it last started (0: none)."""
        st = self._reqs.get(request_id)
        return st.evicted_tokens if st is not None else 0

    def kept_logical_blocks(self, request_id: str) -> list[int]:
        """The logical indices of the blocks the request holds, ascending (a copy)."""
        st = self._reqs.get(request_id)
        if st is None:
            return []
        return list(st.logical) if st.logical is not None else list(range(len(st.blocks)))

    # ---- release --------------------------------------------------------------------------

    def free(self, request: Request, num_valid_tokens: int | None = None) -> None:
        """Release the request's blocks tail first (prefix blocks are evicted last).

        Call it for every request ever passed in, including aborted waiting ones (a lookup
        keeps the request's hashes). Freed blocks keep their keys until reallocated, except
        with `num_valid_tokens` (a forward that failed: KV at positions >= it may never have
        been written): every block holding such a position loses its key first, so no later
        prefix lookup can hit it.
        """
        st = self._reqs.pop(request.request_id, None)
        if st is None or not st.blocks:
            return
        if num_valid_tokens is not None:
            first = num_valid_tokens // self.block_size  # logical
            logical = st.logical if st.logical is not None else range(len(st.blocks))
            for li, block in zip(logical, st.blocks, strict=True):
                if li >= first:
                    self.block_pool.uncache_block(block)
        self.block_pool.free_blocks(reversed(st.blocks))

    def detach_blocks(self, request: Request) -> list[KVCacheBlock]:
        """Take the request's blocks away from it without freeing them (a transfer may
        still write them): it holds nothing afterwards; `release_blocks` frees them later.
        They lose their prefix-cache keys (their content is unknown)."""
        st = self._reqs.pop(request.request_id, None)
        if st is None:
            return []
        for block in st.blocks:
            if block.ref_cnt == 1:
                self.block_pool.uncache_block(block)
        self._detached.extend(st.blocks)
        return st.blocks

    def release_blocks(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            self._detached.remove(block)
        self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached key; False (nothing changed) while any request holds a block."""
        return self.block_pool.reset_prefix_cache()

    # ---- queries --------------------------------------------------------------------------

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table row (a copy); [] if it holds nothing."""
        st = self._reqs.get(request_id)
        return list(st.block_ids) if st is not None else []

    def block_ids_view(self, request_id: str) -> list[int]:
        """The live block table row (no copy): read it before the next allocation."""
        st = self._reqs.get(request_id)
        return st.block_ids if st is not None else []

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """vLLM's KV usage: 1 - free / (num_blocks - 1)."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        stats = PrefixCacheStats(self._queries, self._hits)
        self._queries = self._hits = 0
        return stats

    def check_integrity(self) -> None:
        """Raise AssertionError on any broken pool or per-request invariant."""
        bs = self.block_size
        for rid, st in self._reqs.items():
            ids = [b.block_id for b in st.blocks]
            assert ids == st.block_ids, f"request {rid!r}: block_ids {st.block_ids} != {ids}"
            assert len(set(ids)) == len(ids), f"request {rid!r} holds a block twice: {ids}"
            assert st.num_slots == len(ids) * bs, f"request {rid!r}: stale num_slots"
            logical = list(range(len(ids))) if st.logical is None else st.logical
            assert len(logical) == len(ids), f"request {rid!r}: logical indices out of step"
            assert logical == sorted(set(logical)), f"request {rid!r}: logical not ascending"
            assert st.evicted_tokens % bs == 0, f"request {rid!r}: partial block evicted"
            num_evicted = st.evicted_tokens // bs
            assert st.logical is not None or num_evicted == 0, f"{rid!r}: evicted, no logical"
            assert not ids or logical[-1] < len(ids) + num_evicted, (
                f"request {rid!r}: logical {logical[-1]} past {len(ids)} held + {num_evicted} "
                "evicted")
            assert st.num_cached_blocks <= len(ids) + num_evicted, f"{rid!r}: cached > held"
            if not self.enable_caching:
                continue
            if st.logical is None:
                assert st.next_full_at == (st.num_cached_blocks + 1) * bs, (
                    f"{rid!r}: next_full_at")
            else:
                assert st.next_full_at == sys.maxsize, f"{rid!r}: caches after an eviction"
            assert st.num_cached_blocks <= len(st.block_hashes), f"{rid!r}: cached > hashed"
            for i, li in enumerate(logical):
                if li >= st.num_cached_blocks:
                    break
                key = st.blocks[i].block_hash
                assert key is None or key == st.block_hashes[li], (
                    f"request {rid!r}: block {ids[i]} at logical index {li} has a foreign key"
                )
        self.block_pool.check_integrity([st.blocks for st in self._reqs.values()]
                                        + [[b] for b in self._detached])
