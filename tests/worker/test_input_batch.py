"""The persistent input batch (workbench/worker/input_batch.py, block_table.py) fed by the
worker's own request states (request_state.py) from the step messages: exact rows,
block-table rows and condensing on scripted steps, preemption, speculative and copy-on-write
steps, and `ModelRunner.prepare_inputs` equal to the rebuild it replaced (`rebuild_inputs`,
kept here as the oracle, reading the scheduler's Requests and block tables) on every step of
real schedules (chunked prefill, prefix hits, preemption, n > 1, speculative decoding, a
tensor-parallel rank that does not sample)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from workbench.attention.metadata import AttentionMetadata
from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.kv_cache.utils import cdiv
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request
from workbench.core.sched.output import NewRequestData, SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.executor.tp_model_runner import MultiprocModelRunner
from workbench.sampling_params import SamplingParams
from workbench.worker.block_table import BlockTable
from workbench.worker.input_batch import InputBatch
from workbench.worker.model_runner import ModelRunner
from workbench.worker.request_state import (
    CachedRequestState,
    append_sampled,
    update_request_states,
)

CPU = torch.device("cpu")
BS = 4
Inputs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor,
               list[CachedRequestState]]
Truth = list[tuple[Request, list[int]]]  # the scheduled Requests and their block tables


# ---------------------------------------------------------------------------- the oracle
def rebuild_inputs(out: SchedulerOutput, truth: Truth, block_size: int) -> Inputs:
    """What `ModelRunner.prepare_inputs` computed before the persistent batch: every step
    rebuilt from each request's token list and whole block list (Python loops), here read
    from the scheduler's side: its Requests and their block tables, in batch order."""
    token_ids: list[int] = []
    starts: list[int] = []
    q_lens: list[int] = []
    to_sample: list[Any] = []
    logits_idx: list[int] = []
    total = 0
    for req, _ in truth:
        n = out.num_scheduled_tokens[req.request_id]
        start = req.num_computed_tokens
        end = start + n
        all_ids = req.all_token_ids
        if end <= len(all_ids):
            token_ids.extend(all_ids[start:end])
        else:
            token_ids.extend(all_ids[start:])
            token_ids.extend(out.scheduled_spec_decode_tokens[req.request_id])
        starts.append(start)
        q_lens.append(n)
        total += n
        if end >= len(all_ids):
            to_sample.append(SimpleNamespace(req_id=req.request_id))
            logits_idx.extend(range(total - 1 - (end - len(all_ids)), total))
    block_ids = [ids for _, ids in truth]
    num_reqs = len(q_lens)
    seq_lens = [s + q for s, q in zip(starts, q_lens, strict=True)]
    q_arr = np.asarray(q_lens, dtype=np.int64)
    cu = np.zeros(num_reqs + 1, dtype=np.int64)
    np.cumsum(q_arr, out=cu[1:])
    req_idx = np.repeat(np.arange(num_reqs, dtype=np.int64), q_arr)
    positions = (np.arange(total, dtype=np.int64) - cu[:-1][req_idx]
                 + np.asarray(starts, dtype=np.int64)[req_idx])
    width = cdiv(max(seq_lens), block_size)
    table = np.zeros((num_reqs, width), dtype=np.int64)
    for i, ids in enumerate(block_ids):
        k = min(len(ids), width)
        table[i, :k] = ids[:k]
    slots = table[req_idx, positions // block_size] * block_size + positions % block_size
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slots), query_start_loc=torch.from_numpy(cu),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64), block_tables=torch.from_numpy(table),
        query_lens_cpu=list(q_lens), seq_lens_cpu=seq_lens, max_query_len=max(q_lens),
        max_seq_len=max(seq_lens))
    return (torch.tensor(token_ids, dtype=torch.int64), torch.from_numpy(positions), meta,
            torch.tensor(logits_idx, dtype=torch.int64), to_sample)


