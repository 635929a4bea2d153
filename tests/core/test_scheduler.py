"""Scheduler unit tests with exact expectations (no model: a fake step samples a fixed token)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import pytest

from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request, RequestStatus
from workbench.core.sched.output import CachedRequestData, SchedulerOutput, yield_req_data
from workbench.core.sched.scheduler import Scheduler
from workbench.sampling_params import SamplingParams

EOS = 2


def make_scheduler(
    num_blocks: int = 100,
    block_size: int = 4,
    budget: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int = 256,
    chunked: bool = True,
    caching: bool = True,
    policy: str = "fcfs",
    threshold: int = 0,
) -> Scheduler:
    sc = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked,
        max_model_len=max_model_len, policy=policy, long_prefill_token_threshold=threshold,
    )
    return Scheduler(sc, CacheConfig(block_size=block_size, enable_prefix_caching=caching),
                     num_blocks)


def make_request(
    rid: str, num_tokens: int, max_tokens: int = 8, start: int = 10, priority: int = 0,
    arrival: float = 0.0, **params: object,
) -> Request:
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, **params)  # type: ignore[arg-type]
    return Request(rid, list(range(start, start + num_tokens)), sp, eos_token_id=EOS,
                   arrival_time=arrival, priority=priority)


# A worker's copy of each scheduler's block tables, kept from the messages' deltas alone.
_WORKER_TABLES: weakref.WeakKeyDictionary[Scheduler, dict[str, list[int]]] = (
    weakref.WeakKeyDictionary())


@dataclass
class Step:
    """One fake step: the message, and the scheduled requests' block tables as a worker
    rebuilds them from the deltas (checked against the KV cache manager's)."""

    out: SchedulerOutput
    block_ids: dict[str, list[int]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


def worker_tables(s: Scheduler, out: SchedulerOutput) -> dict[str, list[int]]:
    """Apply `out`'s delta to the worker-side copy; the scheduled requests' whole tables,
    asserted equal to the KV cache manager's."""
    tables = _WORKER_TABLES.setdefault(s, {})
    for rid in out.finished_req_ids:
        tables.pop(rid, None)
    for rid, ids, replace in yield_req_data(out):
        if replace:
            tables[rid] = list(ids)
        else:
            tables[rid].extend(ids)
    step = {rid: list(tables[rid]) for rid in out.num_scheduled_tokens}
    kv = s.kv_cache_manager
    assert step == {rid: kv.get_block_ids(rid) for rid in out.num_scheduled_tokens}
    return step


def runner_output(sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    """A ModelRunnerOutput with these accepted tokens (request id -> token ids)."""
    return ModelRunnerOutput(sampled_token_ids=sampled)


def fake_step(s: Scheduler, token: int = 7) -> Step:
    out = s.schedule()
    tables = worker_tables(s, out)
    reqs = s.requests
    sampled = {
        rid: [token] for rid, n in out.num_scheduled_tokens.items()
        if reqs[rid].num_computed_tokens + n >= reqs[rid].num_tokens
    }
    s.update_from_output(out, runner_output(sampled))
    s.kv_cache_manager.check_integrity()
    return Step(out, tables)


def test_seed_scenario_five_decodes_and_a_12000_token_prompt() -> None:
    s = make_scheduler(num_blocks=2000, block_size=16, budget=4096, max_model_len=16384)
    for i in range(5):
        s.add_request(make_request(f"d{i}", 20, max_tokens=100, start=100 * i))
    out = fake_step(s)  # five prefills
    assert out.num_scheduled_tokens == {f"d{i}": 20 for i in range(5)}
    s.add_request(make_request("long", 12000, start=1000))
    out = s.schedule()
    assert out.req_ids == [f"d{i}" for i in range(5)] + ["long"]
    assert out.num_scheduled_tokens == {**{f"d{i}": 1 for i in range(5)}, "long": 4091}
    assert out.num_decode_tokens == 5
    assert out.num_prefill_tokens == 4091


def test_seed_scenario_1530_shared_tokens_reuse_1520() -> None:
    s = make_scheduler(num_blocks=400, block_size=16, budget=2048, max_model_len=4096)
    s.add_request(make_request("a", 1530, max_tokens=1))
    fake_step(s)
    assert not s.has_unfinished_requests()
    b = make_request("b", 1530, max_tokens=1)
    s.add_request(b)
    out = s.schedule()
    assert b.num_cached_tokens == 1520
    assert out.num_scheduled_tokens == {"b": 10}
    queries, hits = s.kv_cache_manager.make_prefix_cache_stats()
    assert (queries, hits) == (3060, 1520)


def test_chunked_prefill_chunks_and_first_token_only_after_last_chunk() -> None:
    s = make_scheduler(budget=32)
    r = make_request("r", 100, max_tokens=3)
    s.add_request(r)
    chunks = []
    for _ in range(4):
        out = fake_step(s)
        chunks.append(out.num_scheduled_tokens["r"])
        if len(chunks) < 4:
            assert r.output_token_ids == []
    assert chunks == [32, 32, 32, 4]
    assert r.output_token_ids == [7]  # the prefill emits the first output token
    assert r.num_computed_tokens == 100
    fake_step(s)
    assert r.num_computed_tokens == 101 and r.output_token_ids == [7, 7]


def test_no_chunked_prefill_waits_for_a_budget_that_fits_the_whole_prompt() -> None:
    s = make_scheduler(budget=64, chunked=False, max_model_len=64)
    s.add_request(make_request("a", 40, max_tokens=4))
    s.add_request(make_request("b", 40, max_tokens=4, start=100))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 40}  # b (40) does not fit in the 24 left
    assert [r.request_id for r in s.waiting] == ["b"]


def test_long_prefill_token_threshold_caps_a_chunk() -> None:
    s = make_scheduler(budget=64, threshold=10)
    s.add_request(make_request("a", 25))
    s.add_request(make_request("b", 5, start=100))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 10, "b": 5}


def test_max_num_seqs_caps_running() -> None:
    s = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add_request(make_request(f"r{i}", 4, start=10 * i))
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]
    assert len(s.running) == 2 and len(s.waiting) == 1


