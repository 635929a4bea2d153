"""KIVI low-bit KV cache (kv_cache_dtype "int8" / "int4" / "int2"): one layer's quantized
blocks, the full-precision residual they share, the write path and the dequantizing gather.

Storage per layer (`KiviLayerCache`; `kernels.quant.kv_kivi` has the formats):

    k_codes, v_codes   [num_blocks, block_size, Hkv, D * bits / 8] uint8
    k_scale, k_zero    [num_blocks, Hkv, D] float16           keys: per block, per channel
    v_scale, v_zero    [num_blocks, block_size, Hkv, D / G]   values: per token, per group
    residual           [2, num_slots, block_size, Hkv, D]     model dtype: the fp blocks

The residual window: block j of a sequence of L tokens (positions [j*bs, (j+1)*bs)) is
quantized once (j + 1) * bs <= L - R (R = kv_quant_residual_tokens); until then (the block
being filled and the blocks holding the last R tokens) its K/V live in a slot of the residual
pool and its codes are not read. One `KiviResidualMap`, shared by all layers (block ids are),
says which block sits in which slot (`slot_of[block]`, -1 = quantized):

    sequence (L = 45, bs = 16, R = 20)   blocks  [ b7 | b2 | b9 ]
                                                  q    fp   fp      (1 + 1) * 16 = 32 > 25
    a decode step that reaches L = 52:             q    q    fp      b2 leaves the window:
                                                                     quantized from its slot

Writes (once per batch, `write_plan`, then `write_kivi` per layer): the new rows of blocks that
stay in the window go to their slots (a block's first write takes a free slot); blocks that
leave the window are assembled from their slot and the new rows, quantized into the codes,
and their slot freed. A long prefill quantizes its full blocks directly, never holding a slot.
Slots come back when a block is quantized, when a finished request's blocks are released
(`release_blocks`: its full blocks are quantized, a partial one is dropped) and, when the pool
is full, by quantizing the least recently written full block early (`forced_quantizations`
counts them). The pool holds `kivi_residual_slots` blocks: per running request the block
being filled, the ceil(R / bs) window blocks and a spare.

The layer's `kv_cache` tensor is a handle: a uint8 tensor of the usual shape
[2, num_blocks, block_size, Hkv, D] on the meta device (no memory) whose `kivi` attribute holds
the `KiviLayerCache` (`get_kivi`). Reads: `gather_kivi` (dequantize, then the residual's rows
where a block has a slot) is the torch twin of the decode kernels.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels.quant.kv_kivi import (
    SCALE_DTYPE,
    KiviLayout,
    dequantize_keys,
    dequantize_values,
    quantize_keys,
    quantize_values,
)
from workbench.attention.metadata import AttentionMetadata

Zeros = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


@dataclass
class KiviWritePlan:
    """One batch's writes, the same for every layer (built once by `KiviResidualMap`)."""

    query_lens: list[int]  # copies of the metadata's host lists, to detect in-place reuse
    seq_lens: list[int]
    starts: list[int]  # first batch row of each sequence
    fp_rows: torch.Tensor  # [n] batch rows written to the residual pool ...
    fp_dst: torch.Tensor  # [n] ... at flat residual row slot * bs + offset
    quant_blocks: torch.Tensor  # [m] block ids quantized in this batch
    quant_slot_rows: torch.Tensor  # [m * bs] flat residual rows they are read from ...
    quant_new_rows: torch.Tensor  # [m * bs] ... or batch rows of this batch's new tokens
    quant_from_new: torch.Tensor  # [m * bs] bool: take the new row


