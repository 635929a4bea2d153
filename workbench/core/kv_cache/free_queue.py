"""FreeKVCacheBlockQueue: the LRU free list of blocks, a doubly linked list through the blocks.

    fake_head <-> b_lru <-> ... <-> b_mru <-> fake_tail
       popleft() takes b_lru (eviction candidate); append() puts a freed block after b_mru;
       remove(b) unlinks a prefix-cache hit from anywhere in O(1).

The links live on the blocks themselves (`prev_free_block`, `next_free_block`), as in vLLM,
so no per-operation allocation happens. A block is in the queue iff both links are set.
"""

from __future__ import annotations

from collections.abc import Iterable

from workbench.core.kv_cache.block import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: head = evicted first, tail = evicted last."""

    __slots__ = ("num_free_blocks", "fake_free_list_head", "fake_free_list_tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        """Take the least recently freed block (the head)."""
        head = self.fake_free_list_head
        block = head.next_free_block
        if block is self.fake_free_list_tail or block is None:
            raise ValueError("no free blocks available")
        nxt = block.next_free_block
        if nxt is None:
            raise RuntimeError(f"free block {block.block_id} has no next link: queue corrupted")
        head.next_free_block = nxt
        nxt.prev_free_block = head
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take `n` blocks from the head in order; ValueError (and no change) if fewer exist."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} free blocks but only {self.num_free_blocks} exist")
        if n == 0:
            return []
        head = self.fake_free_list_head
        out: list[KVCacheBlock] = []
        block = head.next_free_block
        for _ in range(n):
            assert block is not None
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            out.append(block)
            block = nxt
        assert block is not None  # n <= num_free_blocks: at worst the fake tail
        head.next_free_block = block
        block.prev_free_block = head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it sits in the queue."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() of block {block.block_id}, which is not in the queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail (evicted last)."""
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise RuntimeError(f"append() of block {block.block_id}, which is already queued")
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = tail
        tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append each block in order (the first given is evicted first)."""
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Free blocks head to tail (for tests and integrity checks; O(n))."""
        out: list[KVCacheBlock] = []
        block = self.fake_free_list_head.next_free_block
        while block is not None and block is not self.fake_free_list_tail:
            out.append(block)
            block = block.next_free_block
        return out

    def check_integrity(self) -> None:
        """Raise AssertionError unless the links are consistent and the length is right."""
        head, tail = self.fake_free_list_head, self.fake_free_list_tail
        assert head.prev_free_block is None, "fake head has a prev link"
        assert tail.next_free_block is None, "fake tail has a next link"
        count = 0
        prev = head
        block = head.next_free_block
        while block is not tail:
            assert block is not None, f"free list broken after block {prev.block_id}"
            assert block.prev_free_block is prev, (
                f"block {block.block_id}.prev_free_block is not block {prev.block_id}"
            )
            count += 1
            assert count <= self.num_free_blocks, (
                f"free list is longer than num_free_blocks ({self.num_free_blocks}) or cyclic"
            )
            prev, block = block, block.next_free_block
        assert tail.prev_free_block is prev, "fake tail's prev link is not the last block"
        assert count == self.num_free_blocks, (
            f"free list holds {count} blocks but num_free_blocks is {self.num_free_blocks}"
        )
