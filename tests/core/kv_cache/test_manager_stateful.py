"""Random schedules against KVCacheManager, with a model of what every KV slot holds.

The model writes, for each computed position, (cache_salt, all tokens up to it) into the slot
the request's block table points at, and applies copy ops before writing. So a wrong prefix
hit, a write into a shared block or a lost copy shows up as a request reading the wrong KV.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.hypothesis_profiles import examples
from workbench.core.kv_cache import KVCacheManager
from workbench.core.request import Request
from workbench.sampling_params import SamplingParams

MAX_TOKENS = 24
PARAMS = SamplingParams(max_tokens=MAX_TOKENS)


def tuple_hash(parent, token_ids, extra_keys):
    return (parent, token_ids, extra_keys)


def unroll(key: tuple) -> tuple[str | None, list[int]]:
    """(cache_salt, all tokens up to the block's end) from a tuple_hash key."""
    parts: list[tuple[int, ...]] = []
    salt = None
    while isinstance(key, tuple):
        key, token_ids, extra = key
        parts.append(token_ids)
        salt = extra[0] if extra else None
    return salt, [t for part in reversed(parts) for t in part]


class KVCacheMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(2, 12),
        block_size=st.sampled_from([1, 2, 4]),
        caching=st.booleans(),
        sha=st.booleans(),
    )
    def setup(self, num_blocks: int, block_size: int, caching: bool, sha: bool) -> None:
        self.bs = block_size
        self.m = KVCacheManager(
            num_blocks, block_size, enable_caching=caching, hash_fn=None if sha else tuple_hash
        )
        self.kv: list[list[object]] = [[None] * block_size for _ in range(num_blocks)]
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.next_id = 0

    # ---- helpers ------------------------------------------------------------------------

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    def _snapshot(self) -> tuple:
        pool = self.m.block_pool
        return (
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks],
            dict(pool.cached_block_hash_to_block),
            {r.request_id: self.m.get_block_ids(r.request_id) for r in self.all_requests()},
        )

    def all_requests(self) -> list[Request]:
        return self.waiting + self.running

    def _allocate_and_run(
        self, req: Request, num_new: int, hit: list, n_hit: int, lookahead: int
    ) -> bool:
        """allocate_slots + what the model runner does (copies, then KV writes)."""
        before = self._snapshot()
        new = self.m.allocate_slots(req, num_new, hit, n_hit, num_lookahead_tokens=lookahead)
        if new is None:
            assert self._snapshot() == before, "allocate_slots returned None but changed state"
            assert self.m.take_copy_ops() == []
            return False
        for src, dst in self.m.take_copy_ops():
            self.kv[dst] = list(self.kv[src])
        ids = self.m.get_block_ids(req.request_id)
        start = req.num_computed_tokens + n_hit
        assert len(ids) * self.bs >= start + num_new + lookahead
        blocks = self.m.block_pool.blocks
        for pos in range(start, start + num_new):
            block_id = ids[pos // self.bs]
            assert blocks[block_id].ref_cnt == 1, f"write into shared block {block_id}"
            self.kv[block_id][pos % self.bs] = (req.cache_salt, tuple(req.all_token_ids[: pos + 1]))
        req.num_computed_tokens = start + num_new
        return True

    # ---- rules --------------------------------------------------------------------------

    @rule(
        prefix=st.sampled_from([[], [7, 7, 7], [1, 2, 3, 4, 5]]),
        suffix=st.lists(st.integers(0, 2), min_size=1, max_size=10),
        salt=st.sampled_from([None, None, "s"]),
    )
    def add_request(self, prefix: list[int], suffix: list[int], salt: str | None) -> None:
        self.waiting.append(Request(self._new_id(), prefix + suffix, PARAMS, cache_salt=salt))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 12), lookahead=st.integers(0, 2))
    def schedule_waiting(self, i: int, chunk: int, lookahead: int) -> None:
        req = self.waiting[i % len(self.waiting)]
        hit: list = []
        n_hit = 0
        if req.num_computed_tokens == 0:
            hit, n_hit = self.m.get_computed_blocks(req)
            assert n_hit == len(hit) * self.bs and n_hit <= req.num_tokens - 1
            for pos in range(n_hit):  # a hit holds exactly this request's KV
                expect = (req.cache_salt, tuple(req.all_token_ids[: pos + 1]))
                assert self.kv[hit[pos // self.bs].block_id][pos % self.bs] == expect
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens - n_hit)
        if self._allocate_and_run(req, num_new, hit, n_hit, lookahead):
            self.waiting.remove(req)
            self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 12), lookahead=st.integers(0, 2),
          token=st.integers(0, 2))
    def step_running(self, i: int, chunk: int, lookahead: int, token: int) -> None:
        req = self.running[i % len(self.running)]
        if req.num_computed_tokens == req.num_tokens:  # forward done: sample a token
            if req.num_tokens >= MAX_TOKENS:
                self.running.remove(req)
                self.m.free(req)
            else:
                req.append_output_token_ids([token])
            return
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens)
        self._allocate_and_run(req, num_new, [], 0, lookahead)

    @precondition(lambda self: self.waiting or self.running)
    @rule(i=st.integers(0, 99))
    def finish(self, i: int) -> None:
        reqs = self.all_requests()
        req = reqs[i % len(reqs)]
        (self.waiting if req in self.waiting else self.running).remove(req)
        self.m.free(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 99))
    def preempt(self, i: int) -> None:
        req = self.running.pop(i % len(self.running))
        self.m.free(req)
        req.num_computed_tokens = 0
        self.waiting.insert(0, req)

    @precondition(lambda self: any(r.num_computed_tokens > 0 for r in self.running))
    @rule(i=st.integers(0, 99), token=st.integers(0, 2), recompute_last=st.booleans())
    def fork(self, i: int, token: int, recompute_last: bool) -> None:
        parents = [r for r in self.running if r.num_computed_tokens > 0]
        parent = parents[i % len(parents)]
        nc = parent.num_computed_tokens
        tokens = parent.all_token_ids[:nc]
        child = Request(self._new_id(), tokens, PARAMS, cache_salt=parent.cache_salt)
        self.m.fork(parent, child)
        if recompute_last:  # the scheduler's way: re-run the last computed token
            child.num_computed_tokens = nc - 1
        else:  # the child's own sampled token is next
            child.num_computed_tokens = nc
            child.append_output_token_ids([token])
        self.running.append(child)

    @rule()
    def reset_prefix_cache(self) -> None:
        idle = self.m.num_free_blocks == self.m.num_blocks - 1
        assert self.m.reset_prefix_cache() is idle
        if idle:
            assert self.m.block_pool.cached_block_hash_to_block == {}

    # ---- invariants ---------------------------------------------------------------------

    @invariant()
    def integrity(self) -> None:
        if not hasattr(self, "m"):
            return
        m = self.m
        m.check_integrity()
        blocks = m.block_pool.blocks
        held = sum(len(m.get_block_ids(r.request_id)) for r in self.all_requests())
        assert sum(b.ref_cnt for b in blocks) == held
        used = sum(1 for b in blocks if b.ref_cnt > 0)
        assert m.num_free_blocks + used == m.num_blocks - 1
        assert abs(m.usage - used / (m.num_blocks - 1)) < 1e-9
        for block in m.block_pool.cached_block_hash_to_block.values():
            assert block.token_ids is not None
            if isinstance(block.block_hash, tuple):  # tuple_hash: the key spells the prefix
                salt, prefix = unroll(block.block_hash)
                start = len(prefix) - self.bs
                expect = [(salt, tuple(prefix[: start + j + 1])) for j in range(self.bs)]
            else:  # sha256: check the slots hold the block's own tokens
                expect = self.kv[block.block_id]
                assert all(slot is not None for slot in expect), f"block {block.block_id}"
                assert tuple(p[-1] for _, p in expect) == block.token_ids  # type: ignore[misc]
            assert self.kv[block.block_id] == expect, f"cached block {block.block_id} is stale"
        for req in self.all_requests():
            ids = m.get_block_ids(req.request_id)
            assert len(ids) * self.bs >= req.num_computed_tokens
            for pos in range(req.num_computed_tokens):
                expect = (req.cache_salt, tuple(req.all_token_ids[: pos + 1]))
                assert self.kv[ids[pos // self.bs]][pos % self.bs] == expect, (
                    f"{req.request_id} reads wrong KV at position {pos}"
                )


# Example count from the hypothesis profile (tests/hypothesis_profiles.py): 200 under ci,
# 4,000 under HYPOTHESIS_PROFILE=long.
KVCacheMachine.TestCase.settings = settings(
    max_examples=examples(200),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKVCacheManagerStateful = KVCacheMachine.TestCase
