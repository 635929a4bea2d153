"""Draft-model proposer: a smaller model with its own paged KV cache beside the target's.

The model runner owns it and calls `propose` inside `execute_model`, right after sampling
(vLLM V1's drafter, `workbench.spec_decode.proposer`), before the worker appends the sampled
tokens: a request's tokens are `all_token_ids + sampled[id]`, and its computed tokens after
the step are `num_computed_tokens + scheduled - rejected drafts`.

The draft's KV tensors have the target's shape in blocks and are indexed by the *same* block
ids (the target's KVCacheManager owns the block tables; the scheduler allocates k lookahead
slots so the draft can write ahead; the target runner's `copy_blocks` copies the draft's
blocks too). Every step:

    1. catch-up: one draft forward over every scheduled request's tokens the draft has not
       seen, [its draft progress, computed tokens after the step), plus, for requests
       that got tokens and may draft, their newest token (its logits give draft 1). So every
       token the target computed has draft KV in the same step, and prefix-cache hits are
       valid for both.
    2. k - 1 single-token draft forwards (drafts 2..k), batched over the drafting requests.

Drafts of greedy requests are the draft's argmax; sampled requests draw from the draft's
processed distribution q (temperature/top-k/top-p applied) and return q for the rejection
sampler. The draft progress (tokens whose draft KV is written) is the proposer's own
per-request state: set to num_computed_tokens when a request starts (a prefix-cache hit's
blocks hold the draft's KV too, it runs on every computed token) and advanced only when
`propose` returns. Drafted positions are not counted: whatever the target accepts is
recomputed by the next catch-up, so rejected drafts need no rollback here. Drafts of a
request that finishes in this step are dropped by the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import torch

from workbench.attention.metadata import AttentionMetadata
from workbench.config import EngineConfig, ModelConfig
from workbench.core.sched.output import SchedulerOutput
from workbench.models.interfaces import TextGenerationModel
from workbench.models.tokenizer import load_tokenizer
from workbench.profiling import nvtx_range
from workbench.sample.sampler import Sampler
from workbench.spec_decode.proposer import DraftProposal, Proposer, max_draft_tokens
from workbench.worker.request_state import CachedRequestState
from workbench.worker.sampling_metadata_builder import make_sampling_metadata


class DraftRunner(Protocol):
    """What the proposer uses of the draft model's runner (a `ModelRunner`)."""

    device: torch.device
    model: TextGenerationModel

    def build_batch(
        self, token_ids: list[int], starts: list[int], q_lens: list[int],
        block_ids: list[list[int]],
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]: ...


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


def draft_engine_config(config: EngineConfig) -> EngineConfig:
    """The draft model's runner config: the target's, with the draft's model (same dtype,
    max_model_len and seed) and no speculation; validated against the target."""
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
    return replace(config, model_config=draft_mc, speculative_config=None)


class DraftModelProposer(Proposer):
    def __init__(self, config: EngineConfig, runner: DraftRunner) -> None:
        """`runner`: the draft model's runner, built from `draft_engine_config(config)`."""
        spec = config.speculative_config
        assert spec is not None and not isinstance(spec, dict)
        assert config.model_config.max_model_len is not None
        self.num_speculative_tokens = spec.num_speculative_tokens
        self.max_model_len = config.model_config.max_model_len
        self.runner = runner
        self.generator = torch.Generator(device=runner.device)
        self.generator.manual_seed(config.model_config.seed + 1)
        # request id -> tokens whose draft KV is written (the draft's num_computed_tokens)
        self.num_draft_computed_tokens: dict[str, int] = {}

    def start_requests(self, requests: Sequence[CachedRequestState]) -> None:
        for req in requests:
            self.num_draft_computed_tokens[req.req_id] = req.num_computed_tokens

    def remove_requests(self, req_ids: Iterable[str]) -> None:
        for rid in req_ids:
            self.num_draft_computed_tokens.pop(rid, None)

    @torch.inference_mode()
    def propose(
        self, requests: Sequence[CachedRequestState], scheduler_output: SchedulerOutput,
        sampled: dict[str, list[int]], failed: dict[str, str] | None = None,
    ) -> DraftProposal:
        """Catch the draft KV up on this step's tokens; draft for the requests in `sampled`.
        Returns the drafts and their distributions [k, vocab]; a request with no drafts, or
        greedy drafts (one-hot), is absent from the second."""
        out = scheduler_output
        spec = out.scheduled_spec_decode_tokens
        num_sched = out.num_scheduled_tokens
        progress = self.num_draft_computed_tokens
        advanced: dict[str, int] = {}  # committed when the drafts are made
        token_ids: list[int] = []
        starts: list[int] = []
        q_lens: list[int] = []
        tables: list[list[int]] = []
        rows: list[int] = []  # flat row of each drafting request's newest token
        reqs: list[CachedRequestState] = []
        want: list[int] = []  # drafts each drafting request may have
        first_pos: list[int] = []  # position of each drafting request's first draft
        draft_tables: list[list[int]] = []
        for req in requests:
            rid = req.req_id
            if failed and rid in failed:
                continue
            all_ids = req.all_token_ids
            computed = req.num_computed_tokens + num_sched[rid]
            new = sampled.get(rid) or []
            k = 0
            if new:
                scheduled_drafts = spec.get(rid)
                if scheduled_drafts:
                    computed -= len(scheduled_drafts) + 1 - len(new)
                k = max_draft_tokens(req, self.num_speculative_tokens, self.max_model_len,
                                     len(new))
            start = progress.get(rid, req.num_computed_tokens)
            end = computed + (1 if k > 0 else 0)
            if end <= start:
                continue
            if end <= len(all_ids):
                token_ids.extend(all_ids[start:end])
            else:  # the newest tokens are this step's, not appended yet
                token_ids.extend(all_ids[start:])
                token_ids.extend(new[: end - len(all_ids)])
            starts.append(start)
            q_lens.append(end - start)
            tables.append(req.block_ids)
            advanced[rid] = end
            if k > 0:
                rows.append(len(token_ids) - 1)
                reqs.append(req)
                want.append(k)
                first_pos.append(end)
                draft_tables.append(req.block_ids)
        if not q_lens:
            return DraftProposal({}, {})
        with nvtx_range(f"draft.catch_up tokens={len(token_ids)}"):
            logits = self._forward(token_ids, starts, q_lens, tables, rows)
        if not reqs:
            progress.update(advanced)
            return DraftProposal({}, {})
        meta = make_sampling_metadata(reqs, self.runner.device)
        random = set(meta.random_rows)
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list[list[torch.Tensor]] = [[] for _ in reqs]
        active = list(range(len(reqs)))
        for j in range(max(want)):
            if j > 0:
                active = [i for i in active if want[i] > j]
                if not active:
                    break
                with nvtx_range(f"draft.step {j} seqs={len(active)}"):
                    logits = self._forward(
                        [drafts[i][-1] for i in active],
                        [first_pos[i] - 1 + j for i in active],
                        [1] * len(active),
                        [draft_tables[i] for i in active],
                        list(range(len(active))),
                    )
            tokens = logits.argmax(dim=-1).tolist()
            sel = [row for row, i in enumerate(active) if i in random]
            if sel:
                q = Sampler.sampling_probs(logits[sel], meta, [active[row] for row in sel])
                for s, row in enumerate(sel):
                    tokens[row] = int(torch.multinomial(q[s], 1, generator=self.generator))
                    probs[active[row]].append(q[s])
            for row, i in enumerate(active):
                drafts[i].append(tokens[row])
        ids = {r.req_id: d for r, d in zip(reqs, drafts, strict=True)}
        dists = {r.req_id: torch.stack(p) for r, p in zip(reqs, probs, strict=True) if p}
        progress.update(advanced)
        return DraftProposal(ids, dists)

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
