"""The worker's half of score-based KV eviction and per-layer tables (docs/kv_compression.md).

    SchedulerOutput.kv_score_queries[req] = (first, end)    logical query positions
        -> ScoreJob(seq, req, q_offset = first - num_computed, num_queries = end - first,
                    window = SnapKV's observation window (snapkv / pyramidkv), else 0)
        -> AttentionMetadata.kv_scores: every layer records (workbench.attention.scores)
        -> ModelRunnerOutput.kv_block_scores[req]: float32 [num_layers, len(block table row)]
    SchedulerOutput.kv_layer_drops[req][layer] = row positions that layer skips
        -> AttentionMetadata.layer_metadata[layer's cache]: the same batch with that
           request's row compacted to the layer's kept positions and its seq_len cut by
           block_size per skipped (full) block; slot_mapping unchanged (writes go to the
           shared table, which every layer keeps the written block of)

`attach` runs after the batch's metadata is built and before the forward; `collect` after
it. Nothing here runs without kv_compression_config.
"""

from __future__ import annotations

import numpy as np
import torch

from workbench.attention.metadata import AttentionMetadata
from workbench.attention.scores import KVScoreRequest, ScoreJob
from workbench.config.kv_compression import KVCompressionConfig
from workbench.core.sched.output import SchedulerOutput
from workbench.worker.request_state import CachedRequestState

POOLED_METHODS = ("snapkv", "pyramidkv")  # score the observation window, pooled


def attach(kc: KVCompressionConfig | None, out: SchedulerOutput,
           reqs: list[CachedRequestState], meta: AttentionMetadata,
           kv_caches: list[torch.Tensor]) -> KVScoreRequest | None:
    """Set `meta.kv_scores` and `meta.layer_metadata` for this step (reqs: batch order);
    returns the score request, or None when nothing is scored."""
    if kc is None or (not out.kv_score_queries and not out.kv_layer_drops):
        return None
    seq_of = {st.req_id: i for i, st in enumerate(reqs)}
    layer_of = {cache.data_ptr(): layer for layer, cache in enumerate(kv_caches)}
    row_positions = _attach_layer_tables(out, seq_of, meta, kv_caches)
    if not out.kv_score_queries:
        return None
    pooled = kc.method in POOLED_METHODS
    jobs = []
    for rid, (first, end) in out.kv_score_queries.items():
        i = seq_of.get(rid)
        if i is None or end <= first:
            continue
        st = reqs[i]
        window = 0
        if pooled:  # keys from the prompt's last window_size tokens on are the window
            window = max(0, end - max(0, st.num_prompt_tokens - kc.window_size))
        jobs.append(ScoreJob(i, rid, first - st.num_computed_tokens, end - first, window))
    if not jobs:
        return None
    request = KVScoreRequest(jobs, len(kv_caches), layer_of,
                             kernel_size=kc.kernel_size if pooled else 1,
                             pooling=kc.pooling, row_positions=row_positions)
    meta.kv_scores = request
    return request


def collect(request: KVScoreRequest | None, reqs: list[CachedRequestState]
            ) -> dict[str, np.ndarray]:
    """{req id: float32 [num_layers, len(its block table row)]} (zeros past what was
    scored)."""
    if request is None:
        return {}
    rows = {st.req_id: len(st.block_ids) for st in reqs}
    result = {}
    for rid, arr in request.scores.items():
        width = rows[rid] if rid in rows else int(arr.shape[1] or 0)
        fitted = np.zeros((arr.shape[0], width), dtype=np.float32)
        n = min(width, arr.shape[1])
        fitted[:, :n] = arr[:, :n]
        result[rid] = fitted
    return result


def _attach_layer_tables(out: SchedulerOutput, seq_of: dict[str, int], meta: AttentionMetadata,
                         kv_caches: list[torch.Tensor]) -> dict[tuple[str, int], list[int]]:
    """meta.layer_metadata from kv_layer_drops; returns each (request, layer)'s kept row
    positions (for mapping that layer's scores back to the shared row)."""
    if not out.kv_layer_drops:
        return {}
    bs = kv_caches[0].shape[2]
    per_layer: dict[int, dict[int, list[int]]] = {}  # layer -> seq -> kept row positions
    positions: dict[tuple[str, int], list[int]] = {}
    for rid, drops in out.kv_layer_drops.items():
        i = seq_of.get(rid)
        if i is None:
            continue
        num_cols = -(-meta.seq_lens_cpu[i] // bs)
        for layer, dropped in enumerate(drops):
            if not dropped:
                continue
            skip = set(dropped)
            kept = [k for k in range(num_cols) if k not in skip]
            per_layer.setdefault(layer, {})[i] = kept
            positions[(rid, layer)] = kept
    layer_md = {}
    for layer, seqs in per_layer.items():
        layer_md[kv_caches[layer].data_ptr()] = _layer_metadata(meta, seqs, bs)
    meta.layer_metadata = layer_md or None
    return positions


def _layer_metadata(meta: AttentionMetadata, kept: dict[int, list[int]], bs: int
                    ) -> AttentionMetadata:
    """`meta` with sequence i's row compacted to kept[i] (row positions, ascending)."""
    tables = meta.block_tables.clone()
    seq_lens = list(meta.seq_lens_cpu)
    for i, cols in kept.items():
        num_cols = -(-seq_lens[i] // bs)
        idx = torch.tensor(cols, dtype=torch.long, device=tables.device)
        row = meta.block_tables[i].index_select(0, idx)
        tables[i].zero_()
        tables[i, : len(cols)] = row
        seq_lens[i] -= (num_cols - len(cols)) * bs
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        query_start_loc=meta.query_start_loc,
        seq_lens=torch.tensor(seq_lens, dtype=meta.seq_lens.dtype, device=meta.seq_lens.device),
        block_tables=tables,
        query_lens_cpu=meta.query_lens_cpu,
        seq_lens_cpu=seq_lens,
        max_query_len=meta.max_query_len,
        max_seq_len=max(seq_lens) if seq_lens else 0,
    )
