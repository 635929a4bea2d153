"""BlockPool: every KV block, the LRU free queue and the prefix-cache map (hash -> block).

    blocks[0]              null_block: reserved, never free, never handed out
    free_block_queue       ref_cnt == 0 blocks, head evicted first; a freed block keeps its
                           hash and stays hittable until get_new_blocks() pops and evicts it
    cached_block_hash_to_block   one block per key; a full block whose key is already mapped
                           to another block stays uncached (no duplicates)

The pool knows nothing about requests; `KVCacheManager` decides which blocks each request holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from workbench.core.kv_cache.block import KVCacheBlock
from workbench.core.kv_cache.free_queue import FreeKVCacheBlockQueue
from workbench.core.kv_cache.hashing import BlockHash


class BlockPool:
    """Allocation, reference counting, LRU eviction and caching of `num_blocks` blocks."""

    __slots__ = (
        "num_blocks",
        "enable_caching",
        "blocks",
        "null_block",
        "free_block_queue",
        "cached_block_hash_to_block",
    )

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(
                f"num_blocks ({num_blocks}) must be an integer >= 2 (block 0 is the reserved "
                "null block)"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[1:])
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}

    # ---- lookup and caching ---------------------------------------------------------------

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def find_longest_cache_hit(
        self,
        block_hashes: list[BlockHash],
        token_ids: list[int],
        block_size: int,
        max_blocks: int,
    ) -> list[KVCacheBlock]:
        """Cached blocks for block_hashes[0], [1], ... until the first miss (at most
        `max_blocks`). A block whose stored tokens differ from ours (a hash collision) is a
        miss."""
        cached = self.cached_block_hash_to_block
        hits: list[KVCacheBlock] = []
        for i in range(min(max_blocks, len(block_hashes))):
            block = cached.get(block_hashes[i])
            if block is None or block.token_ids != tuple(
                token_ids[i * block_size : (i + 1) * block_size]
            ):
                break
            hits.append(block)
        return hits

    def cache_full_blocks(
        self,
        blocks: list[KVCacheBlock],
        block_hashes: list[BlockHash],
        token_ids: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
    ) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] their keys (block_hashes[i]).

        A block that already has a key (a prefix-cache hit) is skipped; a key already mapped
        to another block leaves this block uncached.
        """
        cached = self.cached_block_hash_to_block
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None:
                continue
            block_hash = block_hashes[i]
            if block_hash in cached:
                continue
            block.block_hash = block_hash
            block.token_ids = tuple(token_ids[i * block_size : (i + 1) * block_size])
            cached[block_hash] = block

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Drop `block`'s key (it is about to be overwritten with other tokens)."""
        block_hash = block.block_hash
        if block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block_hash) is block:
            del self.cached_block_hash_to_block[block_hash]
        block.reset_hash()

    # ---- allocation and reference counting ------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the free-queue head (evicting their keys); ref_cnt = 1."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(
                f"cannot get {num_blocks} free blocks from the pool "
                f"({self.free_block_queue.num_free_blocks} free)"
            )
        if num_blocks == 1:
            blocks = [self.free_block_queue.popleft()]
        else:
            blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            assert block.ref_cnt == 0, f"free block {block.block_id} has ref_cnt {block.ref_cnt}"
            if block.block_hash is not None:
                self.uncache_block(block)
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a free hit (ref_cnt 0) leaves the queue."""
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 go to the queue tail in the given order."""
        queue = self.free_block_queue
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed more often than taken"
            if block.ref_cnt == 0 and not block.is_null:
                queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Drop every key; refused (False, no change) while any block is held by a request."""
        num_used = self.num_blocks - 1 - self.free_block_queue.num_free_blocks
        if num_used != 0:
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.reset_hash()
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks (all but the null block) held by requests."""
        total = self.num_blocks - 1
        return 1.0 - self.free_block_queue.num_free_blocks / total

    # ---- invariants -----------------------------------------------------------------------

    def check_integrity(self, held: Iterable[list[KVCacheBlock]] | None = None) -> None:
        """Raise AssertionError on any broken pool invariant (tests call this every step).

        `held`: every request's block list; then each ref_cnt must equal its holder count.
        """
        self.free_block_queue.check_integrity()
        queued = self.free_block_queue.get_all_free_blocks()
        queued_ids = {b.block_id for b in queued}
        assert len(queued_ids) == len(queued), "a block appears twice in the free queue"
        null = self.null_block
        assert null.block_id not in queued_ids, "the null block is in the free queue"
        assert null.block_hash is None, "the null block has a prefix-cache key"
        for block in self.blocks[1:]:
            if block.block_id in queued_ids:
                assert block.ref_cnt == 0, (
                    f"block {block.block_id} is in the free queue with ref_cnt {block.ref_cnt}"
                )
            else:
                assert block.ref_cnt > 0, (
                    f"block {block.block_id} is out of the free queue with ref_cnt "
                    f"{block.ref_cnt} (leaked)"
                )
            if block.block_hash is not None:
                assert self.cached_block_hash_to_block.get(block.block_hash) is block, (
                    f"block {block.block_id} has a key that does not map back to it"
                )
                assert block.token_ids is not None, f"cached block {block.block_id} has no tokens"
        for block_hash, block in self.cached_block_hash_to_block.items():
            assert block.block_hash == block_hash, (
                f"cached-map key {block_hash!r} points to block {block.block_id} whose key is "
                f"{block.block_hash!r}"
            )
            assert not block.is_null, "the null block is in the cached map"
        if held is not None:
            holders = Counter(b.block_id for blocks in held for b in blocks)
            assert holders[0] == 0 and null.ref_cnt == 0, "the null block was handed out"
            for block in self.blocks[1:]:
                assert block.ref_cnt == holders[block.block_id], (
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but held by "
                    f"{holders[block.block_id]} request(s)"
                )
