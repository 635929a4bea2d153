"""InputBatch: the model runner's persistent per-request arrays (vLLM V1's gpu_input_batch).

One row per request scheduled in the current step, rows 0..num_reqs-1 (condensed):

    req_ids                  ["b", "a", "c"]         req_id_to_index {"b": 0, "a": 1, "c": 2}
    token_ids_cpu            row 0: b's tokens | drafts      [max_num_reqs, max_model_len]
                             row 1: a's tokens               int32; a row's confirmed tokens
                             row 2: c's tokens               are copied once
    num_tokens_no_spec       [9, 5, 7]               confirmed tokens held per row
    num_computed_tokens_cpu  [8, 4, 0]               the request's num_computed_tokens
    num_evicted_tokens_cpu   [0, 0, 32]              KV compression: tokens evicted from
                                                     the row's table (set when it enters)
    block_table              BlockTable rows         (block_table.py)

`update_states(out, reqs)` brings the rows to a SchedulerOutput (vLLM's `_update_states`);
`reqs` are the worker's own states of the scheduled requests (`request_state.py`, already
brought to the message), in batch order:

    1. leave: every row whose request is not scheduled this step (finished, preempted,
       aborted, or left out by the token budget) becomes a hole
    2. continue: a scheduled request whose row holds this very state object (a reused
       request id is a new object) in the same epoch (its block table was not replaced since,
       as after a preemption or a copy-on-write step): only the tokens appended since its
       last step are copied, and its block-table row gets only its new block ids
    3. enter: any other scheduled request (new, resumed, back after a step left out) takes
       the lowest hole or the next row, its tokens and block ids copied whole
    4. condense: the last rows move into the holes left, so rows stay 0..num_reqs-1
    5. this step's draft tokens are written after each request's confirmed tokens; they are
       not counted in `num_tokens_no_spec`, so the next step's confirmed tokens overwrite them

`prepare(out, reqs)` then gathers the step's flat batch in batch order with numpy (the layout
is `model_runner.py`'s diagram): token ids, positions and slot mapping are read from the
persistent arrays at each token's (row, position); nothing walks a request's history.

KV compression (docs/kv_compression.md): a request whose table lost blocks from the middle
carries `num_evicted_tokens` E (it changes only with its table, sent whole: the row is
rebuilt). Its positions stay logical (RoPE sees the original positions); its sequence
length is the kept cache, starts - E + query_len, and token p's slot is read at row slot
p - E:

    bs 4, E 8: logical blocks 0 _ _ 3 4 kept -> row [b0, b3, b4]; position 17 -> row slot 9
    (block b4, offset 1); seq_len 10 for a decode at position 17
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from workbench.core.kv_cache.utils import cdiv
from workbench.core.sched.output import SchedulerOutput
from workbench.worker.block_table import BlockTable
from workbench.worker.request_state import CachedRequestState


class StepArrays(NamedTuple):
    """One step's flat batch (fresh numpy arrays: nothing aliases the persistent ones)."""

    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    query_start_loc: np.ndarray  # [num_reqs + 1] int64
    seq_lens: np.ndarray  # [num_reqs] int64
    block_table: np.ndarray  # [num_reqs, cdiv(max seq_len, block_size)] int64, 0-padded
    slot_mapping: np.ndarray  # [num_tokens] int64
    logits_indices: np.ndarray  # [rows scored] int64: the flat rows whose logits are needed
    to_sample: list[CachedRequestState]  # the requests sampled this step, in batch order
    query_lens: list[int]  # [num_reqs] tokens scheduled per request


