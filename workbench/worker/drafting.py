"""Speculative proposing inside the model runner's step (vLLM V1's drafter in the runner).

    execute_model:  forward -> sample -> propose_drafts(proposer, ...) -> Proposer.propose
                    -> ModelRunnerOutput.spec_token_ids; the drafts' distributions stay in the
                    worker's request states (`CachedRequestState.spec_token_probs`)
    engine:         update_from_output -> Scheduler.update_draft_token_ids (running only)

Any `workbench.spec_decode.proposer.Proposer` (n-gram, draft model) is called the same way.
The proposer sees this step's sampled tokens before the worker appends them. Only the driver
worker (TP rank 0) owns one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from workbench.core.outputs import ModelRunnerOutput
from workbench.core.sched.output import SchedulerOutput
from workbench.profiling import nvtx_range
from workbench.spec_decode.proposer import Proposer
from workbench.worker.request_state import CachedRequestState

logger = logging.getLogger(__name__)


def propose_drafts(
    proposer: Proposer, reqs: Sequence[CachedRequestState], out: SchedulerOutput,
    output: ModelRunnerOutput, failed: dict[str, str] | None = None,
) -> None:
    """Fill `output.spec_token_ids` from `output.sampled_token_ids`, and each scheduled
    request's `spec_token_probs` (None: one-hot or no drafts).

    Drafts only save time: when the proposer raises, this step has no drafts (the proposer
    changed none of its state: the next step redoes its work), `output.spec_decode_error`
    says why, and every request goes on without speculation for one step (tokens unchanged:
    lossless)."""
    try:
        with nvtx_range("spec_decode.propose"):
            proposal = proposer.propose(reqs, out, output.sampled_token_ids, failed)
    except Exception as e:  # noqa: BLE001 - speculation is an optimisation: drop it
        logger.warning("speculative proposer failed; no drafts this step", exc_info=e)
        output.spec_token_ids = {}
        output.spec_decode_error = f"{type(e).__name__}: {e}"
        for req in reqs:
            req.spec_token_probs = None
        return
    output.spec_token_ids = proposal.token_ids
    probs = proposal.probs
    for req in reqs:
        req.spec_token_probs = probs.get(req.req_id)
