"""KVCacheManager.evict_blocks (KV compression's hook): exact block ids, keys, ref counts,
the compacted table's offset, prefix-cache rules, preemption (free) and refusals."""

from __future__ import annotations

import pytest

from workbench.core.kv_cache import NONE_HASH, KVCacheManager
from workbench.core.request import Request
from workbench.sampling_params import SamplingParams

BS = 4


def tuple_hash(parent, token_ids, extra_keys):  # readable keys
    return (parent, token_ids, extra_keys)


def key(tokens: list[int], num_blocks: int):
    """The chained key of block num_blocks - 1 of `tokens`."""
    parent = NONE_HASH
    for i in range(num_blocks):
        parent = (parent, tuple(tokens[i * BS:(i + 1) * BS]), None)
    return parent


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=16))


def free_ids(m: KVCacheManager) -> list[int]:
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def prefill(m: KVCacheManager, req: Request) -> None:
    hit, n = m.get_computed_blocks(req)
    assert m.allocate_slots(req, req.num_tokens - n, hit, n) is not None
    req.num_computed_tokens = req.num_tokens
    m.check_integrity()


TOKENS = list(range(100, 120))  # 20 tokens: 5 full blocks of 4


def test_evict_middle_blocks_exact_ids_keys_and_offset() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    r = make_request("r", TOKENS)
    prefill(m, r)
    assert m.get_block_ids("r") == [1, 2, 3, 4, 5]
    pool = m.block_pool.blocks
    assert [pool[i].block_hash for i in (1, 2, 3, 4, 5)] == [key(TOKENS, n) for n in range(1, 6)]
    assert m.evict_blocks(r, [1, 2]) == 2
    m.check_integrity()
    assert m.get_block_ids("r") == [1, 4, 5]
    assert m.kept_logical_blocks("r") == [0, 3, 4]
    assert m.num_evicted_tokens("r") == 8
    assert m.num_evicted_blocks == 2
    # the evicted blocks lost their keys and are free (tail of the queue); the kept keep theirs
    assert pool[2].block_hash is None and pool[3].block_hash is None
    assert pool[2].ref_cnt == 0 and pool[3].ref_cnt == 0
    assert free_ids(m) == [6, 7, 8, 9, 10, 11, 2, 3]
    assert [pool[i].block_hash for i in (1, 4, 5)] == [key(TOKENS, 1), key(TOKENS, 4),
                                                       key(TOKENS, 5)]
    assert set(m.block_pool.cached_block_hash_to_block) == {key(TOKENS, n) for n in (1, 4, 5)}
    # decode: logical position 20 -> row slot 12 -> a fresh block (logical 5), never cached
    r.all_token_ids.extend([7, 7, 7, 7])
    assert [b.block_id for b in m.allocate_slots(r, 4)] == [6]
    r.num_computed_tokens = 24
    m.check_integrity()
    assert m.get_block_ids("r") == [1, 4, 5, 6]
    assert m.kept_logical_blocks("r") == [0, 3, 4, 5]
    assert pool[6].block_hash is None  # full, but filled after an eviction
    r.all_token_ids.append(7)
    assert [b.block_id for b in m.allocate_slots(r, 1)] == [7]  # logical 6 at row slot 16
    assert m.kept_logical_blocks("r") == [0, 3, 4, 5, 6]


def test_prefix_cache_never_serves_evicted_or_post_eviction_blocks() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    r = make_request("r", TOKENS)
    prefill(m, r)
    m.evict_blocks(r, [1, 2])
    r.all_token_ids.extend([7, 7, 7, 7, 7])
    assert m.allocate_slots(r, 4) is not None
    r.num_computed_tokens = 24
    m.free(r)
    m.check_integrity()
    # another request with the same 25 tokens hits block 0 only: logical 1 is uncached, so
    # the chain breaks there although blocks 4, 5 (logical 3, 4) still hold their keys
    other = make_request("o", TOKENS + [7, 7, 7, 7, 7])
    hit, n = m.get_computed_blocks(other)
    assert [b.block_id for b in hit] == [1] and n == 4
    # the post-eviction block 6 (logical 5) was never offered
    assert key(TOKENS + [7] * 4, 6) not in m.block_pool.cached_block_hash_to_block
    # the kept blocks' keys stay valid: their KV was computed over the full prefix
    assert m.block_pool.get_cached_block(key(TOKENS, 4)).block_id == 4