class Worker:
    """A model runner's request states and persistent batch, without a model: the message
    applied (`update_request_states`), then `ModelRunner.prepare_inputs`. A driver appends
    the tokens it is told were sampled (`append_sampled`); a rank that does not sample takes
    them from the message's new_token_ids."""

    def __init__(self, batch: InputBatch, driver: bool = True) -> None:
        self.batch = batch
        self.driver = driver
        self.states: dict[str, CachedRequestState] = {}

    def prepare(self, out: SchedulerOutput) -> Inputs:
        reqs, _ = update_request_states(self.states, out, not self.driver)
        runner: Any = SimpleNamespace(input_batch=self.batch, device=CPU)
        return ModelRunner.prepare_inputs(runner, out, reqs)

    def idle(self, out: SchedulerOutput) -> None:
        """A step that schedules nobody: the states and the rows still follow it."""
        reqs, _ = update_request_states(self.states, out, not self.driver)
        self.batch.update_states(out, reqs)

    def sampled(self, tokens: dict[str, list[int]]) -> None:
        append_sampled(self.states, tokens.items())


def assert_same_inputs(got: Inputs, want: Inputs) -> None:
    (gi, gp, gm, gl, gs), (wi, wp, wm, wl, ws) = got, want
    pairs = [(gi, wi), (gp, wp), (gl, wl), (gm.slot_mapping, wm.slot_mapping),
             (gm.query_start_loc, wm.query_start_loc), (gm.seq_lens, wm.seq_lens),
             (gm.block_tables, wm.block_tables)]
    for g, w in pairs:
        assert g.dtype == w.dtype and g.shape == w.shape and g.tolist() == w.tolist()
    assert (gm.query_lens_cpu, gm.seq_lens_cpu, gm.max_query_len, gm.max_seq_len) == (
        wm.query_lens_cpu, wm.seq_lens_cpu, wm.max_query_len, wm.max_seq_len)
    assert [r.req_id for r in gs] == [r.req_id for r in ws]


# ---------------------------------------------------------------------------- scripted steps
def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(temperature=0.0, max_tokens=100))


class Messenger:
    """The scheduler's side of the message for hand-written steps: a request not sent before
    (or a new object under a known id) goes whole, then only its new block ids, the whole
    table again when it was preempted since (num_preemptions) or the step copies blocks; its
    tokens since the last message ride in new_token_ids (what rank 0 sends a TP rank)."""

    def __init__(self) -> None:
        # request id -> (the object, block ids sent, tokens sent, num_preemptions then)
        self.sent: dict[str, tuple[Request, int, int, int]] = {}
        self.truth: Truth = []

    def step(self, *sched: tuple[Request, int, list[int]], **kw: Any) -> SchedulerOutput:
        """A SchedulerOutput scheduling (request, tokens, block ids) in this order."""
        out = SchedulerOutput(**kw)
        for rid in out.finished_req_ids:
            self.sent.pop(rid, None)
        cached = out.scheduled_cached_reqs
        for r, n, blocks in sched:
            rid = r.request_id
            out.num_scheduled_tokens[rid] = n
            known = self.sent.get(rid)
            if known is None or known[0] is not r:
                out.scheduled_new_reqs.append(NewRequestData.from_request(r, list(blocks)))
            else:
                resumed = known[3] != r.num_preemptions or bool(out.blocks_to_copy)
                cached.append(rid, resumed, list(blocks) if resumed else blocks[known[1]:],
                              r.num_computed_tokens)
                cached.new_token_ids.append(r.all_token_ids[known[2]:])
            self.sent[rid] = (r, len(blocks), len(r.all_token_ids), r.num_preemptions)
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        self.truth = [(r, b) for r, _, b in sched]
        return out


def advance(r: Request, n: int, *sampled: int) -> None:
    """What update_from_output does: n tokens computed, the sampled ones appended."""
    r.num_computed_tokens += n
    r.append_output_token_ids(list(sampled))


def run(worker: Worker, out: SchedulerOutput, truth: Truth) -> Inputs:
    want = rebuild_inputs(out, truth, BS)
    got = worker.prepare(out)
    assert_same_inputs(got, want)
    worker.batch.check_integrity()
    return got


class Script:
    """Hand-written steps through a Messenger to a Worker that does not sample (its tokens
    come in the message)."""

    def __init__(self, batch: InputBatch) -> None:
        self.messenger = Messenger()
        self.worker = Worker(batch, driver=False)

    def run(self, *sched: tuple[Request, int, list[int]], **kw: Any) -> Inputs:
        out = self.messenger.step(*sched, **kw)
        return run(self.worker, out, self.messenger.truth)


def rows(batch: InputBatch) -> list[list[int]]:
    return [batch.block_table.row(i) for i in range(len(batch.req_ids))]


