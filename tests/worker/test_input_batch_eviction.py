"""KV compression on the worker side: after blocks are evicted from the middle of a table,
positions stay logical (RoPE's original positions), the sequence length counts kept tokens
and each new token's slot is its row slot p - num_evicted_tokens. Hand-written steps with
exact arrays, then every step of real compressed schedules (chunked prefill, preemption,
prefix hits) against an oracle computed from the scheduler's tables."""

from __future__ import annotations

from typing import Any

from tests.worker.test_input_batch import Worker, target
from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request
from workbench.core.sched.output import NewRequestData, SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.sampling_params import SamplingParams
from workbench.worker.input_batch import InputBatch

BS = 4


def arrays(got: Any) -> dict[str, list[int]]:
    ids, pos, meta, _, _ = got
    return {"input_ids": ids.tolist(), "positions": pos.tolist(),
            "seq_lens": meta.seq_lens.tolist(), "slot_mapping": meta.slot_mapping.tolist(),
            "block_tables": meta.block_tables.tolist()}


def test_positions_slots_and_seq_lens_after_an_eviction() -> None:
    worker = Worker(InputBatch(4, 64, BS))
    prompt = list(range(100, 127))  # 27 tokens
    a = Request("a", prompt, SamplingParams(temperature=0.0, max_tokens=8))
    # step 1: the first 24 tokens, uncompressed, logical blocks 0..5
    out = SchedulerOutput(num_scheduled_tokens={"a": 24}, total_num_scheduled_tokens=24)
    out.scheduled_new_reqs.append(NewRequestData.from_request(a, [9, 10, 11, 12, 3, 7]))
    got = arrays(worker.prepare(out))
    assert got["positions"] == list(range(24)) and got["seq_lens"] == [24]
    assert got["slot_mapping"][:5] == [36, 37, 38, 39, 40]
    # step 2: logical blocks 1, 2, 3 evicted (E = 12): the table [9, 3, 7] + block 2 for
    # logical 6, sent whole; positions 24..26 -> row slots 12..14 -> block 2, offsets 0..2
    out = SchedulerOutput(num_scheduled_tokens={"a": 3}, total_num_scheduled_tokens=3,
                          num_evicted_tokens={"a": 12})
    out.scheduled_cached_reqs.append("a", True, [9, 3, 7, 2], 24)
    got = arrays(worker.prepare(out))
    assert got == {"input_ids": prompt[24:27], "positions": [24, 25, 26], "seq_lens": [15],
                   "slot_mapping": [8, 9, 10], "block_tables": [[9, 3, 7, 2]]}
    worker.sampled({"a": [55]})
    # step 3: a decodes at logical 27 (row slot 15: block 2, offset 3) beside a new request
    # b (uncompressed, blocks [5, 6]); the offset stays with a's row
    b = Request("b", list(range(200, 206)), SamplingParams(temperature=0.0, max_tokens=8))
    out = SchedulerOutput(num_scheduled_tokens={"a": 1, "b": 6}, total_num_scheduled_tokens=7)
    out.scheduled_cached_reqs.append("a", False, None, 27)
    out.scheduled_new_reqs.append(NewRequestData.from_request(b, [5, 6]))
    got = arrays(worker.prepare(out))
    assert got == {"input_ids": [55, *range(200, 206)], "positions": [27, 0, 1, 2, 3, 4, 5],
                   "seq_lens": [16, 6], "slot_mapping": [11, 20, 21, 22, 23, 24, 25],
                   "block_tables": [[9, 3, 7, 2], [5, 6, 0, 0]]}
    worker.sampled({"a": [56], "b": [57]})
    # step 4: decodes only (the one-token fast path); b leaves first, a moves rows
    out = SchedulerOutput(num_scheduled_tokens={"b": 1, "a": 1}, total_num_scheduled_tokens=2)
    out.scheduled_cached_reqs.append("b", False, None, 6)
    out.scheduled_cached_reqs.append("a", False, [8], 28)
    got = arrays(worker.prepare(out))
    assert got == {"input_ids": [57, 56], "positions": [6, 28], "seq_lens": [7, 17],
                   "slot_mapping": [26, 32], "block_tables": [[5, 6, 0, 0, 0],
                                                              [9, 3, 7, 2, 8]]}
    worker.batch.check_integrity()
    # step 5: preempted and resumed: its table starts again with no offset
    worker.sampled({"a": [58], "b": [59]})
    out = SchedulerOutput(num_scheduled_tokens={"a": 8}, total_num_scheduled_tokens=8)
    out.scheduled_cached_reqs.append("a", True, [13, 14], 0)
    got = arrays(worker.prepare(out))
    assert got["positions"] == list(range(8)) and got["seq_lens"] == [8]
    assert got["slot_mapping"] == list(range(52, 60))
    assert worker.batch.num_evicted_tokens_cpu[:1].tolist() == [0]


