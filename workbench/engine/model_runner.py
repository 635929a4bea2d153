"""ModelRunner: SchedulerOutput -> flat batch -> forward -> sampled token ids.

    scheduled requests  r0 (decode, 1 token) | r1 (prefill chunk, 5 tokens) | r2 (decode)
    input_ids           [t0 | t1 t2 t3 t4 t5 | t6]
    positions           [p  | c c+1 ... c+4  | q ]        c = r1.num_computed_tokens
    query_start_loc     [0, 1, 6, 7]
    slot_mapping[t]     block_table[r][pos // block_size] * block_size + pos % block_size

Only requests whose computed tokens reach their end this step are sampled (a prefill's last
chunk emits the first output token; a middle chunk emits nothing).
"""

from __future__ import annotations

import numpy as np
import torch

from workbench.attention.metadata import AttentionMetadata
from workbench.calc import cdiv, kv_bytes_per_block
from workbench.config import EngineConfig
from workbench.engine.request import Request
from workbench.engine.scheduler_output import SchedulerOutput
from workbench.layers.sampler import Sampler
from workbench.models.loader import load_model
from workbench.profiling import nvtx_range

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, attention_backend: str = "torch") -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = _DTYPES[config.torch_dtype_name]
        self.block_size = config.cache_config.block_size
        mc = config.model_config
        self.num_layers, self.num_kv_heads, self.head_dim = (
            mc.num_layers, mc.num_kv_heads, mc.head_dim
        )
        torch.manual_seed(mc.seed)
        self.model = load_model(mc, self.dtype, self.device, attention_backend=attention_backend)
        self.sampler = Sampler(mc.seed, self.device)
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0

    # ----------------------------------------------------------------- memory
    @property
    def weight_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in list(self.model.parameters()) + list(self.model.buffers()):
            if p.data_ptr() in seen:
                continue  # tied embeddings count once
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
        return total

    @property
    def bytes_per_block(self) -> int:
        return kv_bytes_per_block(
            self.num_layers, self.num_kv_heads, self.head_dim,
            torch.empty((), dtype=self.dtype).element_size(), self.block_size,
        )

    def allocate_kv_cache(self, num_blocks: int) -> None:
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.num_layers)
        ]
        self.num_blocks = num_blocks
        self.model.bind_kv_cache(self.kv_caches)

    # ---------------------------------------------------------------- execute
    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> dict[str, list[int]]:
        if out.is_empty:
            return {}
        if out.blocks_to_copy:
            self.copy_blocks(out.blocks_to_copy)
        with nvtx_range("model_runner.prepare_inputs"):
            input_ids, positions, meta, logits_idx, to_sample = self.prepare_inputs(out)
        with nvtx_range(f"model_runner.forward prefill={out.num_prefill_tokens} "
                        f"decode={out.num_decode_tokens}"):
            hidden = self.model(input_ids, positions, meta)
        if not to_sample:
            return {}
        spec = out.scheduled_spec_decode_tokens
        with nvtx_range("model_runner.sample"):
            logits = self.model.compute_logits(hidden[logits_idx])
            if not spec:
                tokens = self.sampler(logits, to_sample)
                return {r.request_id: [t] for r, t in zip(to_sample, tokens, strict=True)}
            drafts = [spec.get(r.request_id, []) for r in to_sample]
            accepted = self.sampler.verify(logits, to_sample, drafts)
        return {r.request_id: a for r, a in zip(to_sample, accepted, strict=True)}

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]

    def prepare_inputs(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, list[Request]]:
        reqs = out.scheduled_requests
        num_sched = out.num_scheduled_tokens
        token_ids: list[int] = []
        starts: list[int] = []
        q_lens: list[int] = []
        to_sample: list[Request] = []
        logits_idx: list[int] = []
        total = 0
        for req in reqs:
            n = num_sched[req.request_id]
            start = req.num_computed_tokens
            end = start + n
            all_ids = req.all_token_ids
            if end <= len(all_ids):
                if n == 1:
                    token_ids.append(all_ids[start])
                else:
                    token_ids.extend(all_ids[start:end])
            else:  # draft tokens follow the confirmed ones (scheduler trimmed them to fit)
                token_ids.extend(all_ids[start:])
                token_ids.extend(out.scheduled_spec_decode_tokens[req.request_id])
            starts.append(start)
            q_lens.append(n)
            total += n
            if end >= len(all_ids):
                to_sample.append(req)
                if end == len(all_ids):
                    logits_idx.append(total - 1)
                else:  # the last confirmed token and every draft are scored
                    logits_idx.extend(range(total - 1 - (end - len(all_ids)), total))
        input_ids, positions, meta = self.build_batch(
            token_ids, starts, q_lens, [out.block_ids[r.request_id] for r in reqs]
        )
        logits_rows = torch.tensor(logits_idx, dtype=torch.int64, device=self.device)
        return input_ids, positions, meta, logits_rows, to_sample

    def build_batch(
        self,
        token_ids: list[int],
        starts: list[int],
        q_lens: list[int],
        block_ids: list[list[int]],
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat batch tensors: sequence i brings q_lens[i] tokens (consecutive in token_ids)
        at positions starts[i].., its KV slots from block_ids[i]."""
        bs = self.block_size
        num_reqs = len(q_lens)
        total = len(token_ids)
        seq_lens = [s + q for s, q in zip(starts, q_lens, strict=True)]
        q_arr = np.asarray(q_lens, dtype=np.int64)
        cu = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(q_arr, out=cu[1:])
        req_idx = np.repeat(np.arange(num_reqs, dtype=np.int64), q_arr)
        positions = np.arange(total, dtype=np.int64) - cu[:-1][req_idx] + np.asarray(
            starts, dtype=np.int64
        )[req_idx]
        max_seq_len = max(seq_lens)
        width = cdiv(max_seq_len, bs)
        table = np.zeros((num_reqs, width), dtype=np.int64)
        for i, ids in enumerate(block_ids):
            k = min(len(ids), width)
            table[i, :k] = ids[:k]
        slots = table[req_idx, positions // bs] * bs + positions % bs
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots).to(dev),
            query_start_loc=torch.from_numpy(cu).to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            block_tables=torch.from_numpy(table).to(dev),
            query_lens_cpu=list(q_lens),
            seq_lens_cpu=seq_lens,
            max_query_len=max(q_lens),
            max_seq_len=max_seq_len,
        )
        return (
            torch.tensor(token_ids, dtype=torch.int64, device=dev),
            torch.from_numpy(positions).to(dev),
            meta,
        )
