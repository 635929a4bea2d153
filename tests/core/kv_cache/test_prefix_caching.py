"""KVCacheManager prefix caching, vLLM test_prefix_caching.py style: exact ids, keys, order."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

import pytest

from workbench.core.kv_cache import NONE_HASH, KVCacheManager, hash_request_blocks, sha256_hash_fn
from workbench.core.request import Request
from workbench.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int], cache_salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=17), cache_salt=cache_salt)


def tuple_hash(parent, token_ids, extra_keys):  # keys you can read in a failing assert
    return (parent, token_ids, extra_keys)


def free_ids(m: KVCacheManager) -> list[int]:
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def prefill(m: KVCacheManager, req: Request) -> list[int]:
    """Look up, allocate the rest of the prompt, mark it computed (what the scheduler does)."""
    hit, n = m.get_computed_blocks(req)
    new = m.allocate_slots(req, req.num_tokens - n, hit, n)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    m.check_integrity()
    return ids(new)


def test_prefill_hit_and_free_order() -> None:
    m = KVCacheManager(num_blocks=11, block_size=16, hash_fn=tuple_hash)
    common = [i for i in range(3) for _ in range(16)]  # 3 full blocks
    req0 = make_request("0", common + [3] * 7)
    assert m.get_computed_blocks(req0) == ([], 0)
    assert m.allocate_slots(req0, 55) is not None
    assert m.get_block_ids("0") == [1, 2, 3, 4]
    parent = NONE_HASH
    for i, block_id in enumerate((1, 2, 3)):
        block = m.block_pool.blocks[block_id]
        parent = (parent, tuple(common[16 * i : 16 * (i + 1)]), None)
        assert block.block_hash == parent
        assert block.token_ids == tuple([i] * 16)
    assert m.block_pool.blocks[4].block_hash is None  # partial: never cached
    req0.num_computed_tokens = 55

    req1 = make_request("1", common + [5] * 5)
    hit, n = m.get_computed_blocks(req1)
    assert ids(hit) == [1, 2, 3] and n == 48
    assert ids(m.allocate_slots(req1, 5, hit, n)) == [5]
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [2, 2, 2, 1, 1]
    m.check_integrity()

    m.free(req0)  # reversed: 4 reaches 0 first; 3, 2, 1 are still held by req1
    assert free_ids(m) == [6, 7, 8, 9, 10, 4]
    m.free(req1)
    assert free_ids(m) == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]
    assert m.get_block_ids("1") == []
    m.check_integrity()

    # A hit on blocks whose owner finished (ref 0): they leave the free queue.
    req2 = make_request("2", common + [7] * 3)
    hit, n = m.get_computed_blocks(req2)
    assert ids(hit) == [1, 2, 3] and n == 48
    assert ids(m.allocate_slots(req2, 3, hit, n)) == [6]
    assert free_ids(m) == [7, 8, 9, 10, 4, 5]
    assert m.num_free_blocks == 6
    m.check_integrity()


def test_eviction_takes_the_lru_chain_tail() -> None:
    m = KVCacheManager(num_blocks=6, block_size=4, hash_fn=tuple_hash)
    a = make_request("a", list(range(12)))
    assert prefill(m, a) == [1, 2, 3]
    h3 = m.block_pool.blocks[3].block_hash
    m.free(a)
    assert free_ids(m) == [4, 5, 3, 2, 1]
    assert prefill(m, make_request("b", [100] * 8)) == [4, 5]
    assert prefill(m, make_request("c", [200] * 3)) == [3]  # evicts a's last block
    assert h3 not in m.block_pool.cached_block_hash_to_block
    assert m.block_pool.blocks[3].block_hash is None
    hit, n = m.get_computed_blocks(make_request("a2", list(range(13))))
    assert ids(hit) == [1, 2] and n == 8  # the prefix blocks survived
    m.check_integrity()


def test_partial_block_never_cached_and_hit_cap() -> None:
    m = KVCacheManager(num_blocks=8, block_size=4, hash_fn=tuple_hash)
    a = make_request("a", list(range(10)))
    assert prefill(m, a) == [1, 2, 3]
    assert [m.block_pool.blocks[i].block_hash is None for i in (1, 2, 3)] == [False, False, True]
    m.free(a)
    hit, n = m.get_computed_blocks(make_request("b", list(range(10)) + [99] * 6))
    assert ids(hit) == [1, 2] and n == 8  # block 3 was partial, so never hittable
    # A prompt exactly 2 blocks long reuses 1 block: the last token must be recomputed.
    hit, n = m.get_computed_blocks(make_request("c", list(range(8))))
    assert ids(hit) == [1] and n == 4
    hit, n = m.get_computed_blocks(make_request("d", list(range(9))))
    assert ids(hit) == [1, 2] and n == 8


def test_seed_scenario_1530_token_prompt() -> None:
    m = KVCacheManager(num_blocks=200, block_size=16)
    system = [(7 * i) % 1000 for i in range(1530)]
    first = make_request("first", system)
    prefill(m, first)
    m.free(first)
    hit, n = m.get_computed_blocks(make_request("same", list(system)))
    assert len(hit) == 95 and n == 1520  # 1,530 = 95 * 16 + 10: the 10 never fill a block
    question = [5000 + i for i in range(60)]
    req = make_request("with_question", system + question)
    hit, n = m.get_computed_blocks(req)
    assert len(hit) == 95 and n == 1520
    assert req.num_tokens - n == 70  # 10 leftover system tokens + 60 question tokens
    assert ids(hit) == list(range(1, 96))


def test_cache_salt_separates_and_enters_the_first_block_only() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4, hash_fn=tuple_hash)
    tokens = list(range(9))
    a = make_request("a", tokens, cache_salt="s1")
    prefill(m, a)
    t0, t1 = tuple(range(4)), tuple(range(4, 8))
    h0 = (NONE_HASH, t0, ("s1",))
    h1 = (h0, t1, None)
    assert m.block_pool.blocks[1].block_hash == h0
    assert m.block_pool.blocks[2].block_hash == h1
    assert hash_request_blocks(tuple_hash, tokens, 4, "s1") == [h0, h1]
    assert m.get_computed_blocks(make_request("b", tokens, cache_salt="s2")) == ([], 0)
    assert m.get_computed_blocks(make_request("c", tokens)) == ([], 0)
    hit, n = m.get_computed_blocks(make_request("d", tokens, cache_salt="s1"))
    assert ids(hit) == [1, 2] and n == 8
    # Same salt, different first block: still a miss (salt separates, never joins).
    assert m.get_computed_blocks(make_request("e", [9] + tokens[1:], cache_salt="s1")) == ([], 0)


def test_default_sha256_chain_values() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4)
    tokens = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    prefill(m, make_request("a", tokens, cache_salt="salt"))
    h0 = sha256_hash_fn(NONE_HASH, (11, 12, 13, 14), ("salt",))
    h1 = sha256_hash_fn(h0, (15, 16, 17, 18), None)
    assert isinstance(h0, bytes) and len(h0) == 32
    assert [m.block_pool.blocks[i].block_hash for i in (1, 2)] == [h0, h1]
    assert h0 != sha256_hash_fn(NONE_HASH, (11, 12, 13, 14), None)
    assert h0 != sha256_hash_fn(NONE_HASH, (11, 12, 13, 14), ("salt2",))


def test_sha256_encoding_is_pinned() -> None:
    # The canonical encoding, spelled out: a change here silently invalidates stored keys.
    def pack(fmt: str, *values: int) -> bytes:
        return struct.pack(fmt, *values)

    h0_bytes = (b"B" + pack("<I", 32) + NONE_HASH + pack("<I4q", 4, 1, 2, 3, 4)
                + b"U" + pack("<I", 1) + b"S" + pack("<I", 4) + b"salt")
    h0 = hashlib.sha256(h0_bytes).digest()
    h1 = hashlib.sha256(b"B" + pack("<I", 32) + h0 + pack("<I4q", 4, 5, 6, 7, 8) + b"N").digest()
    assert NONE_HASH == hashlib.sha256(b"workbench.kv_cache.NONE_HASH").digest()
    assert sha256_hash_fn(NONE_HASH, (1, 2, 3, 4), ("salt",)) == h0
    assert sha256_hash_fn(h0, (5, 6, 7, 8), None) == h1
    assert h1.hex() == "395ad7bd4e83b4c3ab25b1ca587989c5dc60019974a3fe5437aa4c9e17d25608"
    assert hash_request_blocks(sha256_hash_fn, list(range(1, 10)), 4, "salt") == [h0, h1]


def test_sha256_is_deterministic_across_processes() -> None:
    code = (
        "from workbench.core.kv_cache.hashing import NONE_HASH, sha256_hash_fn;"
        "print(sha256_hash_fn(NONE_HASH, (1, 2, 3), ('salt',)).hex())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == sha256_hash_fn(NONE_HASH, (1, 2, 3), ("salt",)).hex()


def test_hash_collision_is_a_miss() -> None:
    def weak_hash(parent, token_ids, extra_keys):  # ignores token values: collides
        return (parent, len(token_ids))

    m = KVCacheManager(num_blocks=10, block_size=4, hash_fn=weak_hash)
    prefill(m, make_request("a", [1, 2, 3, 4, 5]))
    assert m.get_computed_blocks(make_request("b", [9, 9, 9, 9, 5])) == ([], 0)
    hit, n = m.get_computed_blocks(make_request("c", [1, 2, 3, 4, 5]))
    assert ids(hit) == [1] and n == 4


def test_duplicate_full_block_stays_uncached() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4, hash_fn=tuple_hash)
    a = make_request("a", list(range(8)))
    prefill(m, a)
    m.free(a)
    # The hit cap makes b recompute block 2's tokens into a fresh block; its key is already
    # mapped (to a's free block 2), so the fresh block stays uncached.
    b = make_request("b", list(range(8)))
    assert prefill(m, b) == [3]
    assert m.get_block_ids("b") == [1, 3]
    assert m.block_pool.blocks[3].block_hash is None
    h0 = (NONE_HASH, (0, 1, 2, 3), None)
    assert m.block_pool.cached_block_hash_to_block == {
        h0: m.block_pool.blocks[1],
        (h0, (4, 5, 6, 7), None): m.block_pool.blocks[2],
    }
    m.check_integrity()
    hit, n = m.get_computed_blocks(make_request("c", list(range(9))))
    assert ids(hit) == [1, 2] and n == 8


def test_prefix_cache_stats() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4)
    prefill(m, make_request("a", list(range(10))))
    prefill(m, make_request("b", list(range(12))))
    assert m.make_prefix_cache_stats() == (22, 8)
    assert m.make_prefix_cache_stats() == (0, 0)
    off = KVCacheManager(num_blocks=10, block_size=4, enable_caching=False)
    prefill(off, make_request("a", list(range(10))))
    assert off.get_computed_blocks(make_request("b", list(range(10)))) == ([], 0)
    assert off.make_prefix_cache_stats() == (0, 0)
    assert all(b.block_hash is None for b in off.block_pool.blocks)


def test_reset_prefix_cache() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(10)))
    prefill(m, a)
    assert m.reset_prefix_cache() is False
    assert len(m.block_pool.cached_block_hash_to_block) == 2
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert m.block_pool.cached_block_hash_to_block == {}
    assert m.get_computed_blocks(make_request("b", list(range(10)))) == ([], 0)
    m.check_integrity()


def test_decode_caches_a_block_when_it_fills_and_lookahead_is_never_cached() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4, hash_fn=tuple_hash)
    a = make_request("a", list(range(5)))
    assert prefill(m, a) == [1, 2]
    a.append_output_token_ids([5])
    assert m.allocate_slots(a, 1, num_lookahead_tokens=2) == []  # 5 + 1 + 2 <= 8 slots
    a.num_computed_tokens += 1
    a.append_output_token_ids([6])
    assert ids(m.allocate_slots(a, 1, num_lookahead_tokens=2)) == [3]  # 6 + 1 + 2 > 8
    assert m.block_pool.blocks[2].block_hash is None  # 7 tokens: block 2 not full yet
    a.num_computed_tokens += 1
    a.append_output_token_ids([7])
    assert m.allocate_slots(a, 1, num_lookahead_tokens=2) == []
    h0 = (NONE_HASH, (0, 1, 2, 3), None)
    assert m.block_pool.blocks[2].block_hash == (h0, (4, 5, 6, 7), None)
    assert m.block_pool.blocks[3].block_hash is None  # only lookahead slots: never cached
    m.check_integrity()


def test_decode_step_that_fills_a_block_caches_it() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4, hash_fn=tuple_hash)
    a = make_request("a", list(range(6)))
    assert prefill(m, a) == [1, 2]
    for token in (6, 7):  # position 6, then position 7 fills block 2: no new block either time
        a.append_output_token_ids([token])
        assert m.allocate_slots(a, 1) == []
        a.num_computed_tokens += 1
    h0 = (NONE_HASH, (0, 1, 2, 3), None)
    assert m.block_pool.blocks[2].block_hash == (h0, (4, 5, 6, 7), None)
    hit, n = m.get_computed_blocks(make_request("b", list(range(9))))
    assert ids(hit) == [1, 2] and n == 8
    m.check_integrity()


def test_allocate_none_changes_nothing() -> None:
    m = KVCacheManager(num_blocks=6, block_size=4)
    a = make_request("a", list(range(12)))
    prefill(m, a)
    m.free(a)  # blocks 1..3 are cached with ref 0: hits on them are evictable
    b = make_request("b", list(range(12)) + [50] * 12)
    hit, n = m.get_computed_blocks(b)
    assert ids(hit) == [1, 2, 3]
    before = (free_ids(m), [x.ref_cnt for x in m.block_pool.blocks],
              dict(m.block_pool.cached_block_hash_to_block), m.get_block_ids("b"))
    # 3 hits leave the queue + 3 new blocks = 6 > 5 free.
    assert m.allocate_slots(b, 12, hit, n) is None
    after = (free_ids(m), [x.ref_cnt for x in m.block_pool.blocks],
             dict(m.block_pool.cached_block_hash_to_block), m.get_block_ids("b"))
    assert before == after
    assert m.num_free_blocks == 5 and m.usage == 0.0
    m.check_integrity()
    assert m.allocate_slots(b, 9, hit, n) is None  # still 3 + 3 > 5
    assert m.allocate_slots(b, 4, hit, n) is not None  # 3 hits + 1 new = 4 <= 5
    assert m.get_block_ids("b") == [1, 2, 3, 4] and m.usage == 0.8
    m.check_integrity()


def test_argument_errors() -> None:
    m = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(10)))
    prefill(m, a)
    m.free(a)
    b = make_request("b", list(range(10)))
    hit, n = m.get_computed_blocks(b)
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        m.allocate_slots(b, 2, hit, n - 1)
    with pytest.raises(ValueError, match=">= 0"):
        m.allocate_slots(b, -1)
    assert m.allocate_slots(make_request("c", [0] * 32), 32) is not None  # evicts block 2
    with pytest.raises(ValueError, match="no longer the cached block"):
        m.allocate_slots(b, 2, hit, n)
    stale = make_request("d", list(range(10)))
    stale.num_computed_tokens = 8
    with pytest.raises(ValueError, match="owns only 0 blocks"):
        m.allocate_slots(stale, 1)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(num_blocks=10, block_size=0)
