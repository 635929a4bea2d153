"""The scoring path of KV eviction: how much attention cached keys receive, per block.

H2O, SnapKV and PyramidKV choose which KV blocks to keep from attention scores. The model
runner asks for them by setting `AttentionMetadata.kv_scores` to a `KVScoreRequest` naming
the sequences (jobs) to score; every attention layer of that forward then calls
`KVScoreRequest.record` (one line in the backend, after the K/V write), which fills, per
request, a float32 array [num_layers, num_blocks]: column b is the score of the block at
position b of the request's (shared) block table row.

    job.window == 0 (h2o):  the step's query tokens the job names (H2O: all of them); per
                            token score[p] = sum over query heads h and queries j of
                                       softmax_p(scale * q_{j,h} . k_{p, h // G})
                            over all keys the query sees (causal); block score = sum of its
                            tokens' scores. The policy accumulates these step after step, so a
                            token's total is the attention of every query since it was written.
    job.window == w (snapkv / pyramidkv):  the queries are the observation window (the
                            prompt's last positions, as many as the prefill's last chunk
                            holds); keys are the context before the prompt's last w tokens; per
                            head the probabilities are summed over the window's queries, then
                            pooled over neighbouring tokens (1-D, `kernel_size`, stride 1,
                            padding kernel_size // 2: max pooling, or average pooling counting
                            the padding as zeros as SnapKV does), then summed over heads; block
                            score = sum over its tokens before the window (the window's blocks
                            are kept regardless and score 0 for the window's tokens).

GQA: query head h reads kv head h // G (G = Hq / Hkv), as the attention does. The
probabilities come from the C++ kernel `kernels.cpu.attn_scores` on CPU (K read in place
through the block table) or from its twin `window_probs_torch` (gather + masked softmax in
fp32); an FP8 cache is dequantized by the twin (the kernel declines it). KIVI low-bit caches
are not scored (EngineConfig refuses eviction with them).

The scores never change what attention computes: they are a second, read-only pass over K.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from kernels.cpu.attn_scores import attention_scores as _kernel_scores
from workbench.attention.metadata import (
    FP8_KV_DTYPE,
    AttentionMetadata,
    get_kv_scales,
    is_fp8_kv,
)

# The C++ kernel on CPU when it builds (WORKBENCH_CPU_KERNELS=0 or this flag off: the twin).
USE_CPU_SCORES_KERNEL = os.environ.get("WORKBENCH_CPU_KERNELS", "1") != "0"
POOLINGS = ("max", "avg")
# the twin scores at most this many queries at a time (bounds its [Hq, rows, S] logits)
_QUERY_CHUNK = 256


@dataclass(frozen=True)
class ScoreJob:
    """One sequence of the batch to score.

    seq: its index in the metadata; req_id keys the result. The queries are its new tokens
    q_offset .. q_offset + num_queries - 1 of this step (all of them for H2O). window: 0 =
    H2O (every key the queries see); w > 0 = SnapKV: the last w keys before the span's end
    are the observation window, left out of the scores, and the rest is pooled."""

    seq: int
    req_id: str
    q_offset: int
    num_queries: int
    window: int = 0


@dataclass
class KVScoreRequest:
    """What the runner asks of one forward's attention layers, and where they put the scores.

    layer_of maps a layer's KV cache tensor (its data_ptr) to the layer index. scores maps a
    request id to float32 [num_layers, num_columns]: column k is row position k of the
    request's shared block table (num_columns grows to the widest row scored; zeros where a
    layer attended over fewer blocks). row_positions[(req_id, layer)], when a layer attends
    over its own subset of the row (per-layer tables), lists the shared row position of each
    of that layer's row positions; its skipped positions score 0."""

    jobs: list[ScoreJob]
    num_layers: int
    layer_of: dict[int, int]
    kernel_size: int = 1
    pooling: str = "max"
    row_positions: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    scores: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = self.kernel_size
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise ValueError(f"kernel_size ({k!r}) must be an odd integer >= 1")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling ({self.pooling!r}) must be one of {POOLINGS}")

    def record(self, query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata,
               scale: float) -> None:
        """Score this layer's jobs: query [T, Hq, D] (the batch's new tokens), kv_cache the
        layer's [2, num_blocks, bs, Hkv, D] with this forward's K already written, md the
        metadata this layer attended with."""
        if not self.jobs:
            return
        layer = self.layer_of[kv_cache.data_ptr()]
        bs = kv_cache.shape[2]
        starts = [0, *itertools.accumulate(md.query_lens_cpu)]
        seqs, q_start, q_count, ctx_lens, key_end = [], [], [], [], []
        for job in self.jobs:
            q_len, s = md.query_lens_cpu[job.seq], md.seq_lens_cpu[job.seq]
            if job.q_offset < 0 or job.q_offset + job.num_queries > q_len:
                raise ValueError(f"score job {job}: queries outside the step's {q_len} tokens")
            ctx = s - q_len + job.q_offset + job.num_queries  # what the last query sees
            seqs.append(job.seq)
            q_start.append(starts[job.seq] + job.q_offset)
            q_count.append(job.num_queries)
            ctx_lens.append(ctx)
            key_end.append(ctx if job.window == 0 else max(0, ctx - job.window))
        idx = torch.tensor(seqs, dtype=torch.long, device=md.block_tables.device)
        lens_t, start_t, count_t, end_t = (torch.tensor(v, dtype=torch.long)
                                           for v in (ctx_lens, q_start, q_count, key_end))
        probs = window_probs(
            query, kv_cache[0], md.block_tables.index_select(0, idx), lens_t, start_t,
            count_t, end_t, scale=scale, out_len=max(max(key_end), 1),
            k_scale=_k_scale(kv_cache),
        )
        for i, job in enumerate(self.jobs):
            end = key_end[i]
            per_head = probs[i, :, :end]
            if job.window and self.kernel_size > 1 and end:
                per_head = pool_tokens(per_head, self.kernel_size, self.pooling)
            nb = -(-md.seq_lens_cpu[job.seq] // bs)
            self._store(job.req_id, layer, block_sums(per_head.sum(0), bs, nb))

    def _store(self, req_id: str, layer: int, sums: np.ndarray) -> None:
        cols = self.row_positions.get((req_id, layer))
        width = sums.shape[0] if cols is None else (max(cols[: sums.shape[0]], default=-1) + 1)
        arr = self.scores.get(req_id)
        if arr is None or arr.shape[1] < width:
            grown = np.zeros((self.num_layers, width), dtype=np.float32)
            if arr is not None:
                grown[:, : arr.shape[1]] = arr
            self.scores[req_id] = arr = grown
        if cols is None:
            arr[layer, : sums.shape[0]] = sums
        else:
            arr[layer, cols[: sums.shape[0]]] = sums[: len(cols)]


def _k_scale(kv_cache: torch.Tensor) -> float | None:
    if not is_fp8_kv(kv_cache):
        return None
    scales = get_kv_scales(kv_cache)
    return 1.0 if scales is None else scales.k_scale


def window_probs(
    query: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, q_start: torch.Tensor, q_count: torch.Tensor,
    key_end: torch.Tensor, scale: float, out_len: int, k_scale: float | None = None,
) -> torch.Tensor:
    """The C++ kernel on CPU when it is on and takes the inputs, else `window_probs_torch`;
    the same arguments and result (see the twin)."""
    if USE_CPU_SCORES_KERNEL and k_scale is None and query.device.type == "cpu":
        out = _kernel_scores(query, k_cache, block_tables, seq_lens, q_start, q_count,
                             key_end, scale, out_len)
        if out is not None:
            return out
    return window_probs_torch(query, k_cache, block_tables, seq_lens, q_start, q_count,
                              key_end, scale, out_len, k_scale)


def window_probs_torch(
    query: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, q_start: torch.Tensor, q_count: torch.Tensor,
    key_end: torch.Tensor, scale: float, out_len: int, k_scale: float | None = None,
) -> torch.Tensor:
    """query [T, Hq, D], k_cache [num_blocks, bs, Hkv, D] (fp8 with k_scale: dequantized),
    block_tables [n, W], seq_lens / q_start / q_count / key_end [n] -> float32
    [n, Hq, out_len]: out[i, h, p] = sum_j softmax_p(scale * q_{i,j,h} . k_{i,p,h // G}) for
    p < min(key_end[i], out_len), zeros elsewhere. Job i's query j is row q_start[i] + j at
    context position seq_lens[i] - q_count[i] + j and sees keys 0 .. that position."""
    n, hq, d = block_tables.shape[0], query.shape[1], query.shape[2]
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    out = torch.zeros(n, hq, out_len, dtype=torch.float32, device=query.device)
    flat = k_cache.reshape(k_cache.shape[0], -1)
    if flat.dtype == FP8_KV_DTYPE:  # gather the bytes (no fp8 indexing kernels on CPU)
        flat = flat.view(torch.uint8)
    for i in range(n):
        s, nq = int(seq_lens[i]), int(q_count[i])
        end = min(int(key_end[i]), s, out_len)
        if nq <= 0 or s <= 0 or end <= 0:
            continue
        blocks = block_tables[i, : -(-s // bs)].to(flat.device)
        k = flat.index_select(0, blocks).view(k_cache.dtype).view(-1, hkv, d)[:s]
        k = k.float() * k_scale if k_scale is not None else k.float()
        k = k.permute(1, 2, 0)  # [Hkv, D, S]
        q0 = int(q_start[i])
        for c in range(0, nq, _QUERY_CHUNK):
            rows = min(_QUERY_CHUNK, nq - c)
            q = query[q0 + c : q0 + c + rows].float()  # [rows, Hq, D]
            q = q.view(rows, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * rows, d)
            logits = torch.bmm(q, k).view(hkv, g, rows, s) * scale
            pos = torch.arange(s - nq + c, s - nq + c + rows, device=query.device)
            visible = torch.arange(s, device=query.device)[None, :] <= pos[:, None]
            logits = logits.masked_fill(~visible, float("-inf"))
            p = torch.softmax(logits, dim=-1).sum(2)  # [Hkv, G, S]
            out[i, :, :end] += p.reshape(hq, s)[:, :end]
    return out


def pool_tokens(scores: torch.Tensor, kernel_size: int, pooling: str) -> torch.Tensor:
    """[H, S] -> [H, S]: 1-D pooling over tokens per row, stride 1, padding kernel_size // 2
    (max: padding never wins; avg: the padding counts as zeros, divisor kernel_size)."""
    if kernel_size == 1:
        return scores
    x = scores.unsqueeze(1)  # [H, 1, S]
    pad = kernel_size // 2
    if pooling == "max":
        y = F.max_pool1d(x, kernel_size, stride=1, padding=pad)
    elif pooling == "avg":
        y = F.avg_pool1d(x, kernel_size, stride=1, padding=pad, count_include_pad=True)
    else:
        raise ValueError(f"pooling ({pooling!r}) must be one of {POOLINGS}")
    return y.squeeze(1)


def block_sums(token_scores: torch.Tensor, block_size: int, num_blocks: int) -> np.ndarray:
    """[S] per-token scores -> float32 [num_blocks]: block b sums tokens
    b * block_size .. (b + 1) * block_size - 1 (tokens past S count 0)."""
    x = token_scores.detach().float().cpu()
    padded = torch.zeros(num_blocks * block_size, dtype=torch.float32)
    m = min(x.shape[0], padded.shape[0])
    padded[:m] = x[:m]
    return padded.view(num_blocks, block_size).sum(1).numpy()
