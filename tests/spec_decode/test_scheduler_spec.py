"""Scheduler + KV manager with speculative tokens: budget, rollback, prefix cache, lookahead."""

from __future__ import annotations

from tests.core.test_scheduler import make_request, make_scheduler, runner_output
from workbench.core.request import RequestStatus
from workbench.core.sched.scheduler import Scheduler


def _decode_ready(s: Scheduler, rid: str = "a", prompt: int = 7) -> None:
    s.add_request(make_request(rid, prompt, max_tokens=50))
    out = s.schedule()
    # prefill done: 7 prompt tokens + 1 output
    s.update_from_output(out, runner_output({rid: [99]}))


def test_drafts_are_scheduled_after_the_last_token_and_count_against_the_budget() -> None:
    s = make_scheduler(block_size=4, budget=64)
    _decode_ready(s)
    req = s.requests["a"]
    req.spec_token_ids = [31, 32, 33, 34]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 5}
    assert out.scheduled_spec_decode_tokens == {"a": [31, 32, 33, 34]}
    assert out.num_decode_tokens == 5 and out.num_prefill_tokens == 0


def test_drafts_beyond_the_budget_are_dropped() -> None:
    s = make_scheduler(block_size=4, budget=3, max_num_seqs=2)
    _decode_ready(s, prompt=3)
    s.requests["a"].spec_token_ids = [31, 32, 33, 34]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 3}
    assert out.scheduled_spec_decode_tokens == {"a": [31, 32]}


def test_rejected_drafts_roll_back_num_computed_tokens() -> None:
    s = make_scheduler(block_size=4)
    _decode_ready(s)
    req = s.requests["a"]
    assert (req.num_computed_tokens, req.num_tokens) == (7, 8)
    req.spec_token_ids = [31, 32, 33, 34]
    out = s.schedule()
    # two drafts accepted, the third replaced by 55: positions 7, 8, 9 hold confirmed tokens
    s.update_from_output(out, runner_output({"a": [31, 32, 55]}))
    assert req.output_token_ids == [99, 31, 32, 55]
    assert req.num_computed_tokens == 7 + 5 - 2 == 10
    assert req.num_tokens == 11 and req.spec_token_ids == []
    s.kv_cache_manager.check_integrity()


def test_all_drafts_accepted_plus_bonus() -> None:
    s = make_scheduler(block_size=4)
    _decode_ready(s)
    req = s.requests["a"]
    req.spec_token_ids = [31, 32, 33]
    out = s.schedule()
    s.update_from_output(out, runner_output({"a": [31, 32, 33, 34]}))
    assert req.num_computed_tokens == 11 and req.num_tokens == 12


def test_draft_tokens_never_enter_the_prefix_cache() -> None:
    s = make_scheduler(block_size=4)
    _decode_ready(s)  # tokens 10..16 + 99: block 0 full and cached, block 1 holds 14 15 16 99
    req = s.requests["a"]
    req.spec_token_ids = [31, 32, 33, 34, 35]  # positions 8..12: fill block 2, spill into block 3
    s.schedule()
    kv = s.kv_cache_manager
    st = kv._reqs["a"]
    # Only blocks made of confirmed tokens are keyed: block 1 (positions 4..7, all confirmed)
    # becomes full with this step's confirmed token; blocks 2 and 3 hold only drafts.
    assert [b.block_hash is not None for b in st.blocks] == [True, True, False, False]
    assert st.blocks[1].token_ids == (14, 15, 16, 99)


def test_rejected_drafts_are_overwritten_before_their_block_is_cached() -> None:
    s = make_scheduler(block_size=4)
    _decode_ready(s)
    req = s.requests["a"]
    req.spec_token_ids = [31, 32, 33, 34]
    out = s.schedule()
    # nothing accepted: positions 8.. are garbage
    s.update_from_output(out, runner_output({"a": [37]}))
    assert req.num_computed_tokens == 8
    for tok in (8, 9, 10):
        out = s.schedule()
        assert out.scheduled_spec_decode_tokens == {}
        s.update_from_output(out, runner_output({"a": [tok]}))
    s.schedule()  # block 2 (positions 8..11) is now full of confirmed tokens, computed anew
    st = s.kv_cache_manager._reqs["a"]
    assert st.blocks[2].block_hash is not None
    assert st.blocks[2].token_ids == (37, 8, 9, 10)


def test_lookahead_allocates_slots_for_the_draft_model() -> None:
    s = make_scheduler(block_size=4)
    s.num_lookahead_tokens = 5
    s.add_request(make_request("a", 7, max_tokens=50))
    s.schedule()
    # 7 prompt tokens + 5 lookahead slots = 12 slots = 3 blocks
    assert len(s.kv_cache_manager.get_block_ids("a")) == 3


def test_preemption_clears_drafts() -> None:
    s = make_scheduler(block_size=4)
    _decode_ready(s)
    req = s.requests["a"]
    req.spec_token_ids = [31, 32]
    s.running.remove(req)
    s._preempt(req)
    assert req.spec_token_ids == []
    assert req.num_computed_tokens == 0


def test_drafts_go_only_to_requests_still_running_after_the_update() -> None:
    """The worker drafts for every request it sampled, before it knows which ones stop:
    a request that finished in the same step (here on max_tokens) gets none."""
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 7, max_tokens=50))
    s.add_request(make_request("b", 7, max_tokens=1, start=40))
    out = s.schedule()
    _, finished = s.update_from_output(out, runner_output({"a": [99], "b": [98]}))
    assert [r.request_id for r in finished] == ["b"]
    b = finished[0]
    s.update_draft_token_ids({"a": [31, 32], "b": [33, 34], "gone": [1]})
    assert s.requests["a"].spec_token_ids == [31, 32]
    assert b.spec_token_ids == []
    assert s.schedule().scheduled_spec_decode_tokens == {"a": [31, 32]}


def test_finished_request_ids_reach_the_next_scheduler_output_once() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 7, max_tokens=1))
    s.add_request(make_request("b", 7, max_tokens=50, start=40))
    s.update_from_output(s.schedule(), runner_output({"a": [99], "b": [98]}))
    s.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    assert s.schedule().finished_req_ids == {"a", "b"}
    assert s.schedule().finished_req_ids == set()