def test_eviction_before_a_block_fills_stops_caching() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    r = make_request("r", TOKENS[:10])  # blocks 0, 1 full (cached), 2 partial
    prefill(m, r)
    m.evict_blocks(r, [1])
    r.all_token_ids.extend([7, 7])
    assert m.allocate_slots(r, 2) == []  # the partial block (logical 2) fills
    r.num_computed_tokens = 12
    m.check_integrity()
    assert m.block_pool.blocks[3].block_hash is None
    assert list(m.block_pool.cached_block_hash_to_block) == [key(TOKENS, 1)]


def test_shared_prefix_blocks_only_lose_this_requests_reference() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    a = make_request("a", TOKENS[:16])
    prefill(m, a)
    assert m.get_block_ids("a") == [1, 2, 3, 4]
    b = make_request("b", TOKENS[:16] + [9, 9, 9, 9])
    prefill(m, b)  # hits (20 - 1) // 4 = 4 blocks
    assert m.get_block_ids("b") == [1, 2, 3, 4, 5]
    pool = m.block_pool.blocks
    assert [pool[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [2, 2, 2, 2, 1]
    num_free = m.num_free_blocks
    m.evict_blocks(b, [1, 2])
    m.check_integrity()
    assert m.get_block_ids("b") == [1, 4, 5]
    assert m.get_block_ids("a") == [1, 2, 3, 4]  # untouched
    assert [pool[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [2, 1, 1, 2, 1]
    assert m.num_free_blocks == num_free  # nothing freed under a
    assert pool[2].block_hash == key(TOKENS, 2) and pool[3].block_hash == key(TOKENS, 3)
    m.free(a)
    m.check_integrity()
    assert pool[2].ref_cnt == 0 and pool[2].block_hash == key(TOKENS, 2)  # a's, valid


def test_free_after_eviction_then_restart_uncompressed() -> None:
    """Preemption by recompute: free() releases the kept blocks; the request starts again
    with no offset and a plain table."""
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash, enable_caching=False)
    r = make_request("r", TOKENS)
    prefill(m, r)
    m.evict_blocks(r, [1, 2, 3])
    assert m.get_block_ids("r") == [1, 5]
    m.free(r)
    r.num_computed_tokens = 0
    m.check_integrity()
    assert m.num_free_blocks == 11
    assert m.num_evicted_tokens("r") == 0 and m.kept_logical_blocks("r") == []
    prefill(m, r)
    assert m.kept_logical_blocks("r") == [0, 1, 2, 3, 4]
    assert m.num_evicted_tokens("r") == 0


def test_free_with_num_valid_tokens_uses_logical_positions() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    r = make_request("r", TOKENS)
    prefill(m, r)
    m.evict_blocks(r, [1])
    m.free(r, num_valid_tokens=16)  # logical blocks >= 4 (block 5) lose their keys
    pool = m.block_pool.blocks
    assert [pool[i].block_hash is not None for i in (1, 3, 4, 5)] == [True, True, True, False]


def test_refusals() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    r = make_request("r", TOKENS[:10])
    prefill(m, r)
    with pytest.raises(ValueError, match=r"logical block 2 of request 'r' is not full and "
                                         r"written \(num_computed_tokens 10"):
        m.evict_blocks(r, [2])
    m.evict_blocks(r, [1])
    with pytest.raises(ValueError, match=r"does not hold logical block 1 \(holds \[0, 2\]\)"):
        m.evict_blocks(r, [1])
    with pytest.raises(ValueError, match="holds no blocks"):
        m.evict_blocks(make_request("x", [1]), [0])
    child = make_request("c", TOKENS[:10])
    with pytest.raises(ValueError, match="has evicted blocks"):
        m.fork(r, child)
    assert m.evict_blocks(r, []) == 0


def test_layer_drop_positions_follow_compaction() -> None:
    m = KVCacheManager(num_blocks=12, block_size=BS, hash_fn=tuple_hash)
    r = make_request("r", TOKENS)
    prefill(m, r)
    m.set_layer_drop(r, [[1, 3], [2]])
    assert m.layer_drop_positions("r") == [[1, 3], [2]]
    m.evict_blocks(r, [2])  # kept [0, 1, 3, 4]: layer 1's drop of block 2 is gone
    assert m.layer_drop("r") == [[1, 3], []]
    assert m.layer_drop_positions("r") == [[1, 2], []]
    with pytest.raises(ValueError, match=r"layer 0 drops logical block\(s\) \[2\]"):
        m.set_layer_drop(r, [[2], []])