def test_rows_enter_continue_leave_and_condense() -> None:
    batch = InputBatch(max_num_reqs=2, max_model_len=8, block_size=BS)  # both grow
    sc = Script(batch)
    a, b = req("a", [10, 11, 12, 13, 14]), req("b", [20, 21, 22])
    c = req("c", [30, 31, 32, 33, 34, 35, 36, 37, 38])
    ids, pos, meta, logits, sampled = sc.run((a, 5, [1, 2]), (b, 3, [3]),
                                                      (c, 9, [4, 5, 6]))
    assert batch.req_ids == ["a", "b", "c"] and rows(batch) == [[1, 2], [3], [4, 5, 6]]
    assert batch.num_tokens_no_spec[:3].tolist() == [5, 3, 9]
    assert batch.token_ids_cpu[1, :3].tolist() == [20, 21, 22]
    assert meta.slot_mapping.tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 16, 17, 18, 19, 20, 21,
                                          22, 23, 24]
    assert meta.block_tables.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]]
    assert logits.tolist() == [4, 7, 16] and [r.req_id for r in sampled] == ["a", "b", "c"]
    advance(a, 5, 15)
    advance(b, 3, 23)
    advance(c, 9, 39)

    # b finished: its row is a hole, which d (new) takes; a and c copy one token each
    d = req("d", [40, 41])
    ids, pos, meta, logits, _ = sc.run((a, 1, [1, 2]), (c, 1, [4, 5, 6]),
                                                (d, 2, [7]), finished_req_ids={"b"})
    assert batch.req_ids == ["a", "d", "c"] and batch.req_id_to_index == {"a": 0, "d": 1, "c": 2}
    assert rows(batch) == [[1, 2], [7], [4, 5, 6]]
    assert batch.num_tokens_no_spec[:3].tolist() == [6, 2, 10]
    assert batch.num_computed_tokens_cpu[:3].tolist() == [5, 0, 9]
    assert ids.tolist() == [15, 39, 40, 41] and pos.tolist() == [5, 9, 0, 1]
    assert meta.slot_mapping.tolist() == [9, 25, 28, 29] and logits.tolist() == [0, 1, 3]
    advance(a, 1, 16)
    advance(c, 1, 390)
    advance(d, 2, 42)

    # a left out by the budget: its row leaves, c (the last row) moves into it
    ids, pos, meta, _, _ = sc.run((c, 1, [4, 5, 6]), (d, 1, [7]))
    assert batch.req_ids == ["c", "d"] and batch.req_id_to_index == {"c": 0, "d": 1}
    assert rows(batch) == [[4, 5, 6], [7]] and not batch.block_table.block_table_np[2].any()
    assert batch.token_ids_cpu[0, :11].tolist() == [*range(30, 40), 390]
    assert ids.tolist() == [390, 42] and meta.slot_mapping.tolist() == [26, 30]
    advance(c, 1, 391)
    advance(d, 1, 43)

    # a is back (a new row, whole); c's new block 8 (a lookahead block) is appended
    ids, _, meta, _, _ = sc.run((c, 1, [4, 5, 6, 8]), (d, 1, [7]), (a, 1, [1, 2]))
    assert batch.req_ids == ["c", "d", "a"] and rows(batch) == [[4, 5, 6, 8], [7], [1, 2]]
    assert batch.token_ids_cpu[2, :7].tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert ids.tolist() == [391, 43, 16] and meta.slot_mapping.tolist() == [27, 31, 10]
    assert batch.token_ids_cpu.shape == (4, 16)  # grown: 3 rows > 2, 12 tokens > 8


def test_a_preempted_request_gets_its_row_rebuilt_on_resume() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=32, block_size=BS)
    sc = Script(batch)
    a, e = req("a", [10, 11, 12, 13, 14, 15]), req("e", [50])
    sc.run((a, 6, [1, 2]))
    advance(a, 6, 16)
    sc.run((a, 1, [1, 2]))
    advance(a, 1, 17)
    # preempted (recompute): freed, num_computed_tokens 0; the step runs without it
    a.num_computed_tokens, a.num_preemptions = 0, 1
    sc.run((e, 1, [3]), preempted_request_ids=["a"])
    assert batch.req_ids == ["e"] and rows(batch) == [[3]]
    ids, pos, meta, _, _ = sc.run((e, 1, [3]), (a, 8, [9, 5]))
    assert batch.req_ids == ["e", "a"] and rows(batch) == [[3], [9, 5]]
    assert batch.num_computed_tokens_cpu[1] == 0 and batch.num_tokens_no_spec[1] == 8
    assert ids.tolist() == [50, *range(10, 18)]
    assert meta.slot_mapping.tolist() == [12, 36, 37, 38, 39, 20, 21, 22, 23]


