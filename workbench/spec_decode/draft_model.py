"""Draft-model proposer: a smaller model with its own paged KV cache beside the target's.

The draft's KV tensors have the target's shape in blocks and are indexed by the *same* block
ids (the target's KVCacheManager owns the block tables; the scheduler allocates k lookahead
slots so the draft can write ahead). After every engine step:

    1. catch-up: one draft forward over every scheduled request's tokens the draft has not
       seen, [num_draft_computed_tokens, num_computed_tokens), plus, for requests that now
       need drafts, their newest token (its logits give draft 1). So every token the target
       computed has draft KV in the same step, and prefix-cache hits are valid for both.
    2. k - 1 single-token draft forwards (drafts 2..k), batched over the drafting requests.

Drafts of greedy requests are the draft's argmax; sampled requests draw from the draft's
processed distribution q (temperature/top-k/top-p applied) and keep q for the rejection
sampler. Drafted positions are not counted in num_draft_computed_tokens: whatever the target
accepts is recomputed by the next catch-up, so rejected drafts need no rollback here.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from workbench.config import EngineConfig, ModelConfig
from workbench.engine.request import Request
from workbench.engine.scheduler_output import SchedulerOutput
from workbench.layers.sampler import Sampler
from workbench.models.tokenizer import load_tokenizer
from workbench.profiling import nvtx_range
from workbench.spec_decode.ngram import max_draft_tokens
from workbench.worker.model_runner import ModelRunner


def check_draft_compatible(target: ModelConfig, draft: ModelConfig) -> None:
    """The draft must share the target's vocabulary and tokenizer."""
    tv, dv = target.hf_config.get("vocab_size"), draft.hf_config.get("vocab_size")
    if tv != dv:
        raise ValueError(
            f"speculative_config model ({draft.model!r}) has vocab_size {dv}, the target "
            f"has {tv}; the draft must share the target's tokenizer and vocabulary"
        )
    t_vocab = load_tokenizer(target.model).get_vocab()
    d_vocab = load_tokenizer(draft.model).get_vocab()
    if t_vocab != d_vocab:
        diff = sorted(set(t_vocab.items()) ^ set(d_vocab.items()))[:3]
        raise ValueError(
            f"speculative_config model ({draft.model!r}) has a different tokenizer from the "
            f"target's (first differing entries: {diff}); the draft must share it"
        )


class DraftModelProposer:
    def __init__(self, config: EngineConfig) -> None:
        spec = config.speculative_config
        assert spec is not None and spec.model is not None and not isinstance(spec, dict)
        target = config.model_config
        draft_max_pos = ModelConfig(model=spec.model).max_model_len
        assert draft_max_pos is not None and target.max_model_len is not None
        if draft_max_pos < target.max_model_len:
            raise ValueError(
                f"speculative_config model ({spec.model!r}) supports {draft_max_pos} "
                f"positions, fewer than the target's max_model_len ({target.max_model_len}); "
                "lower max_model_len"
            )
        draft_mc = ModelConfig(
            model=spec.model, dtype=target.dtype, max_model_len=target.max_model_len,
            seed=target.seed,
        )
        check_draft_compatible(target, draft_mc)
        self.k = spec.num_speculative_tokens
        self.max_model_len = target.max_model_len
        self.runner = ModelRunner(replace(config, model_config=draft_mc, speculative_config=None))
        self.generator = torch.Generator(device=self.runner.device)
        self.generator.manual_seed(target.seed + 1)

    @property
    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    @torch.inference_mode()
    def propose(self, out: SchedulerOutput, drafting: list[Request]) -> None:
        """Catch the draft KV up on this step's tokens; set drafts on `drafting` requests."""
        runner = self.runner
        if out.blocks_to_copy:
            runner.copy_blocks(out.blocks_to_copy)
        want = {r.request_id: max_draft_tokens(r, self.k, self.max_model_len) for r in drafting}
        token_ids: list[int] = []
        starts: list[int] = []
        q_lens: list[int] = []
        tables: list[list[int]] = []
        rows: list[int] = []  # flat row of each drafting request's newest token
        rows_reqs: list[Request] = []
        for req in out.scheduled_requests:
            rid = req.request_id
            start = req.num_draft_computed_tokens
            end = req.num_computed_tokens + (1 if want.get(rid, 0) > 0 else 0)
            if end <= start:
                continue
            token_ids.extend(req.all_token_ids[start:end])
            starts.append(start)
            q_lens.append(end - start)
            tables.append(out.block_ids[rid])
            req.num_draft_computed_tokens = end
            if want.get(rid, 0) > 0:
                rows.append(len(token_ids) - 1)
                rows_reqs.append(req)
        for req in drafting:
            req.spec_token_ids = []
            req.spec_token_probs = None
        if not q_lens:
            return
        with nvtx_range(f"draft.catch_up tokens={len(token_ids)}"):
            logits = self._forward(token_ids, starts, q_lens, tables, rows)
        if not rows_reqs:
            return
        reqs = rows_reqs
        k_max = max(want[r.request_id] for r in reqs)
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list[list[torch.Tensor]] = [[] for _ in reqs]
        active = list(range(len(reqs)))
        for j in range(k_max):
            if j > 0:
                active = [i for i in active if want[reqs[i].request_id] > j]
                if not active:
                    break
                with nvtx_range(f"draft.step {j} seqs={len(active)}"):
                    logits = self._forward(
                        [drafts[i][-1] for i in active],
                        [reqs[i].num_tokens - 1 + j for i in active],
                        [1] * len(active),
                        [out.block_ids[reqs[i].request_id] for i in active],
                        list(range(len(active))),
                    )
            tokens, q = self._sample(logits, [reqs[i] for i in active])
            for row, i in enumerate(active):
                drafts[i].append(tokens[row])
                if q is not None and q[row] is not None:
                    probs[i].append(q[row])
        for i, req in enumerate(reqs):
            req.spec_token_ids = drafts[i]
            req.spec_token_probs = torch.stack(probs[i]) if probs[i] else None

    def _forward(
        self, token_ids: list[int], starts: list[int], q_lens: list[int],
        tables: list[list[int]], rows: list[int],
    ) -> torch.Tensor:
        runner = self.runner
        input_ids, positions, meta = runner.build_batch(token_ids, starts, q_lens, tables)
        hidden = runner.model(input_ids, positions, meta)
        if not rows:
            return hidden[:0]
        idx = torch.tensor(rows, dtype=torch.int64, device=runner.device)
        return runner.model.compute_logits(hidden[idx])

    def _sample(
        self, logits: torch.Tensor, reqs: list[Request]
    ) -> tuple[list[int], list[torch.Tensor | None] | None]:
        out = logits.argmax(dim=-1).tolist()
        sampled = [i for i, r in enumerate(reqs) if not r.sampling_params.greedy]
        if not sampled:
            return out, None
        q_rows: list[torch.Tensor | None] = [None] * len(reqs)
        probs = Sampler.sampling_probs(logits[sampled], [reqs[i] for i in sampled])
        for j, i in enumerate(sampled):
            out[i] = int(torch.multinomial(probs[j], 1, generator=self.generator))
            q_rows[i] = probs[j]
        return out, q_rows
