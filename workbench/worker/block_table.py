"""BlockTable: the persistent input batch's block ids, one row per request (vLLM V1's name).

    row 0   [ 7  8  9  0  0 ]     num_blocks_per_row [3, 1, 4]
    row 1   [ 4  0  0  0  0 ]     (zeros past a row's blocks, so a gathered
    row 2   [ 1  2  3  5  0 ]      table reads as the block ids padded with 0)

A row is written whole when its request enters the batch (`add_row`: new, resumed, or its
table replaced by a copy-on-write step); afterwards a step adds only its new block ids at the
row's end (`append_row`), the step message's delta (`CachedRequestData.new_block_ids`). Rows
move when the batch condenses (`move_row`). `slot_mapping` and `gather` read the step's rows
with numpy.

The table grows (doubling) when a row needs more columns or the batch more rows than
allocated; `np.zeros` leaves untouched pages unallocated, so a large capacity costs nothing
until used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTable:
    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        for name, value in (("max_num_reqs", max_num_reqs),
                            ("max_num_blocks_per_req", max_num_blocks_per_req),
                            ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
        self.block_size = block_size
        self.block_table_np = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int64)
        # per row, a Python list: the step loop reads it once per request (no numpy scalar)
        self.num_blocks_per_row: list[int] = [0] * max_num_reqs

    @property
    def max_num_reqs(self) -> int:
        return self.block_table_np.shape[0]

    @property
    def max_num_blocks_per_req(self) -> int:
        return self.block_table_np.shape[1]

    def ensure_capacity(self, num_reqs: int, num_blocks: int) -> None:
        """At least `num_reqs` rows of `num_blocks` columns (contents kept)."""
        rows, cols = self.block_table_np.shape
        if num_reqs <= rows and num_blocks <= cols:
            return
        new_rows, new_cols = max(rows, num_reqs), cols
        if num_blocks > cols:
            new_cols = max(num_blocks, 2 * cols)
        if num_reqs > rows:
            new_rows = max(num_reqs, 2 * rows)
        table = np.zeros((new_rows, new_cols), dtype=np.int64)
        table[:rows, :cols] = self.block_table_np
        self.block_table_np = table
        self.num_blocks_per_row.extend([0] * (new_rows - rows))

    # ------------------------------------------------------------------ row updates
    def add_row(self, block_ids: Sequence[int], row: int) -> None:
        """Row `row` := `block_ids` (zeros after them)."""
        n = len(block_ids)
        self.ensure_capacity(row + 1, n)
        old = int(self.num_blocks_per_row[row])
        table = self.block_table_np
        table[row, :n] = block_ids
        if old > n:
            table[row, n:old] = 0
        self.num_blocks_per_row[row] = n

    def append_row(self, block_ids: Sequence[int], row: int) -> None:
        """vLLM's name: `block_ids` (the request's new blocks) after the row's last one."""
        if not block_ids:
            return
        start = int(self.num_blocks_per_row[row])
        end = start + len(block_ids)
        self.ensure_capacity(row + 1, end)
        self.block_table_np[row, start:end] = block_ids
        self.num_blocks_per_row[row] = end

    def move_row(self, src: int, dst: int) -> None:
        """Row `dst` := row `src` (`dst` must be empty); `src` is left empty."""
        n = int(self.num_blocks_per_row[src])
        table = self.block_table_np
        table[dst, :n] = table[src, :n]
        self.num_blocks_per_row[dst] = n
        self.clear_row(src)

    def clear_row(self, row: int) -> None:
        n = int(self.num_blocks_per_row[row])
        self.block_table_np[row, :n] = 0
        self.num_blocks_per_row[row] = 0

    def row(self, row: int) -> list[int]:
        """The row's block ids (a copy, for tests and checks)."""
        return self.block_table_np[row, : int(self.num_blocks_per_row[row])].tolist()

    # ------------------------------------------------------------------ the step's reads
    def gather(self, rows: np.ndarray, num_cols: int) -> np.ndarray:
        """[len(rows), num_cols] int64: the rows' first `num_cols` block ids, zero-padded (a
        fresh array: safe to hand to torch without aliasing the table)."""
        self.ensure_capacity(1, num_cols)
        return self.block_table_np[rows, :num_cols]

    def slot_mapping(self, token_rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Each token's KV slot: block_table[row, pos // block_size] * block_size + pos %
        block_size (int64)."""
        bs = self.block_size
        return self.block_table_np[token_rows, positions // bs] * bs + positions % bs