def test_a_preemption_the_worker_never_saw_is_caught_by_the_epoch() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=32, block_size=BS)
    sc = Script(batch)
    a = req("a", [10, 11, 12, 13, 14, 15])
    sc.run((a, 6, [1, 2]))
    advance(a, 6, 16)
    # preempted and resumed between two steps this worker ran: a prefix hit on block 1 but
    # new blocks after it; appending to the old row would give [1, 2, 6]
    a.num_computed_tokens, a.num_preemptions = 4, 1
    _, _, meta, _, _ = sc.run((a, 3, [1, 5, 6]))
    assert rows(batch) == [[1, 5, 6]] and meta.slot_mapping.tolist() == [20, 21, 22]


def test_a_speculative_step_puts_the_drafts_after_the_confirmed_tokens() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=32, block_size=BS)
    sc = Script(batch)
    a, b = req("a", [10, 11, 12, 13, 14]), req("b", [20, 21, 22])
    sc.run((a, 5, [1, 2]), (b, 3, [3]))
    advance(a, 5, 15)
    advance(b, 3, 23)
    ids, pos, meta, logits, sampled = sc.run(
        (a, 3, [1, 2]), (b, 1, [3]), scheduled_spec_decode_tokens={"a": [16, 17]})
    assert ids.tolist() == [15, 16, 17, 23] and pos.tolist() == [5, 6, 7, 3]
    assert meta.slot_mapping.tolist() == [9, 10, 11, 15]
    assert logits.tolist() == [0, 1, 2, 3] and [r.req_id for r in sampled] == ["a", "b"]
    assert batch.token_ids_cpu[0, :8].tolist() == [10, 11, 12, 13, 14, 15, 16, 17]
    assert batch.num_tokens_no_spec[:2].tolist() == [6, 4]  # the drafts are not counted
    advance(a, 3 - 1, 16, 99)  # draft 16 accepted, 17 rejected, 99 the bonus token
    advance(b, 1, 24)
    ids, _, meta, _, _ = sc.run((a, 1, [1, 2]), (b, 1, [3, 4]))
    assert batch.token_ids_cpu[0, :8].tolist() == [10, 11, 12, 13, 14, 15, 16, 99]
    assert ids.tolist() == [99, 24] and meta.slot_mapping.tolist() == [11, 16]
    assert rows(batch) == [[1, 2], [3, 4]]


def test_drafts_that_do_not_fill_the_scheduled_tokens_are_refused_and_the_batch_cleared() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=32, block_size=BS)
    sc = Script(batch)
    a = req("a", [10, 11, 12])
    sc.run((a, 3, [1]))
    advance(a, 3, 13)
    with pytest.raises(ValueError, match=r"request 'a': num_scheduled_tokens reaches 2 tokens "
                       r"past its 4 confirmed ones, but scheduled_spec_decode_tokens has \[5\]"):
        sc.worker.prepare(sc.messenger.step((a, 3, [1, 2]),
                                            scheduled_spec_decode_tokens={"a": [5]}))
    assert batch.req_ids == [] and batch.req_id_to_index == {}
    sc.run((a, 1, [1, 2]))  # rebuilt from scratch
    assert rows(batch) == [[1, 2]]


def test_a_copy_on_write_step_rewrites_the_rows() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=32, block_size=BS)
    sc = Script(batch)
    p = req("p", [10, 11, 12, 13, 14, 15])
    sc.run((p, 6, [1, 2]))
    advance(p, 6, 16)
    child = req("p#1", [10, 11, 12, 13, 14, 15])
    child.num_computed_tokens = 5  # a forked child recomputes the last prompt token
    # both write into shared block 2: each gets a fresh copy (8 and 9)
    _, _, meta, _, _ = sc.run((p, 1, [1, 8]), (child, 1, [1, 9]),
                                       blocks_to_copy=[(2, 8), (2, 9)])
    assert rows(batch) == [[1, 8], [1, 9]] and meta.slot_mapping.tolist() == [34, 37]


