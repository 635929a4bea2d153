"""BlockPool: null block, allocation order, touch / free / eviction, caching, reset, usage."""

from __future__ import annotations

import pytest

from workbench.core.kv_cache.block_pool import BlockPool


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_null_block_is_reserved() -> None:
    pool = BlockPool(5)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert free_ids(pool) == [1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 4
    assert [b.block_id for b in pool.get_new_blocks(4)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot get 1 free blocks"):
        pool.get_new_blocks(1)
    pool.check_integrity()


def test_num_blocks_validation() -> None:
    with pytest.raises(ValueError, match="must be an integer >= 2"):
        BlockPool(1)


def test_get_new_blocks_sets_ref_and_free_blocks_appends_in_order() -> None:
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [4, 5, 3, 2, 1]
    assert [b.ref_cnt for b in blocks] == [0, 0, 0]
    pool.check_integrity()


def test_touch_takes_free_hits_out_of_the_queue() -> None:
    pool = BlockPool(6)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a, b])
    assert free_ids(pool) == [3, 4, 5, 1, 2]
    pool.touch([a])  # ref 0 -> leaves the queue
    assert a.ref_cnt == 1 and free_ids(pool) == [3, 4, 5, 2]
    pool.touch([a])  # already held: only the count changes
    assert a.ref_cnt == 2 and pool.get_num_free_blocks() == 4
    pool.free_blocks([a])
    assert a.ref_cnt == 1 and 1 not in free_ids(pool)
    pool.free_blocks([a])
    assert free_ids(pool) == [3, 4, 5, 2, 1]
    pool.check_integrity()


def test_cache_full_blocks_and_eviction_from_the_head() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    tokens = list(range(10))
    pool.cache_full_blocks(blocks, ["h0", "h1"], tokens, 0, 2, 4)  # type: ignore[list-item]
    assert [b.block_hash for b in blocks] == ["h0", "h1", None]
    assert blocks[0].token_ids == (0, 1, 2, 3) and blocks[1].token_ids == (4, 5, 6, 7)
    assert pool.get_cached_block("h1") is blocks[1]  # type: ignore[arg-type]
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [3, 2, 1]
    pool.check_integrity()
    # Block 3 (uncached) goes first, then block 2, whose key is evicted.
    assert [b.block_id for b in pool.get_new_blocks(2)] == [3, 2]
    assert blocks[1].block_hash is None and blocks[1].token_ids is None
    assert pool.cached_block_hash_to_block == {"h0": blocks[0]}
    pool.check_integrity()


def test_duplicate_key_leaves_the_second_block_uncached() -> None:
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], ["h"], [1, 2], 0, 1, 2)  # type: ignore[list-item]
    pool.cache_full_blocks([b], ["h"], [1, 2], 0, 1, 2)  # type: ignore[list-item]
    assert a.block_hash == "h" and b.block_hash is None
    assert pool.cached_block_hash_to_block == {"h": a}
    pool.check_integrity()


def test_reset_prefix_cache_refused_while_held() -> None:
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([a], ["h"], [1, 2], 0, 1, 2)  # type: ignore[list-item]
    assert pool.reset_prefix_cache() is False
    assert a.block_hash == "h" and pool.cached_block_hash_to_block == {"h": a}
    pool.free_blocks([a])
    assert pool.reset_prefix_cache() is True
    assert a.block_hash is None and pool.cached_block_hash_to_block == {}
    pool.check_integrity()


def test_usage() -> None:
    pool = BlockPool(5)
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(1)
    assert pool.get_usage() == 0.25
    pool.get_new_blocks(3)
    assert pool.get_usage() == 1.0


def test_check_integrity_catches_leaks_and_bad_map_entries() -> None:
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    a.ref_cnt = 0  # out of the queue with no reference: leaked
    with pytest.raises(AssertionError, match="leaked"):
        pool.check_integrity()
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cached_block_hash_to_block["x"] = a  # type: ignore[index]
    with pytest.raises(AssertionError, match="cached-map key"):
        pool.check_integrity()
