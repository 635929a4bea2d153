"""Copy-on-write for n > 1 sampling: only a shared block that is written into is copied."""

from __future__ import annotations

import pytest

from workbench.core.kv_cache import KVCacheManager
from workbench.core.request import Request
from workbench.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=17))


def refs(m: KVCacheManager, *block_ids: int) -> list[int]:
    return [m.block_pool.blocks[i].ref_cnt for i in block_ids]


def run_prefill(m: KVCacheManager, req: Request) -> None:
    assert m.allocate_slots(req, req.num_tokens) is not None
    req.num_computed_tokens = req.num_tokens


def fork_child(m: KVCacheManager, parent: Request, rid: str, first_token: int) -> Request:
    """A child with the parent's computed tokens plus its own sampled token."""
    child = make_request(rid, parent.all_token_ids[: parent.num_computed_tokens])
    child.num_computed_tokens = parent.num_computed_tokens
    m.fork(parent, child)
    child.append_output_token_ids([first_token])
    return child


def test_first_writer_copies_second_writes_in_place() -> None:
    m = KVCacheManager(num_blocks=8, block_size=4)
    parent = make_request("p", [1, 2, 3, 4, 5, 6])  # | 1 2 3 4 | 5 6 _ _ |
    run_prefill(m, parent)
    assert m.get_block_ids("p") == [1, 2]
    child = fork_child(m, parent, "c", first_token=70)
    parent.append_output_token_ids([60])
    assert m.get_block_ids("c") == [1, 2] and refs(m, 1, 2) == [2, 2]
    m.check_integrity()

    # The child writes position 6 into shared block 2: fresh block 3, copy 2 -> 3.
    assert m.allocate_slots(child, 1) == []
    assert m.get_block_ids("c") == [1, 3]
    assert refs(m, 1, 2, 3) == [2, 1, 1]
    assert m.take_copy_ops() == [(2, 3)]
    assert m.take_copy_ops() == []
    # The parent is now block 2's only holder: it writes in place, nothing copied.
    assert m.allocate_slots(parent, 1) == []
    assert m.get_block_ids("p") == [1, 2]
    assert m.take_copy_ops() == []
    m.check_integrity()

    m.free(parent)
    m.free(child)
    assert m.num_free_blocks == 7 and refs(m, 1, 2, 3) == [0, 0, 0]
    m.check_integrity()


def test_full_shared_blocks_are_never_copied() -> None:
    m = KVCacheManager(num_blocks=8, block_size=4)
    parent = make_request("p", list(range(8)))  # two full blocks
    run_prefill(m, parent)
    child = fork_child(m, parent, "c", first_token=80)
    parent.append_output_token_ids([90])
    assert [b.block_id for b in m.allocate_slots(child, 1)] == [3]
    assert [b.block_id for b in m.allocate_slots(parent, 1)] == [4]
    assert m.take_copy_ops() == []
    assert m.get_block_ids("c") == [1, 2, 3] and m.get_block_ids("p") == [1, 2, 4]
    assert refs(m, 1, 2, 3, 4) == [2, 2, 1, 1]
    m.check_integrity()
    m.free(child)
    m.free(parent)
    assert m.num_free_blocks == 7
    m.check_integrity()


def test_three_way_share_copies_twice() -> None:
    m = KVCacheManager(num_blocks=8, block_size=4)
    parent = make_request("p", [1, 2, 3, 4, 5])
    run_prefill(m, parent)
    c1 = fork_child(m, parent, "c1", 11)
    c2 = fork_child(m, parent, "c2", 12)
    parent.append_output_token_ids([10])
    assert refs(m, 1, 2) == [3, 3]
    for req in (c1, c2, parent):
        m.allocate_slots(req, 1)
    assert m.take_copy_ops() == [(2, 3), (2, 4)]
    assert [m.get_block_ids(r) for r in ("c1", "c2", "p")] == [[1, 3], [1, 4], [1, 2]]
    assert refs(m, 1, 2, 3, 4) == [3, 1, 1, 1]
    for req in (c1, c2, parent):
        m.free(req)
    assert m.num_free_blocks == 7
    m.check_integrity()


def test_scheduler_style_child_recomputes_last_prompt_token() -> None:
    # The child re-runs the last prompt token (its own first sample), so it writes position
    # P-1 into the shared last block; the partial block's KV there is copied first.
    m = KVCacheManager(num_blocks=8, block_size=4)
    parent = make_request("p", [1, 2, 3, 4, 5, 6])
    run_prefill(m, parent)
    parent.append_output_token_ids([60])
    child = make_request("p#1", [1, 2, 3, 4, 5, 6])
    m.fork(parent, child)
    child.num_computed_tokens = 5
    assert m.allocate_slots(child, 1) == []
    assert m.take_copy_ops() == [(2, 3)]
    assert m.get_block_ids("p#1") == [1, 3]
    m.check_integrity()


def test_cow_counts_in_the_free_check() -> None:
    m = KVCacheManager(num_blocks=4, block_size=4)
    parent = make_request("p", list(range(10)))  # 3 blocks: the pool is full
    run_prefill(m, parent)
    child = fork_child(m, parent, "c", 99)
    before = (refs(m, 1, 2, 3), m.get_block_ids("c"), m.num_free_blocks)
    assert m.allocate_slots(child, 1) is None  # needs a CoW block, none free
    assert (refs(m, 1, 2, 3), m.get_block_ids("c"), m.num_free_blocks) == before
    assert m.take_copy_ops() == []
    m.free(parent)  # the child is now the only holder of blocks 1..3
    assert m.allocate_slots(child, 1) == []
    assert m.take_copy_ops() == []
    m.check_integrity()


def test_fork_errors() -> None:
    m = KVCacheManager(num_blocks=8, block_size=4)
    parent = make_request("p", [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="holds no blocks"):
        m.fork(parent, make_request("c", [1, 2, 3, 4, 5]))
    run_prefill(m, parent)
    with pytest.raises(ValueError, match="differ"):
        m.fork(parent, make_request("c", [1, 2, 9, 4, 5]))
    child = make_request("c", [1, 2, 3, 4, 5])
    m.fork(parent, child)
    with pytest.raises(ValueError, match="already holds blocks"):
        m.fork(parent, child)
    m.check_integrity()


def test_sole_held_cached_block_with_other_tokens_loses_its_key() -> None:
    # Fork between the parent's allocate_slots and its num_computed_tokens update: the
    # child shares block 2, already cached with the parent's tokens 5 6 7 8; after the parent
    # is freed the child writes 99 at position 6 in place, so block 2 must drop that key.
    m = KVCacheManager(num_blocks=8, block_size=4)
    parent = make_request("p", [1, 2, 3, 4, 5, 6, 7, 8])
    assert m.allocate_slots(parent, 6) is not None
    parent.num_computed_tokens = 6
    assert m.allocate_slots(parent, 2) == []  # caches block 2 (tokens 5..8)
    key2 = m.block_pool.blocks[2].block_hash
    assert key2 is not None
    child = make_request("c", [1, 2, 3, 4, 5, 6, 99])
    child.num_computed_tokens = 6
    m.fork(parent, child)
    m.free(parent)
    assert m.allocate_slots(child, 1) == []
    assert m.take_copy_ops() == []
    assert m.block_pool.blocks[2].block_hash is None
    assert key2 not in m.block_pool.cached_block_hash_to_block
    hit, n = m.get_computed_blocks(make_request("q", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert [b.block_id for b in hit] == [1] and n == 4
    m.check_integrity()