def test_block_table_rows() -> None:
    t = BlockTable(max_num_reqs=2, max_num_blocks_per_req=2, block_size=BS)
    t.add_row([5, 6, 7], 0)  # grows to 4 columns
    t.append_row([8], 0)
    t.add_row([1], 1)
    assert t.block_table_np.tolist() == [[5, 6, 7, 8], [1, 0, 0, 0]]
    t.add_row([5, 6, 9, 8, 3], 0)  # rewritten whole (grows to 5 columns)
    t.add_row([2], 1)
    assert t.row(0) == [5, 6, 9, 8, 3] and t.row(1) == [2]
    t.ensure_capacity(3, 1)  # 4 rows (doubled), columns kept
    t.move_row(0, 2)
    assert t.row(2) == [5, 6, 9, 8, 3] and t.row(0) == [] and not t.block_table_np[0].any()
    assert t.gather(np.array([2, 1]), 2).tolist() == [[5, 6], [2, 0]]
    assert t.slot_mapping(np.array([2, 2]), np.array([0, 9])).tolist() == [20, 37]
    with pytest.raises(ValueError, match=r"block_size \(0\) must be an integer >= 1"):
        BlockTable(1, 1, 0)


# ---------------------------------------------------------------------------- real schedules
def target(r: Any, pos: int) -> int:
    """The token this fake model samples at position `pos` of request `r`."""
    rid = r.request_id if isinstance(r, Request) else r.req_id
    return 10 + (pos * 7 + sum(map(ord, rid))) % 50


def truth(s: Scheduler, out: SchedulerOutput) -> Truth:
    """The scheduled Requests and their block tables, from the scheduler."""
    kv = s.kv_cache_manager
    return [(s.requests[rid], kv.get_block_ids(rid)) for rid in out.num_scheduled_tokens]


def drive(s: Scheduler, worker: Worker, max_steps: int = 400,
          add: dict[int, list[Request]] | None = None, drafts: int = 0) -> dict[str, int]:
    """Schedule until done (requests in `add` join at their step); every step's inputs must
    equal the rebuild's. The fake model samples `target`; with `drafts` > 0 each request
    that got tokens drafts that many, the third one off by one, and all of them when its
    length is a multiple of 3. Returns what the schedule exercised."""
    seen = {"steps": 0, "chunks": 0, "preemptions": 0, "copies": 0, "drafts": 0}
    for i in range(max_steps):
        for r in (add or {}).get(i, []):
            s.add_request(r)
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        if out.is_empty:
            worker.idle(out)
            continue
        seen["steps"] += 1
        seen["chunks"] += sum(1 for r, _ in truth(s, out) if r.num_computed_tokens
                              + out.num_scheduled_tokens[r.request_id] < r.num_prompt_tokens)
        seen["preemptions"] += len(out.preempted_request_ids)
        seen["copies"] += len(out.blocks_to_copy)
        seen["drafts"] += sum(len(d) for d in out.scheduled_spec_decode_tokens.values())
        _, _, _, _, to_sample = run(worker, out, truth(s, out))
        sampled: dict[str, list[int]] = {}
        for r in to_sample:
            first = len(r.all_token_ids)
            toks = []
            for j, d in enumerate(out.scheduled_spec_decode_tokens.get(r.req_id, [])):
                if d != target(r, first + j):
                    break
                toks.append(d)
            sampled[r.req_id] = [*toks, target(r, first + len(toks))]
        worker.sampled(sampled)
        s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
        if drafts:  # like the proposer: for the requests that got tokens (running ones kept)
            s.update_draft_token_ids({
                r.req_id: [target(r, len(r.all_token_ids) + j)
                           + (j == 2 or len(r.all_token_ids) % 3 == 0)
                           for j in range(drafts)]
                for r in to_sample})
        s.kv_cache_manager.check_integrity()
    return seen


def scheduler(num_blocks: int, budget: int, lookahead: int = 0) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget,
                         enable_chunked_prefill=True, max_model_len=128)
    return Scheduler(sc, CacheConfig(block_size=BS, enable_prefix_caching=True), num_blocks,
                     num_lookahead_tokens=lookahead)


def prompts() -> list[Request]:
    shared = list(range(100, 112))  # 3 full blocks shared: prefix hits for the later ones
    out = []
    for i in range(6):
        tokens = shared + [200 + 10 * i + j for j in range(3 + 2 * i)]
        params = SamplingParams(temperature=0.0, max_tokens=10 + i, ignore_eos=True,
                                n=2 if i == 1 else 1)
        out.append(Request(f"r{i}", tokens, params))
    return out