def test_fcfs_preemption_recompute_last_running_to_front_of_waiting() -> None:
    # 6 usable blocks of 4 tokens. Three requests of 8 tokens take 2 blocks each.
    s = make_scheduler(num_blocks=7, block_size=4, budget=64, max_model_len=32)
    reqs = [make_request(f"r{i}", 8, max_tokens=8, start=10 + 10 * i) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    fake_step(s)
    assert s.kv_cache_manager.num_free_blocks == 0
    # Each needs a 3rd block for its 9th token: preempting r2 (the last running) frees two,
    # enough for r0 and r1.
    s.add_request(make_request("late", 4, start=90))
    out = s.schedule()
    assert out.preempted_request_ids == ["r2"]
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1}  # no waiting after a preemption
    assert reqs[2].status == RequestStatus.PREEMPTED and reqs[2].num_computed_tokens == 0
    assert reqs[2].num_preemptions == 1
    assert [r.request_id for r in s.waiting] == ["r2", "late"]
    assert s.num_preemptions_last_step == 1
    assert worker_tables(s, out) == {"r0": [1, 2, 6], "r1": [3, 4, 5]}
    # the message is a delta: the one block each got, nothing new
    assert out.scheduled_new_reqs == []
    assert out.scheduled_cached_reqs == CachedRequestData(
        req_ids=["r0", "r1"], resumed_from_preemption=[False, False], new_token_ids=[],
        new_block_ids=[[6], [5]], num_computed_tokens=[8, 8])
    s.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"r0": [7], "r1": [7]}))
    s.finish_requests(["r0", "r1"], RequestStatus.FINISHED_ABORTED)
    # freed tail first, r0 before r1: the free queue is 6 2 1 5 4 3
    out = s.schedule()  # r2 resumes: its whole (new) table, its tokens are the worker's
    assert out.finished_req_ids == {"r0", "r1"}
    assert [d.req_id for d in out.scheduled_new_reqs] == ["late"]
    assert out.scheduled_cached_reqs == CachedRequestData(
        req_ids=["r2"], resumed_from_preemption=[True], new_token_ids=[],
        new_block_ids=[[6, 2, 1]], num_computed_tokens=[0])
    assert out.num_scheduled_tokens == {"r2": 9, "late": 4}
    new = out.scheduled_new_reqs[0]
    assert (new.prompt_token_ids, new.block_ids, new.num_computed_tokens) == (
        [90, 91, 92, 93], [5], 0)


def test_priority_preemption_picks_the_lowest_priority() -> None:
    s = make_scheduler(num_blocks=7, block_size=4, budget=64, max_model_len=32, policy="priority")
    reqs = [
        make_request("p0", 8, priority=0, start=10, arrival=0.0),
        make_request("p5", 8, priority=5, start=30, arrival=1.0),
        make_request("p1", 8, priority=1, start=50, arrival=2.0),
    ]
    for r in reqs:
        s.add_request(r)
    fake_step(s)
    out = s.schedule()
    assert out.preempted_request_ids[0] == "p5"
    assert "p5" not in out.num_scheduled_tokens
    assert out.num_scheduled_tokens["p0"] == 1


def test_priority_waiting_order() -> None:
    s = make_scheduler(max_num_seqs=1, policy="priority")
    s.add_request(make_request("low", 4, priority=3, arrival=0.0))
    s.add_request(make_request("high", 4, priority=-1, arrival=1.0))
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["high"]