# ------------------------------------------------------------ real schedules, an oracle
def compressed_scheduler(num_blocks: int, budget: int, kv: dict[str, Any]) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget,
                         enable_chunked_prefill=True, max_model_len=128)
    cc = CacheConfig(block_size=BS, enable_prefix_caching=True, kv_compression_config=kv)
    return Scheduler(sc, cc, num_blocks)


def oracle(s: Scheduler, out: SchedulerOutput) -> dict[str, list]:
    """The step's arrays from the scheduler's side: logical positions, kept lengths, slots
    through the manager's compacted tables and offsets."""
    kv = s.kv_cache_manager
    positions: list[int] = []
    seq_lens: list[int] = []
    slots: list[int] = []
    for rid, n in out.num_scheduled_tokens.items():
        r = s.requests[rid]
        table = kv.get_block_ids(rid)
        e = kv.num_evicted_tokens(rid)
        nc = r.num_computed_tokens
        for p in range(nc, nc + n):
            positions.append(p)
            slots.append(table[(p - e) // BS] * BS + (p - e) % BS)
        seq_lens.append(nc - e + n)
    return {"positions": positions, "seq_lens": seq_lens, "slot_mapping": slots}


def drive(s: Scheduler, reqs: list[Request], join: int) -> dict[str, int]:
    worker = Worker(InputBatch(8, 128, BS))
    seen = {"steps": 0, "evictions": 0, "preemptions": 0, "max_blocks": 0}
    for i in range(400):
        if i == 0:
            for r in reqs[:join]:
                s.add_request(r)
        if i == 6:
            for r in reqs[join:]:
                s.add_request(r)
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        if out.is_empty:
            continue
        seen["steps"] += 1
        seen["evictions"] += s.num_evicted_blocks_last_step
        seen["preemptions"] += len(out.preempted_request_ids)
        want = oracle(s, out)
        got = arrays(worker.prepare(out))
        assert {k: got[k] for k in want} == want, f"step {i}"
        worker.batch.check_integrity()
        for rid in out.num_scheduled_tokens:
            seen["max_blocks"] = max(seen["max_blocks"],
                                     len(s.kv_cache_manager.get_block_ids(rid)))
        sampled = {}
        for rid, n in out.num_scheduled_tokens.items():
            r = s.requests[rid]
            if r.num_computed_tokens + n >= r.num_tokens:
                sampled[rid] = [target(r, r.num_tokens)]
        worker.sampled(sampled)
        s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
        s.kv_cache_manager.check_integrity()
    assert not s.has_unfinished_requests()
    return seen


def prompts() -> list[Request]:
    shared = list(range(100, 112))  # 3 full blocks shared: prefix hits for the later ones
    out = []
    for i in range(6):
        tokens = shared + [200 + 10 * i + j for j in range(3 + 5 * i)]
        params = SamplingParams(temperature=0.0, max_tokens=14 + 3 * i, ignore_eos=True)
        out.append(Request(f"r{i}", tokens, params))
    return out


def test_every_step_of_a_compressed_schedule_matches_the_oracle() -> None:
    s = compressed_scheduler(num_blocks=64, budget=16,
                             kv={"method": "streaming_llm", "budget_tokens": 16})
    reqs = prompts()
    seen = drive(s, reqs, join=3)
    assert seen["evictions"] > 20 and seen["preemptions"] == 0
    # sink 1 block + window 3 blocks; a 16-token chunk may hold 4 more until its next step
    assert seen["max_blocks"] <= 8
    assert s.kv_cache_manager.num_free_blocks == 63


def test_compressed_schedule_with_preemption_matches_the_oracle() -> None:
    s = compressed_scheduler(num_blocks=14, budget=16,
                             kv={"method": "streaming_llm", "budget_tokens": 12,
                                 "sink_tokens": 4})
    reqs = prompts()
    seen = drive(s, reqs, join=3)
    assert seen["evictions"] > 20 and seen["preemptions"] > 0
    assert s.kv_cache_manager.num_free_blocks == 13
    assert [len(r.output_token_ids) for r in reqs] == [14 + 3 * i for i in range(6)]