def test_prepare_inputs_equals_the_rebuild_on_a_crowded_schedule() -> None:
    s = scheduler(num_blocks=14, budget=16)
    reqs = prompts()
    seen = drive(s, Worker(InputBatch(8, 128, BS)), add={0: reqs[:3], 6: reqs[3:]})
    hits = sum(max(r.num_cached_tokens, 0) for r in reqs)
    assert (seen["steps"], seen["chunks"], seen["preemptions"], seen["copies"], hits) == (
        42, 3, 6, 0, 60)  # steps, prefill chunks, preemptions, copies (n > 1 shares through
    # the prefix cache, vLLM V1: never a copy), hit tokens
    assert all(r.is_finished() for r in reqs)


def test_prepare_inputs_equals_the_rebuild_with_speculative_decoding() -> None:
    s = scheduler(num_blocks=16, budget=16, lookahead=3)
    reqs = prompts()
    seen = drive(s, Worker(InputBatch(8, 128, BS)), add={0: reqs[:4], 3: reqs[4:]}, drafts=3)
    assert (seen["steps"], seen["drafts"], seen["preemptions"], seen["copies"]) == (20, 81, 5, 0)
    assert all(r.is_finished() for r in reqs)


def test_a_tensor_parallel_rank_gets_the_same_inputs_as_rank_0() -> None:
    """Rank 0 samples and appends its tokens; a TP rank that does not sample gets them in
    the message (`MultiprocModelRunner.fill_new_token_ids`, from rank 0's states) and
    builds the same inputs, preemptions included, from the same pickled message."""
    s = scheduler(num_blocks=20, budget=16)
    reqs = [r for r in prompts() if r.sampling_params.n == 1]
    for r in reqs:
        s.add_request(r)
    rank0, rank1 = Worker(InputBatch(8, 128, BS)), Worker(InputBatch(8, 128, BS), driver=False)
    sender: Any = SimpleNamespace(requests=rank0.states, num_sent_tokens={})
    preemptions = 0
    for _ in range(400):
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        if out.is_empty:
            continue
        preemptions += len(out.preempted_request_ids)
        MultiprocModelRunner.fill_new_token_ids(sender, out)
        sent = pickle.loads(pickle.dumps(out))
        mine = run(rank0, out, truth(s, out))
        theirs = run(rank1, sent, truth(s, out))
        assert_same_inputs(theirs, mine)
        sampled = {r.req_id: [target(r, len(r.all_token_ids))] for r in mine[4]}
        rank0.sampled(sampled)
        s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    assert preemptions == 2 and all(r.is_finished() for r in reqs)


def test_requests_run_alone_after_the_batch_then_together_again() -> None:
    """The engine's one-by-one re-run after a failed forward (`SchedulerOutput.for_request`):
    each request alone, then the batch again, all from the same persistent rows and states."""
    sc = Script(InputBatch(4, 64, BS))
    a, b, c = req("a", [10, 11, 12, 13, 14]), req("b", [20, 21, 22]), req("c", [30])
    sc.run((a, 5, [1, 2]), (b, 3, [3]), (c, 1, [4]))
    advance(a, 5, 15)
    advance(b, 3, 23)
    advance(c, 1, 31)
    full = sc.messenger.step((a, 1, [1, 2]), (b, 1, [3]), (c, 1, [4, 5]))
    run(sc.worker, full, sc.messenger.truth)  # the batched attempt (its forward then fails)
    for r, blocks in ((a, [1, 2]), (b, [3]), (c, [4, 5])):
        alone = full.for_request(r.request_id, blocks, is_prefill=False)
        assert alone.scheduled_cached_reqs.resumed_from_preemption == [True]
        run(sc.worker, alone, [(r, blocks)])
        assert sc.worker.batch.req_ids == [r.request_id]
        assert sc.worker.states[r.request_id].block_ids == blocks  # the delta not applied twice
    for r, tok in ((a, 16), (b, 24), (c, 32)):
        advance(r, 1, tok)
    sc.run((a, 1, [1, 2]), (b, 1, [3]), (c, 1, [4, 5]))  # the next step: the batch again
    assert sc.worker.batch.req_ids == ["c", "a", "b"] and rows(sc.worker.batch) == [
        [4, 5], [1, 2], [3]]
