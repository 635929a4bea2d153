"""The "triton" attention backend: paged attention with the Triton kernels in `kernels.triton`.

Per layer and batch (see `workbench.attention.backends` for the contract):

    reshape_and_cache        new K/V rows -> kv_cache at slot_mapping (-1 skipped)
    max_query_len == 1  ->   paged_decode_attention   split-KV decode, one token per sequence
    otherwise           ->   paged_prefill_attention  the whole batch (prefill chunks, prefix
                                                      hits and decode rows alike)

Default on CUDA; on CPU the kernels run under Triton's interpreter (correct, slow: for tests).

FP8 KV cache (float8_e4m3fn): numerics as in `torch_backend` (stored = e4m3(clamp(x / scale,
+-448)), read = float(stored) * scale), with the layer's `KVCacheScales`. The kernels read the
scales from two 1-element float32 device tensors per cache tensor that this backend keeps
(`kv_scale_tensors`) and refreshes in place (`fill_`) whenever the KVCacheScales values differ
from what they hold, so a captured CUDA graph reads the new values on its next replay. With
`calibrate` set, the first forward that writes real tokens (a prefill, in the engine) sets the
scales to amax / 448 first; that step uses host syncs, so it is skipped while a CUDA graph is
being captured (the engine also holds calibration off during capture).

CUDA-graph contract of the decode path (max_query_len == 1; `cudagraph_safe` = True):
- sequence i owns query row i; rows past len(seq_lens) (padding tokens) are zeros;
- it reads only the metadata's device tensors `slot_mapping`, `seq_lens`, `block_tables` and
  their shapes; never `seq_lens_cpu`, `query_lens_cpu` or `max_seq_len`; no `.item()`,
  `.tolist()` or other host sync; no allocation whose size depends on values;
- `num_splits` = `choose_num_splits(batch size, block-table width, KV heads, block size,
  device)`: a pure function of shapes and the device's SM count, so a replay with new values
  runs the same grid; splits past a sequence's context produce lse = -inf and the merge
  ignores them, and a padding sequence (seq_len 0) gets zeros;
- scratch buffers (partial outputs, lse) are allocated per call with sizes from shapes only.
The prefill path may use the host's `max_query_len` (its grid) and is never captured.

KIVI low-bit KV (kv_cache_dtype int8 / int4 / int2): `workbench.attention.kivi_attention`
writes (planned on the host: not capturable, the runner keeps CUDA graphs off) and prefills
with the torch path; decodes run `paged_decode_attention_kivi`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from kernels.triton.paged_decode import paged_decode_attention, paged_decode_attention_kivi
from kernels.triton.paged_prefill import paged_prefill_attention
from kernels.triton.reshape_and_cache import reshape_and_cache
from workbench.attention.backends import AttentionBackend
from workbench.attention.kivi_attention import forward_kivi, is_kivi_kv
from workbench.attention.kivi_cache import KiviLayerCache
from workbench.attention.metadata import (
    AttentionMetadata,
    KVCacheScales,
    get_kv_scales,
    is_fp8_kv,
)
from workbench.core.kv_cache.utils import fp8_kv_scale


@dataclass
class _DeviceScales:
    """The [1] float32 device tensors the kernels read, and the values they were last set to."""

    k_scale: torch.Tensor
    v_scale: torch.Tensor
    k_value: float
    v_value: float


def calibrate_kv_scales(
    key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, scales: KVCacheScales
) -> None:
    """torch_backend's calibration: scales <- amax(|K|) / 448, amax(|V|) / 448 over the tokens
    written (slot >= 0); a batch with none leaves the flag set. Host syncs: never on capture."""
    valid = (slot_mapping >= 0).view(-1, 1, 1)
    if not bool(valid.any()):
        return
    amax = [float(torch.where(valid, x.abs(), 0).amax()) for x in (key, value)]
    scales.k_scale, scales.v_scale = fp8_kv_scale(amax[0]), fp8_kv_scale(amax[1])
    scales.calibrate = False


def triton_kivi_decode(
    query: torch.Tensor, cache: KiviLayerCache, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Decode over a KIVI cache with the Triton kernel (reads the codes in place)."""
    return paged_decode_attention_kivi(
        query, cache.k_codes, cache.v_codes, cache.k_scale, cache.k_zero, cache.v_scale,
        cache.v_zero, cache.residual[0], cache.residual[1], cache.residual_map.slot_of_device,
        block_tables, seq_lens, scale, cache.layout.bits,
    )


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class TritonAttentionBackend(AttentionBackend):
    """Paged attention through the Triton kernels; decode batches are CUDA-graph capturable
    (see the module docstring for the contract)."""

    name = "triton"
    cudagraph_safe = True

    def __init__(self) -> None:
        # per fp8 cache tensor (weakly held: a freed cache drops its entry)
        self._scales: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def kv_scale_tensors(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_scale, v_scale) as [1] float32 tensors on the cache's device, the same tensors on
        every call for this cache, refreshed in place from its KVCacheScales (1.0 when none)."""
        scales = get_kv_scales(kv_cache) or KVCacheScales()
        entry: _DeviceScales | None = self._scales.get(kv_cache)
        if entry is None:

            def full(value: float) -> torch.Tensor:
                return torch.full((1,), value, dtype=torch.float32, device=kv_cache.device)

            entry = _DeviceScales(
                full(scales.k_scale), full(scales.v_scale), scales.k_scale, scales.v_scale
            )
            self._scales[kv_cache] = entry
        if entry.k_value != scales.k_scale:
            entry.k_scale.fill_(scales.k_scale)
            entry.k_value = scales.k_scale
        if entry.v_value != scales.v_scale:
            entry.v_scale.fill_(scales.v_scale)
            entry.v_value = scales.v_scale
        return entry.k_scale, entry.v_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        md = attn_metadata
        if is_kivi_kv(kv_cache):  # int8 / int4 / int2 KV: the Triton decode kernel reads it
            return forward_kivi(query, key, value, kv_cache, md, scale, triton_kivi_decode)
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        k_scale = v_scale = None
        if is_fp8_kv(kv_cache):
            scales = get_kv_scales(kv_cache)
            if scales is not None and scales.calibrate and not _capturing(query.device):
                calibrate_kv_scales(key, value, md.slot_mapping, scales)
            k_scale, v_scale = self.kv_scale_tensors(kv_cache)
        reshape_and_cache(key, value, key_cache, value_cache, md.slot_mapping, k_scale, v_scale)

        num_tokens, num_heads, head_dim = query.shape
        if md.max_query_len == 1:
            num_seqs = md.seq_lens.shape[0]  # sequence i owns row i
            out = query.new_empty(num_tokens, num_heads, head_dim)
            paged_decode_attention(
                query[:num_seqs], key_cache, value_cache, md.block_tables, md.seq_lens, scale,
                k_scale, v_scale, out=out[:num_seqs],
            )  # fmt: skip
            if num_tokens > num_seqs:
                out[num_seqs:].zero_()
            return out
        out = query.new_zeros(num_tokens, num_heads, head_dim)  # padding rows stay zero
        return paged_prefill_attention(
            query, key_cache, value_cache, md.block_tables, md.seq_lens, md.query_start_loc,
            md.max_query_len, scale, k_scale, v_scale, out=out,
        )  # fmt: skip
