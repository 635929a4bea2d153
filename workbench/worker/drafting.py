"""Speculative proposing inside the model runner's step (vLLM V1's drafter in the runner).

    execute_model:  forward -> sample -> propose_drafts(drafter, out, output)
                    -> ModelRunnerOutput.spec_token_ids / spec_token_probs
    engine:         update_from_output -> Scheduler.update_draft_token_ids (running only)

The proposer sees this step's sampled tokens before the scheduler appends them (see
`workbench.spec_decode.ngram` and `draft_model`). Only the driver worker (TP rank 0) owns one.
"""

from __future__ import annotations

import logging

from workbench.core.outputs import ModelRunnerOutput
from workbench.core.sched.output import SchedulerOutput
from workbench.profiling import nvtx_range
from workbench.spec_decode.draft_model import DraftModelProposer
from workbench.spec_decode.ngram import NgramProposer

Drafter = NgramProposer | DraftModelProposer
logger = logging.getLogger(__name__)


def propose_drafts(
    drafter: Drafter, out: SchedulerOutput, output: ModelRunnerOutput,
    failed: dict[str, str] | None = None,
) -> None:
    """Fill `output.spec_token_ids` (and `spec_token_probs`) from `output.sampled_token_ids`.

    Drafts only save time: when the proposer raises, this step's drafts are dropped (the
    draft model's catch-up progress rolled back, so the next step redoes it),
    `output.spec_decode_error` says why, and every request goes on without speculation for
    one step (tokens unchanged: lossless)."""
    before = ([(r, r.num_draft_computed_tokens) for r in out.scheduled_requests]
              if isinstance(drafter, DraftModelProposer) else [])
    try:
        with nvtx_range("spec_decode.propose"):
            if isinstance(drafter, NgramProposer):
                output.spec_token_ids = drafter.propose(
                    out.scheduled_requests, output.sampled_token_ids)
            else:
                output.spec_token_ids, output.spec_token_probs = drafter.propose(
                    out, output.sampled_token_ids, failed)
    except Exception as e:  # noqa: BLE001 - speculation is an optimisation: drop it
        logger.warning("speculative proposer failed; no drafts this step", exc_info=e)
        for req, num in before:
            req.num_draft_computed_tokens = num
        output.spec_token_ids, output.spec_token_probs = {}, {}
        output.spec_decode_error = f"{type(e).__name__}: {e}"
