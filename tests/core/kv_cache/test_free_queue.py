"""FreeKVCacheBlockQueue: order of popleft / append / remove, and its integrity check."""

from __future__ import annotations

import pytest

from workbench.core.kv_cache.block import KVCacheBlock
from workbench.core.kv_cache.free_queue import FreeKVCacheBlockQueue


def ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def make(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def test_initial_order_and_links() -> None:
    blocks, q = make(4)
    assert ids(q) == [0, 1, 2, 3]
    assert q.num_free_blocks == 4
    assert q.fake_free_list_head.next_free_block is blocks[0]
    assert blocks[0].prev_free_block is q.fake_free_list_head
    assert blocks[3].next_free_block is q.fake_free_list_tail
    assert q.fake_free_list_tail.prev_free_block is blocks[3]
    q.check_integrity()


def test_popleft_takes_head_and_unlinks() -> None:
    blocks, q = make(3)
    b = q.popleft()
    assert b is blocks[0]
    assert b.prev_free_block is None and b.next_free_block is None
    assert ids(q) == [1, 2] and q.num_free_blocks == 2
    q.check_integrity()


def test_remove_from_middle_head_and_tail() -> None:
    blocks, q = make(5)
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4]
    q.remove(blocks[0])
    q.remove(blocks[4])
    assert ids(q) == [1, 3]
    assert q.num_free_blocks == 2
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    q.check_integrity()


def test_append_goes_to_tail_in_order() -> None:
    blocks, q = make(4)
    a, b = q.popleft(), q.popleft()
    q.append(b)
    q.append(a)
    assert ids(q) == [2, 3, 1, 0]
    q.remove(blocks[3])
    q.append_n([blocks[3]])
    assert ids(q) == [2, 1, 0, 3]
    q.check_integrity()


def test_popleft_n_and_empty() -> None:
    blocks, q = make(4)
    assert [b.block_id for b in q.popleft_n(0)] == []
    assert [b.block_id for b in q.popleft_n(3)] == [0, 1, 2]
    assert ids(q) == [3] and q.num_free_blocks == 1
    with pytest.raises(ValueError):
        q.popleft_n(2)
    assert ids(q) == [3]
    q.popleft()
    assert ids(q) == [] and q.num_free_blocks == 0
    with pytest.raises(ValueError, match="no free blocks"):
        q.popleft()
    q.append(blocks[1])
    assert ids(q) == [1]
    q.check_integrity()


def test_remove_or_append_twice_is_an_error() -> None:
    blocks, q = make(2)
    b = q.popleft()
    with pytest.raises(RuntimeError, match="not in the queue"):
        q.remove(b)
    with pytest.raises(RuntimeError, match="already queued"):
        q.append(blocks[1])
    q.check_integrity()


def test_check_integrity_catches_broken_links_and_length() -> None:
    blocks, q = make(3)
    blocks[2].prev_free_block = blocks[0]
    with pytest.raises(AssertionError, match="prev_free_block"):
        q.check_integrity()
    blocks, q = make(3)
    q.num_free_blocks = 4
    with pytest.raises(AssertionError, match="num_free_blocks"):
        q.check_integrity()