def _long(values: list[int] | np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(device)


class KiviResidualMap:
    """Which blocks are still full precision, and in which residual slot (all layers)."""

    def __init__(
        self, num_blocks: int, num_slots: int, block_size: int, residual_tokens: int,
        device: torch.device,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots ({num_slots}) must be >= 1")
        self.num_blocks, self.num_slots = num_blocks, num_slots
        self.block_size, self.residual_tokens = block_size, residual_tokens
        self.device = device
        self.slot_of = torch.full((num_blocks,), -1, dtype=torch.long)  # host, -1 = quantized
        self._slot = self.slot_of.numpy()  # the same memory
        self.slot_of_device = self.slot_of if device.type == "cpu" else self.slot_of.to(device)
        self.fill = np.zeros(num_blocks, dtype=np.int64)  # rows written since (re)opened
        self.last_write = np.zeros(num_blocks, dtype=np.int64)  # step of the last write
        self.free_slots = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.pending_release: set[int] = set()
        self.step = 0
        self.forced_quantizations = 0
        self.layers: list[KiviLayerCache] = []
        self._plan_md: AttentionMetadata | None = None
        self._plan: KiviWritePlan | None = None

    @property
    def slots_in_use(self) -> int:
        return self.num_slots - len(self.free_slots)

    def release_blocks(self, block_ids: list[int]) -> None:
        """A finished request's blocks: at the next batch its full fp blocks are quantized (a
        prefix-cache hit may still read them) and a partial one's slot is freed, unless that
        batch writes the block again (a new owner reuses the slot)."""
        self.pending_release.update(int(b) for b in block_ids)

    def write_plan(self, md: AttentionMetadata) -> KiviWritePlan:
        """The batch's writes, built (and the map updated) on the first layer's call."""
        plan = self._plan
        if (plan is None or self._plan_md is not md or plan.seq_lens != md.seq_lens_cpu
                or plan.query_lens != md.query_lens_cpu):
            plan = self._build(md)
            self._plan_md, self._plan = md, plan
        return plan

    # ------------------------------------------------------------------ planning
    def _build(self, md: AttentionMetadata) -> KiviWritePlan:
        bs, r = self.block_size, self.residual_tokens
        self.step += 1
        tables = md.block_tables.cpu().numpy()
        starts = [0, *itertools.accumulate(md.query_lens_cpu)]
        slot = self._slot
        # block -> the batch row giving each offset's new value (-1: from its slot)
        quant: dict[int, np.ndarray] = {}
        fp_rows: list[np.ndarray] = []
        fp_blocks: list[np.ndarray] = []
        fp_offs: list[np.ndarray] = []
        touched: dict[int, int] = {}  # block -> fill after this batch (blocks staying fp)
        for i, (q, seq_len) in enumerate(zip(md.query_lens_cpu, md.seq_lens_cpu, strict=True)):
            if q <= 0:
                continue
            s, row0, row = seq_len - q, starts[i], tables[i]
            nq = max(0, seq_len - r) // bs  # blocks [0, nq) are quantized after this batch
            j0 = s // bs
            old = row[: min(j0, nq)]  # due before this batch; fp if the window just moved
            for b in old[slot[old] >= 0].tolist():  # (or a prefix hit on an fp block)
                quant.setdefault(b, np.full(bs, -1, dtype=np.int64))
            for j in range(j0, (seq_len - 1) // bs + 1):
                b = int(row[j])
                p0, p1 = max(s, j * bs), min(seq_len, (j + 1) * bs)
                if p0 > j * bs and slot[b] < 0:
                    raise RuntimeError(
                        f"KIVI KV: block {b} is written at offset {p0 - j * bs} but holds no "
                        "residual slot (its earlier rows were quantized): internal error"
                    )
                new = np.arange(row0 + p0 - s, row0 + p1 - s, dtype=np.int64)
                if j < nq:
                    quant.setdefault(b, np.full(bs, -1, dtype=np.int64))[
                        p0 - j * bs : p1 - j * bs] = new
                else:
                    fp_rows.append(new)
                    fp_blocks.append(np.full(len(new), b, dtype=np.int64))
                    fp_offs.append(np.arange(p0 - j * bs, p1 - j * bs, dtype=np.int64))
                    touched[b] = p1 - j * bs
        written = set(touched) | set(quant)
        for b in self.pending_release - written:
            if slot[b] >= 0:
                if self.fill[b] == bs:
                    quant.setdefault(b, np.full(bs, -1, dtype=np.int64))
                else:  # a finished request's partial block: nobody reads it again
                    self.free_slots.append(int(slot[b]))
                    slot[b] = -1
        self.pending_release.clear()
        q_blocks: list[int] = []
        q_slot_rows: list[np.ndarray] = []
        q_new_rows: list[np.ndarray] = []

        def quantize_later(b: int, src: np.ndarray) -> None:
            """Read block b from its slot (where src < 0) and src's rows; free its slot."""
            if slot[b] < 0 and (src < 0).any():
                raise RuntimeError(f"KIVI KV: block {b} has rows in neither a slot nor this "
                                   "batch: internal error")
            base = max(int(slot[b]), 0) * bs
            q_blocks.append(b)
            q_slot_rows.append(base + np.arange(bs, dtype=np.int64))
            q_new_rows.append(src)
            if slot[b] >= 0:
                self.free_slots.append(int(slot[b]))
                slot[b] = -1

        for b, src in quant.items():
            quantize_later(b, src)
        for b, fill in touched.items():
            if slot[b] < 0:
                if not self.free_slots:
                    self._evict(set(touched), quantize_later)
                slot[b] = self.free_slots.pop()
            self.fill[b] = fill
            self.last_write[b] = self.step
        if self.slot_of_device is not self.slot_of:
            self.slot_of_device.copy_(self.slot_of, non_blocking=True)
        dev = md.slot_mapping.device
        if fp_rows:
            blocks = np.concatenate(fp_blocks)
            fp_dst = slot[blocks] * bs + np.concatenate(fp_offs)
            rows = np.concatenate(fp_rows)
        else:
            fp_dst = rows = np.zeros(0, dtype=np.int64)
        news = np.concatenate(q_new_rows) if q_blocks else np.zeros(0, dtype=np.int64)
        return KiviWritePlan(
            query_lens=list(md.query_lens_cpu),
            seq_lens=list(md.seq_lens_cpu),
            starts=starts,
            fp_rows=_long(rows, dev),
            fp_dst=_long(fp_dst, dev),
            quant_blocks=_long(q_blocks, dev),
            quant_slot_rows=_long(np.concatenate(q_slot_rows) if q_blocks else news, dev),
            quant_new_rows=_long(np.maximum(news, 0), dev),
            quant_from_new=torch.as_tensor(news >= 0).to(dev),
        )

    def _evict(self, keep: set[int], quantize_later: Callable[[int, np.ndarray], None]) -> None:
        """The pool is full: quantize the least recently written full fp block that this batch
        does not write (earlier than its window asks: counted in forced_quantizations)."""
        held = np.nonzero(self._slot >= 0)[0]
        full = [int(b) for b in held if self.fill[b] == self.block_size and int(b) not in keep]
        if not full:
            raise RuntimeError(
                f"KIVI KV: the residual pool's {self.num_slots} slots are all held by blocks "
                "still being filled; raise max_num_seqs (the pool is sized from it) or lower "
                "the batch's concurrency"
            )
        victim = min(full, key=lambda b: self.last_write[b])
        self.forced_quantizations += 1
        quantize_later(victim, np.full(self.block_size, -1, dtype=np.int64))

    # ------------------------------------------------------------------ copy-on-write
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write (src, dst) in every layer: codes and scales, and the residual rows
        when src is still full precision (dst takes a slot of its own)."""
        for src, dst in pairs:
            for layer in self.layers:
                for t in layer.block_tensors():
                    t[dst] = t[src]
            s, d = int(self._slot[src]), int(self._slot[dst])
            if s < 0:
                if d >= 0:
                    self.free_slots.append(d)
                    self._slot[dst] = -1
                continue
            if d < 0:
                if not self.free_slots:
                    raise RuntimeError(f"KIVI KV: no free residual slot to copy block {src}")
                d = self.free_slots.pop()
                self._slot[dst] = d
            for layer in self.layers:
                layer.residual[:, d] = layer.residual[:, s]
            self.fill[dst], self.last_write[dst] = self.fill[src], self.step
        if self.slot_of_device is not self.slot_of:
            self.slot_of_device.copy_(self.slot_of)


@dataclass
class KiviLayerCache:
    """One layer's quantized blocks and residual slots (see the module docstring)."""

    layout: KiviLayout
    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_scale: torch.Tensor
    k_zero: torch.Tensor
    v_scale: torch.Tensor
    v_zero: torch.Tensor
    residual: torch.Tensor
    residual_map: KiviResidualMap = field(repr=False)

    def block_tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors indexed by block id (first dim)."""
        return (self.k_codes, self.v_codes, self.k_scale, self.k_zero, self.v_scale,
                self.v_zero)

    @property
    def nbytes(self) -> int:
        """Bytes held: quantized blocks and the residual pool."""
        return sum(t.numel() * t.element_size() for t in (*self.block_tensors(), self.residual))


def allocate_kivi_caches(
    num_layers: int, num_blocks: int, layout: KiviLayout, num_slots: int,
    residual_tokens: int, dtype: torch.dtype, device: torch.device,
    zeros: Zeros | None = None,
) -> tuple[list[torch.Tensor], KiviResidualMap]:
    """One handle per layer (see the module docstring) and the shared residual map."""
    z: Zeros = zeros or (lambda shape, dt, dev: torch.zeros(shape, dtype=dt, device=dev))
    bs, h, d = layout.block_size, layout.num_kv_heads, layout.head_dim
    rmap = KiviResidualMap(num_blocks, num_slots, bs, residual_tokens, device)
    handles = []
    for _ in range(num_layers):
        layer = KiviLayerCache(
            layout=layout,
            k_codes=z((num_blocks, bs, h, layout.packed_dim), torch.uint8, device),
            v_codes=z((num_blocks, bs, h, layout.packed_dim), torch.uint8, device),
            k_scale=z((num_blocks, h, d), SCALE_DTYPE, device),
            k_zero=z((num_blocks, h, d), SCALE_DTYPE, device),
            v_scale=z((num_blocks, bs, h, layout.num_groups), SCALE_DTYPE, device),
            v_zero=z((num_blocks, bs, h, layout.num_groups), SCALE_DTYPE, device),
            residual=z((2, num_slots, bs, h, d), dtype, device),
            residual_map=rmap,
        )
        rmap.layers.append(layer)
        handle = torch.empty((2, num_blocks, bs, h, d), dtype=torch.uint8, device="meta")
        handle.kivi = layer  # type: ignore[attr-defined]  # rides on the handle
        handles.append(handle)
    return handles, rmap


def get_kivi(kv_cache: torch.Tensor) -> KiviLayerCache | None:
    return getattr(kv_cache, "kivi", None)


# ---------------------------------------------------------------------- write and read
def write_kivi(
    key: torch.Tensor, value: torch.Tensor, cache: KiviLayerCache, plan: KiviWritePlan
) -> None:
    """Apply the batch's plan to one layer: first quantize the blocks leaving the window (from
    their old slots and the new rows), then write the new rows of the window's blocks to
    their slots (a slot freed above may be handed out again below)."""
    lay = cache.layout
    bs, h, d = lay.block_size, lay.num_kv_heads, lay.head_dim
    m = plan.quant_blocks.numel()
    if m:
        rows = []
        for res, new in ((cache.residual[0], key), (cache.residual[1], value)):
            old = res.reshape(-1, h, d).index_select(0, plan.quant_slot_rows)
            fresh = new.index_select(0, plan.quant_new_rows).to(old.dtype)
            rows.append(torch.where(plan.quant_from_new.view(-1, 1, 1), fresh, old)
                        .view(m, bs, h, d))
        codes, scale, zero = quantize_keys(rows[0], lay.bits)
        cache.k_codes.index_copy_(0, plan.quant_blocks, codes)
        cache.k_scale.index_copy_(0, plan.quant_blocks, scale)
        cache.k_zero.index_copy_(0, plan.quant_blocks, zero)
        codes, scale, zero = quantize_values(rows[1], lay.bits, lay.group_size)
        cache.v_codes.index_copy_(0, plan.quant_blocks, codes)
        cache.v_scale.index_copy_(0, plan.quant_blocks, scale)
        cache.v_zero.index_copy_(0, plan.quant_blocks, zero)
    if plan.fp_rows.numel():
        for res, new in ((cache.residual[0], key), (cache.residual[1], value)):
            flat = res.view(-1, h, d)
            flat.index_copy_(0, plan.fp_dst, new.index_select(0, plan.fp_rows).to(flat.dtype))


def gather_kivi(
    cache: KiviLayerCache, block_ids: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of blocks `block_ids` (any shape S) as [*S, block_size, Hkv, D] in `dtype`:
    the dequantized codes (float32, then cast), or the residual's rows where a block has a
    slot. The torch twin of the kernels' in-place reads."""
    lay = cache.layout
    ids = block_ids.reshape(-1)
    k = dequantize_keys(cache.k_codes[ids], cache.k_scale[ids], cache.k_zero[ids], lay.bits)
    v = dequantize_values(cache.v_codes[ids], cache.v_scale[ids], cache.v_zero[ids], lay.bits)
    slots = cache.residual_map.slot_of_device[ids]
    fp = slots >= 0
    if bool(fp.any()):
        s = slots.clamp(min=0)
        m = fp.view(-1, 1, 1, 1)
        k = torch.where(m, cache.residual[0][s].float(), k)
        v = torch.where(m, cache.residual[1][s].float(), v)
    shape = (*block_ids.shape, lay.block_size, lay.num_kv_heads, lay.head_dim)
    return k.to(dtype).view(shape), v.to(dtype).view(shape)