@pytest.mark.parametrize(
    ("params", "tokens", "expected_len", "status"),
    [
        ({}, [5, EOS, 6], 2, RequestStatus.FINISHED_STOPPED),
        ({"ignore_eos": True}, [5, EOS, 6, 6], 4, RequestStatus.FINISHED_LENGTH_CAPPED),
        ({"min_tokens": 3}, [EOS, EOS, EOS, 6], 3, RequestStatus.FINISHED_STOPPED),
        ({"stop_token_ids": [9]}, [5, 9, 6], 2, RequestStatus.FINISHED_STOPPED),
        ({}, [5, 5, 5, 5, 5], 4, RequestStatus.FINISHED_LENGTH_CAPPED),
    ],
)
def test_stop_conditions(
    params: dict[str, object], tokens: list[int], expected_len: int, status: RequestStatus
) -> None:
    s = make_scheduler()
    r = make_request("r", 4, max_tokens=4, **params)
    s.add_request(r)
    for tok in tokens:
        if r.is_finished():
            break
        fake_step(s, token=tok)
    assert r.num_output_tokens == expected_len and r.status == status
    assert s.kv_cache_manager.num_free_blocks == 99


def test_max_model_len_caps_generation() -> None:
    s = make_scheduler(max_model_len=10)
    r = make_request("r", 8, max_tokens=100)
    s.add_request(r)
    while not r.is_finished():
        fake_step(s)
    assert r.num_output_tokens == 2 and r.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_n2_fans_out_and_shares_only_full_blocks_through_the_prefix_cache() -> None:
    # vLLM V1's parallel sampling: two independent requests; the second hits the full
    # block the first cached at allocation (same step) and computes its partial tail into
    # a block of its own: nothing is copied, ever.
    s = make_scheduler(block_size=4)
    r = make_request("r", 6, max_tokens=3, n=2)  # blocks: [t0..t3] full, [t4 t5 _ _] partial
    s.add_request(r)
    child = s.requests["r#1"]
    assert (child.parent_id, child.index, child.sampling_params.n) == ("r", 1, 1)
    out = fake_step(s)
    assert out.num_scheduled_tokens == {"r": 6, "r#1": 2}
    assert out.blocks_to_copy == []
    assert out.block_ids == {"r": [1, 2], "r#1": [1, 3]}
    assert child.num_cached_tokens == 4
    out = fake_step(s)
    assert out.num_scheduled_tokens == {"r": 1, "r#1": 1}
    assert out.blocks_to_copy == []
    assert out.block_ids == {"r": [1, 2], "r#1": [1, 3]}


def test_n2_on_a_block_aligned_cached_prompt_recomputes_the_last_block_without_a_copy() -> None:
    # Seed 000's pair Q: the prompt fills its blocks exactly (8 tokens, block size 4) and is
    # already in the prefix cache. A hit is capped at (8 - 1) // 4 = 1 block, so each
    # sample recomputes the last full block into its own block; the first output token goes
    # to a fresh block; no shared block is ever written, so nothing is copied.
    s = make_scheduler(block_size=4)
    first = make_request("a", 8, max_tokens=1)
    s.add_request(first)
    fake_step(s)
    assert first.is_finished() and s.kv_cache_manager.get_block_ids("a") == []
    r = make_request("r", 8, max_tokens=2, n=2)
    s.add_request(r)
    out = fake_step(s)
    assert out.num_scheduled_tokens == {"r": 4, "r#1": 4}
    assert r.num_cached_tokens == 4 and s.requests["r#1"].num_cached_tokens == 4
    assert out.blocks_to_copy == []
    ids = out.block_ids
    assert ids["r"][0] == ids["r#1"][0] and ids["r"][1] != ids["r#1"][1]
    out = fake_step(s)
    assert out.num_scheduled_tokens == {"r": 1, "r#1": 1}
    assert out.blocks_to_copy == []
    assert len(set(out.block_ids["r"][1:]) | set(out.block_ids["r#1"][1:])) == 4


def test_n2_without_prefix_caching_computes_the_prompt_twice() -> None:
    s = make_scheduler(block_size=4, caching=False)
    s.add_request(make_request("r", 6, max_tokens=2, n=2))
    out = fake_step(s)
    assert out.num_scheduled_tokens == {"r": 6, "r#1": 6}
    assert out.block_ids == {"r": [1, 2], "r#1": [3, 4]} and out.blocks_to_copy == []


def test_every_config_policy_has_a_queue_and_back() -> None:
    from workbench.config import SCHEDULING_POLICIES
    from workbench.core.sched.request_queue import REQUEST_QUEUES

    assert tuple(REQUEST_QUEUES) == SCHEDULING_POLICIES
    for cls in REQUEST_QUEUES.values():  # what the scheduler calls on a policy's queue
        for method in ("add", "prepend", "peek", "pop", "remove", "__len__", "__iter__",
                       "preemption_victim"):
            assert callable(getattr(cls, method)), (cls.__name__, method)
