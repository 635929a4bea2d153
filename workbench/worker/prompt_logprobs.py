"""Prompt logprobs: the logits at every scheduled prompt position, for the requests that ask.

    flat batch     r0 decode | r1 prefill chunk, positions 4..8 of a 7-token prompt | r2 ...
    rows scored               r1's rows of positions 4 and 5 (they predict tokens 5 and 6);
                              position 6's row predicts the first output token: not a prompt
                              logprob (the sampler has it)

Called by `ModelRunner.execute_model` only on steps with prefill tokens, and only requests
with `num_prompt_logprobs` set add rows, so decode steps and other requests cost nothing.
One `compute_logits` for all the rows (with tensor parallelism the LM head's all-gather is a
collective: every rank runs this on the same rows: k is in the request's SamplingParams, sent
to every rank in NewRequestData), then a float32
log_softmax and, per request, the actual token's logprob and rank and the top-k.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.core.outputs import LogprobsTensors
from workbench.core.sched.output import SchedulerOutput
from workbench.worker.request_state import CachedRequestState


def compute_prompt_logprobs(
    model: Any, reqs: list[CachedRequestState], out: SchedulerOutput, hidden: torch.Tensor
) -> dict[str, LogprobsTensors]:
    """request id -> this step's run of prompt logprobs (on the CPU); {} when no scheduled
    request asked for them. `hidden` is the step's flat [num_tokens, hidden] output, laid
    out in batch order (`reqs`, the worker's states; as `ModelRunner.prepare_inputs` builds
    it)."""
    spans: list[tuple[str, int, int, int]] = []  # (request id, k, start position, rows)
    rows: list[int] = []
    targets: list[int] = []
    offset = 0
    num_sched = out.num_scheduled_tokens
    for req in reqs:
        n = num_sched[req.req_id]
        k = req.num_prompt_logprobs
        if k is not None:
            start = req.num_computed_tokens
            stop = min(start + n, req.num_prompt_tokens - 1)  # last row scoring a prompt token
            if stop > start:
                spans.append((req.req_id, k, start, stop - start))
                rows.extend(range(offset, offset + stop - start))
                targets.extend(req.all_token_ids[start + 1:stop + 1])
        offset += n
    if not spans:
        return {}
    dev = hidden.device
    logits = model.compute_logits(hidden[torch.tensor(rows, dtype=torch.int64, device=dev)])
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(targets, dtype=torch.int64, device=dev)
    result: dict[str, LogprobsTensors] = {}
    first = 0
    for rid, k, start, m in spans:
        lp = logprobs[first:first + m]
        tok = target[first:first + m, None]
        first += m
        chosen = lp.gather(1, tok)
        ranks = (lp > chosen).sum(-1) + 1
        ids, vals, full = tok, chosen, None
        if k == -1:
            full = lp.cpu()
        elif k > 0:
            top_vals, top_ids = lp.topk(k, dim=-1)
            ids = torch.cat([tok, top_ids], dim=1)
            vals = torch.cat([chosen, top_vals], dim=1)
        result[rid] = LogprobsTensors(start, ids.cpu(), vals.cpu(), ranks.cpu(), full)
    return result