class StepRows(NamedTuple):
    """`InputBatch.update_states`' answer, in batch order."""

    rows: np.ndarray  # [num_reqs] int64: each request's row (after condense)
    query_lens: list[int]  # tokens scheduled per request
    starts: list[int]  # num_computed_tokens per request
    num_tokens: int  # the step's tokens
    logits_indices: list[int]  # flat rows scored: last confirmed token and drafts, if sampled
    to_sample: list[CachedRequestState]  # the requests sampled


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int) -> None:
        for name, value in (("max_num_reqs", max_num_reqs), ("max_model_len", max_model_len),
                            ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
        self.block_size = block_size
        self.req_ids: list[str | None] = []  # by row; None = a hole (until condense)
        self.req_id_to_index: dict[str, int] = {}
        self._holes: list[int] = []  # heap of the rows freed since the last condense
        self._requests: list[CachedRequestState | None] = []  # the state each row was built from
        self._epochs: list[int | None] = []  # its epoch then
        # num_tokens_no_spec as a Python list: the step loop reads it once per request
        self._num_tokens: list[int] = []
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_evicted_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int64)
        self._any_evicted = False  # a row ever had an offset (else prepare skips reading them)
        self.block_table = BlockTable(max_num_reqs, cdiv(max_model_len, block_size),
                                      block_size)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def _ensure_rows(self, num_reqs: int) -> None:
        rows = self.token_ids_cpu.shape[0]
        if num_reqs <= rows:
            return
        new_rows = max(num_reqs, 2 * rows)
        tokens = np.zeros((new_rows, self.token_ids_cpu.shape[1]), dtype=np.int32)
        tokens[:rows] = self.token_ids_cpu
        self.token_ids_cpu = tokens
        for name in ("num_tokens_no_spec", "num_computed_tokens_cpu", "num_evicted_tokens_cpu"):
            grown = np.zeros(new_rows, dtype=np.int64)
            grown[:rows] = getattr(self, name)
            setattr(self, name, grown)
        self.block_table.ensure_capacity(new_rows, 1)

    def _ensure_token_cols(self, num_tokens: int) -> np.ndarray:
        """token_ids_cpu with at least `num_tokens` columns (returned)."""
        rows, cols = self.token_ids_cpu.shape
        if num_tokens > cols:
            tokens = np.zeros((rows, max(num_tokens, 2 * cols)), dtype=np.int32)
            tokens[:, :cols] = self.token_ids_cpu
            self.token_ids_cpu = tokens
        return self.token_ids_cpu

    # ------------------------------------------------------------------ rows
    def add_request(self, req: CachedRequestState) -> int:
        """A row for `req` (the lowest hole, else the next row): its confirmed tokens and
        block ids copied whole, its num_computed_tokens noted. Returns the row."""
        rid = req.req_id
        if rid in self.req_id_to_index:
            raise ValueError(f"request {rid!r} already has row {self.req_id_to_index[rid]}; "
                             "remove_request it first")
        if self._holes:
            row = heapq.heappop(self._holes)
        else:
            row = len(self.req_ids)
            self._ensure_rows(row + 1)
            for per_row in (self.req_ids, self._requests, self._epochs):
                per_row.append(None)
            self._num_tokens.append(0)
        ids = req.all_token_ids
        self._ensure_token_cols(len(ids))[row, : len(ids)] = ids
        self._num_tokens[row] = self.num_tokens_no_spec[row] = len(ids)
        self.num_computed_tokens_cpu[row] = req.num_computed_tokens
        if req.num_evicted_tokens:
            self.num_evicted_tokens_cpu[row] = req.num_evicted_tokens
            self._any_evicted = True
        self.block_table.add_row(req.block_ids, row)
        self.req_ids[row] = rid
        self._requests[row] = req
        self._epochs[row] = req.epoch
        self.req_id_to_index[rid] = row
        return row

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row (a hole until `condense`); its row, or None if it had none."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = self._requests[row] = self._epochs[row] = None
        self.block_table.clear_row(row)
        self._num_tokens[row] = self.num_tokens_no_spec[row] = 0
        self.num_computed_tokens_cpu[row] = 0
        self.num_evicted_tokens_cpu[row] = 0
        heapq.heappush(self._holes, row)
        return row

    def condense(self) -> dict[int, int]:
        """Move the last rows into the holes, so rows 0..num_reqs-1 are in use (vLLM's
        `condense`); returns the moves {old row: new row}."""
        moves: dict[int, int] = {}
        ids = self.req_ids
        for hole in sorted(self._holes):
            while ids and ids[-1] is None:
                self._pop_last_row()
            if hole >= len(ids):
                break
            src = len(ids) - 1
            self._move_row(src, hole)
            moves[src] = hole
            self._pop_last_row()
        while ids and ids[-1] is None:
            self._pop_last_row()
        self._holes.clear()
        return moves

    def _pop_last_row(self) -> None:
        for per_row in (self.req_ids, self._requests, self._epochs, self._num_tokens):
            per_row.pop()

    def _move_row(self, src: int, dst: int) -> None:
        n = self._num_tokens[src]
        self.token_ids_cpu[dst, :n] = self.token_ids_cpu[src, :n]
        for arr in (self.num_tokens_no_spec, self.num_computed_tokens_cpu,
                    self.num_evicted_tokens_cpu):
            arr[dst], arr[src] = arr[src], 0
        self.block_table.move_row(src, dst)
        rid = self.req_ids[src]
        assert rid is not None and self.req_ids[dst] is None
        self.req_ids[dst], self._requests[dst], self._epochs[dst] = (
            rid, self._requests[src], self._epochs[src])
        self._num_tokens[dst], self._num_tokens[src] = n, 0
        self.req_ids[src] = self._requests[src] = self._epochs[src] = None
        self.req_id_to_index[rid] = dst

    def clear(self) -> None:
        """Drop every row (after a failure half-way through an update)."""
        for rid in list(self.req_id_to_index):
            self.remove_request(rid)
        for per_row in (self.req_ids, self._requests, self._epochs, self._num_tokens,
                        self._holes):
            per_row.clear()

    # ------------------------------------------------------------------ the step
    def update_states(self, out: SchedulerOutput, reqs: list[CachedRequestState]) -> StepRows:
        """Bring the rows to `out` (steps 1-5 of the module docstring); the step's rows and
        per-request figures in batch order (`reqs`). On any error the batch is cleared (the
        next step rebuilds every row) and the error raised."""
        try:
            return self._update_states(out, reqs)
        except BaseException:
            self.clear()
            raise

    def _update_states(self, out: SchedulerOutput, reqs: list[CachedRequestState]) -> StepRows:
        num_sched = out.num_scheduled_tokens
        index = self.req_id_to_index
        for rid in out.finished_req_ids:
            self.remove_request(rid)
        for rid in index.keys() - num_sched.keys():
            self.remove_request(rid)
        table = self.block_table
        counts = table.num_blocks_per_row  # Python lists, grown in place: read per request
        have_of, requests, epochs = self._num_tokens, self._requests, self._epochs
        spec = out.scheduled_spec_decode_tokens
        cols = self.token_ids_cpu.shape[1]
        rows: list[int] = []
        q_lens: list[int] = []
        starts: list[int] = []
        lens: list[int] = []
        logits: list[int] = []
        to_sample: list[CachedRequestState] = []
        one_rows: list[int] = []  # single new tokens (decodes): written at once after the loop
        one_cols: list[int] = []
        one_ids: list[int] = []
        drafts_at: list[tuple[int, int, list[int]]] = []  # (batch index, first position, ids)
        total = 0
        for req in reqs:
            rid = req.req_id
            ids = req.all_token_ids
            num_ids = len(ids)
            nc = req.num_computed_tokens
            epoch = req.epoch
            row = index.get(rid)
            if row is not None and (requests[row] is not req or epochs[row] != epoch
                                    or num_ids < have_of[row]):
                self.remove_request(rid)
                row = None
            if row is None:
                row = self.add_request(req)
                cols = self.token_ids_cpu.shape[1]
            else:
                have = have_of[row]
                if num_ids > have:  # the tokens sampled since its last step
                    if num_ids - have == 1 and num_ids <= cols:
                        one_rows.append(row)
                        one_cols.append(have)
                        one_ids.append(ids[have])
                    else:
                        tokens = self._ensure_token_cols(num_ids)
                        cols = tokens.shape[1]
                        tokens[row, have:num_ids] = ids[have:]
                    have_of[row] = num_ids
                block_ids = req.block_ids
                if len(block_ids) > counts[row]:
                    table.append_row(block_ids[counts[row]:], row)
            n = num_sched[rid]
            end = nc + n
            total += n
            if end >= num_ids:
                to_sample.append(req)
                if end == num_ids:
                    logits.append(total - 1)
                else:  # draft tokens follow the confirmed ones (trimmed to fit); all scored
                    drafts = spec.get(rid)
                    if drafts is None or len(drafts) != end - num_ids:
                        raise ValueError(
                            f"request {rid!r}: num_scheduled_tokens reaches {end - num_ids} "
                            f"tokens past its {num_ids} confirmed ones, but "
                            f"scheduled_spec_decode_tokens has {drafts!r} for it")
                    drafts_at.append((len(rows), num_ids, drafts))
                    logits.extend(range(total - 1 - (end - num_ids), total))
            rows.append(row)
            q_lens.append(n)
            starts.append(nc)
            lens.append(num_ids)
        if one_rows:
            self.token_ids_cpu[one_rows, one_cols] = one_ids
        rows_np = np.asarray(rows, dtype=np.int64)
        self.num_tokens_no_spec[rows_np] = lens  # before condense: it moves what they count
        self.num_computed_tokens_cpu[rows_np] = starts
        if self._holes:
            moves = self.condense()
            if moves:
                remap = np.arange(len(self.token_ids_cpu), dtype=np.int64)
                remap[list(moves)] = list(moves.values())
                rows_np = remap[rows_np]
        for i, first, drafts in drafts_at:
            end = first + len(drafts)
            self._ensure_token_cols(end)[rows_np[i], first:end] = drafts
        return StepRows(rows_np, q_lens, starts, total, logits, to_sample)

    def prepare(self, out: SchedulerOutput, reqs: list[CachedRequestState]) -> StepArrays:
        """`update_states`, then the step's flat batch gathered from the rows."""
        st = self.update_states(out, reqs)
        rows, n = st.rows, len(st.rows)
        q = np.asarray(st.query_lens, dtype=np.int64)
        starts = np.asarray(st.starts, dtype=np.int64)
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q, out=cu[1:])
        if st.num_tokens == n:  # one token per request (decodes): token i is request i's
            positions, token_rows = starts, rows
        else:
            req_idx = np.repeat(np.arange(n, dtype=np.int64), q)
            positions = (np.arange(st.num_tokens, dtype=np.int64) - cu[:-1][req_idx]
                         + starts[req_idx])
            token_rows = rows[req_idx]
        input_ids = self.token_ids_cpu[token_rows, positions].astype(np.int64)
        evicted = self.num_evicted_tokens_cpu[rows] if self._any_evicted else None
        if evicted is not None and evicted.any():  # KV compression: kept length and slots
            seq_lens = starts - evicted + q
            cache_pos = (positions - evicted if st.num_tokens == n
                         else positions - evicted[req_idx])
        else:
            seq_lens = starts + q
            cache_pos = positions
        width = cdiv(int(seq_lens.max()), self.block_size) if n else 0
        block_table = self.block_table.gather(rows, width)  # grows the table to `width` first
        slot_mapping = self.block_table.slot_mapping(token_rows, cache_pos)
        return StepArrays(input_ids, positions, cu, seq_lens, block_table, slot_mapping,
                          np.asarray(st.logits_indices, dtype=np.int64), st.to_sample,
                          st.query_lens)

    # ------------------------------------------------------------------ checks
    def check_integrity(self) -> None:
        """Raise AssertionError on a broken invariant: rows condensed, the index and the rows
        agree, each row's tokens are its request's confirmed tokens, zeros past each block
        row."""
        if len(self.req_ids) != len(self.req_id_to_index) or self._holes:
            raise AssertionError(f"rows not condensed: {self.req_ids}, holes {self._holes}")
        table = self.block_table
        for rid, row in self.req_id_to_index.items():
            if self.req_ids[row] != rid:
                raise AssertionError(f"req_id_to_index[{rid!r}] = {row} but row {row} holds "
                                     f"{self.req_ids[row]!r}")
            req = self._requests[row]
            assert req is not None
            n = int(self.num_tokens_no_spec[row])
            if n != self._num_tokens[row]:
                raise AssertionError(f"row {row} ({rid!r}): num_tokens_no_spec {n} but "
                                     f"{self._num_tokens[row]} in the step loop's list")
            if self.token_ids_cpu[row, :n].tolist() != list(req.all_token_ids[:n]):
                raise AssertionError(f"row {row} ({rid!r}): token ids differ from the request's")
            nb = int(table.num_blocks_per_row[row])
            if table.block_table_np[row, nb:].any():
                raise AssertionError(f"row {row} ({rid!r}): non-zero block ids past its {nb}")
