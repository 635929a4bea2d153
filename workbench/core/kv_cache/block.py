"""KVCacheBlock: the CPU-side record of one physical KV block (the GPU tensor lives elsewhere).

Owned by `BlockPool`; `FreeKVCacheBlockQueue` threads free blocks through `prev_free_block` /
`next_free_block`, so taking a block out of the middle of the free list is O(1).
"""

from __future__ import annotations

from workbench.core.kv_cache.hashing import BlockHash


class KVCacheBlock:
    """One block of `block_size` token slots.

    block_id: index into the KV tensor's block dimension (0 is the reserved null block).
    ref_cnt: how many requests' block lists hold this block (0 = free, possibly still cached).
    block_hash: prefix-cache key once the block is full and cached, else None.
    token_ids: the block's token ids, stored with the hash so a hit can be double-checked.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "token_ids",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def reset_hash(self) -> None:
        """Forget the prefix-cache identity (the block is about to be overwritten)."""
        self.block_hash = None
        self.token_ids = None

    def __repr__(self) -> str:
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"block_hash={self.block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )
