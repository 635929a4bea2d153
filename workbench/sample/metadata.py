"""SamplingMetadata: what the sampler needs to know about the rows it samples (vLLM's name).

The model runner builds it from its states of the scheduled requests
(`workbench.worker.sampling_metadata_builder`); the sampler and the rejection sampler read
only this, never a Request. One entry per request, in batch order ("row" i is request i;
when verifying drafts, request i owns len(spec_token_ids[i]) + 1 consecutive rows of
logits).

    request_ids    ["a",  "b",  "c"]
    temperature    [0.0,  0.8,  1.0]      0.0: greedy (never processed, only argmax'd)
    top_k          [0,    50,   0]        <= 0 keeps all; None when no request filters
    top_p          [1.0,  1.0,  0.9]      1.0 keeps all; None when no request filters
    random_rows    [1, 2]                 all_greedy: [], all_random: every row
    generators     {1: <b's generator>}   seeded requests only; others draw from the
                                          sampler's own generator
    min_tokens     {0: (2, [eos, 7])}     a still needs 2 tokens before eos or 7 may come
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingMetadata:
    """request_ids: one per row; failures are recorded under these ids.
    temperature / top_k / top_p: [num_reqs] tensors on the logits' device (float32, int64,
        float32); temperature is None when all_greedy, top_k / top_p None when no row uses
        them.
    all_greedy / all_random: every row greedy / every row sampled.
    random_rows: indices of the sampled (non-greedy) rows, ascending.
    generators: row -> that request's own generator (seeded requests); its state carries
        over from step to step, so one seed gives the same tokens whatever the batch.
    min_tokens: row -> (outputs still to come before a stop is allowed, the ids banned until
        then: stop_token_ids and EOS); only rows with something to ban appear.
    spec_token_ids: verification only: row -> the drafts being verified ([] for none).
    draft_probs: verification only: row -> [len(drafts) or more, vocab] distributions the
        drafts were drawn from, or None for one-hot drafts (n-gram, a greedy draft model).
    """

    request_ids: list[str]
    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    random_rows: list[int]
    generators: dict[int, torch.Generator]
    min_tokens: dict[int, tuple[int, list[int]]]
    spec_token_ids: list[list[int]] | None = None
    draft_probs: list[torch.Tensor | None] | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.request_ids)
