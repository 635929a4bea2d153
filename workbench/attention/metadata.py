"""AttentionMetadata: what the model runner tells every attention layer about one flat batch.

The batch is a flat list of `num_tokens` new tokens from `num_seqs` sequences, sequence i
owning tokens [query_start_loc[i], query_start_loc[i+1]). Its new tokens are the *last*
query_len_i positions of a context of seq_lens[i] tokens, so query token j of sequence i sits
at position seq_lens[i] - query_len_i + j and attends to context positions 0..that (causal).
There is no prefill/decode flag: a decode is simply query_len == 1.

    block_tables[i] = [b0, b1, b2, ...]   context position p lives in block
                                          block_tables[i][p // block_size], offset p % block_size
    slot_mapping[t] = block * block_size + offset where new token t's K/V is written;
                      -1 for padding tokens (skipped)

KV cache layout per layer (one tensor): [2, num_blocks, block_size, num_kv_heads, head_dim]
(index 0 = K, 1 = V). Block 0 is the null block: block tables are padded with it.

KV compression (docs/kv_compression.md): `kv_scores` asks every layer of this forward to
record attention scores (a `KVScoreRecorder`: `workbench.attention.scores.KVScoreRequest`);
`layer_metadata` maps a layer's KV cache tensor (its data_ptr) to the metadata that layer
attends with when layers keep different blocks (PyramidKV): the same queries and
slot_mapping, its own block_tables and seq_lens (`for_layer`).

FP8 KV cache: the tensor's dtype is float8_e4m3fn and the layer's scales ride on the tensor
itself (`attach_kv_scales` / `get_kv_scales`, a `KVCacheScales` with k_scale and v_scale;
missing = 1.0). Stored = e4m3(clamp(x / scale, -448, 448)), read = float(stored) * scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class KVScoreRecorder(Protocol):
    """What a layer calls when a forward asks for attention scores (implemented by
    `workbench.attention.scores.KVScoreRequest`; typed here so metadata imports nothing)."""

    def record(self, query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata,
               scale: float) -> None: ...


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = padding
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64 (cumulative query lengths)
    seq_lens: torch.Tensor  # [num_seqs] int64, context length including the new tokens
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks_per_seq] int64, padded with 0
    # Host-side copies so backends can plan without device syncs.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    max_query_len: int
    max_seq_len: int
    # KV compression: scores to record, and per-layer tables (see the module docstring)
    kv_scores: KVScoreRecorder | None = None
    layer_metadata: dict[int, AttentionMetadata] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    def for_layer(self, kv_cache: torch.Tensor) -> AttentionMetadata:
        """The metadata the layer owning `kv_cache` attends with (itself unless per-layer
        tables name that layer)."""
        if self.layer_metadata is None:
            return self
        return self.layer_metadata.get(kv_cache.data_ptr(), self)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


FP8_KV_DTYPE = torch.float8_e4m3fn


@dataclass
class KVCacheScales:
    """One layer's FP8 KV scales (vLLM's k_scale / v_scale, default 1.0).

    calibrate=True: the next forward that writes real tokens sets k_scale / v_scale to
    amax(|K|) / 448 and amax(|V|) / 448 over those tokens (`kv_cache.utils.fp8_kv_scale`), before
    quantizing them, then clears the flag; later values beyond amax saturate."""

    k_scale: float = 1.0
    v_scale: float = 1.0
    calibrate: bool = False


def attach_kv_scales(kv_cache: torch.Tensor, scales: KVCacheScales) -> None:
    """Bind a layer's scales to its KV cache tensor (the same object the layer holds)."""
    kv_cache.kv_scales = scales  # type: ignore[attr-defined]  # rides on the cache tensor


def get_kv_scales(kv_cache: torch.Tensor) -> KVCacheScales | None:
    return getattr(kv_cache, "kv_scales", None)


def is_fp8_kv(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == FP8_KV_DTYPE
