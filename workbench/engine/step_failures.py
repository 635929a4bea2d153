"""Failures stay with the requests they belong to (vLLM stops the whole engine on an
engine-core error; this engine does not):

- a request whose own sampling or update raises finishes alone with FINISHED_ERROR
  (finish_reason "error", `request.error` says why, blocks freed); every other request of
  the step gets its tokens as if it were not there;
- when the batched forward raises, the step's requests are run one by one to find the one
  the failure belongs to (`execute_one_by_one`); if that blames nobody, every request
  scheduled in this step finishes with FINISHED_ERROR, the prefix-cache keys of blocks this
  step may have left half-written are dropped, and the engine serves the next step
  (`fail_step`). With tensor parallelism the executor has stopped every rank by then, so the
  error is raised (the engine is done, as vLLM's); `LLM.generate` and `AsyncEngine` take the
  requests out;
- a failing speculative proposer costs only this step's drafts (lossless).

Failed requests are returned like finished ones; the engine's `errors` keeps the newest
records (step, scope: "request" | "step" | "propose" | "kv_transfer", request ids, message).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request, RequestStatus
from workbench.core.sched.output import SchedulerOutput

if TYPE_CHECKING:
    from workbench.core.sched.scheduler import Scheduler
    from workbench.metrics.stats import EngineStats

logger = logging.getLogger(__name__)


class StepFailures:
    def __init__(self, scheduler: Scheduler, runner: Any, errors: deque[dict[str, Any]],
                 block_size: int, tensor_parallel_size: int) -> None:
        """`runner`: rank 0's model runner; `errors`: the engine's failure records."""
        self.scheduler = scheduler
        self.runner = runner
        self.errors = errors
        self.block_size = block_size
        self.tensor_parallel_size = tensor_parallel_size

    def fail_requests(
        self, errors: dict[str, str], scope: str, stats: EngineStats,
        num_valid_tokens: dict[str, int] | None = None,
    ) -> list[Request]:
        """Finish `errors`' requests with FINISHED_ERROR (blocks freed), count and log them."""
        now = time.perf_counter()
        done = self.scheduler.finish_requests(
            list(errors), RequestStatus.FINISHED_ERROR, errors, num_valid_tokens
        )
        for req in done:
            req.times.finished = req.times.finished or now
            req.prompt_logprobs = []  # nothing half-built survives a failure
            stats.record_finished("error")
            logger.warning("request %s failed (%s): %s", req.request_id, scope, req.error)
        self.errors.append({
            "step": stats.num_steps, "scope": scope,
            "request_ids": [r.request_id for r in done],
            "message": next(iter(errors.values()), ""),
        })
        return done

    def fail_step(self, out: SchedulerOutput, error: Exception,
                  stats: EngineStats) -> list[Request]:
        """The batched forward raised: fail every request of the step; KV from position
        num_computed_tokens on (this step's writes) may be unwritten, so those blocks lose
        their prefix-cache keys. The engine stays usable."""
        logger.error("engine step %d failed in the forward; failing its %d requests",
                     stats.num_steps, len(out.num_scheduled_tokens), exc_info=error)
        msg = f"engine step failed: {type(error).__name__}: {error}"
        reqs = self._scheduled(out)
        return self.fail_requests(
            {r.request_id: msg for r in reqs}, "step", stats,
            {r.request_id: r.num_computed_tokens for r in reqs},
        )

    def _scheduled(self, out: SchedulerOutput) -> list[Request]:
        """The step's requests, in batch order (the message holds only their ids)."""
        requests = self.scheduler.requests
        return [requests[rid] for rid in out.num_scheduled_tokens if rid in requests]

    def execute_one_by_one(
        self, out: SchedulerOutput, failed: dict[str, str], taint: dict[str, int],
        error: Exception, step: int,
    ) -> ModelRunnerOutput | None:
        """The batched forward raised: run each request of the step alone, in batch order
        (a prefix hit on a block its writer computes in this same step still reads it
        after the write), to find the request the failure belongs to. Those fail (in
        `failed`, with their valid-KV length in `taint`), and so does any request whose
        block table holds a block a failed one was writing; the others get their tokens.

        None when it cannot be tried or blames nobody: tensor parallelism (the ranks step
        together), a lone request, failing copy-on-write copies, or every request failing
        alone too (then the failure is the step's, not a request's).
        """
        reqs = self._scheduled(out)
        if len(reqs) < 2 or self.tensor_parallel_size > 1:
            return None
        logger.warning("the forward of step %d failed (%s: %s); running its %d requests one "
                       "by one to find the failing one", step, type(error).__name__, error,
                       len(reqs))
        try:
            if out.blocks_to_copy:  # once, before any request writes into a copied block
                self.runner.copy_blocks(out.blocks_to_copy)
        except Exception:  # noqa: BLE001 - the step's failure, not a request's
            return None
        result = ModelRunnerOutput()
        kv = self.scheduler.kv_cache_manager
        block_ids = {req.request_id: kv.get_block_ids(req.request_id) for req in reqs}
        for req in reqs:
            rid = req.request_id
            prefill = req.num_computed_tokens < req.num_prompt_tokens
            alone = out.for_request(rid, block_ids[rid], prefill)
            try:
                result.merge(self.runner.execute_model(alone, failed))
            except Exception as e:  # noqa: BLE001 - this request's failure
                failed[rid] = f"engine step failed: {type(e).__name__}: {e}"
                taint[rid] = req.num_computed_tokens
        if len(taint) == len(reqs):
            failed.clear()
            taint.clear()
            return None
        bs = self.block_size
        unwritten = {b for rid, n in taint.items() for b in block_ids[rid][n // bs:]}
        for req in reqs:
            rid = req.request_id
            if rid not in taint and unwritten.intersection(block_ids[rid]):
                failed[rid] = ("engine step failed: it reads prefix-cache blocks that failed "
                               f"request(s) {sorted(taint)} did not write")
                taint[rid] = req.num_computed_tokens
                result.sampled_token_ids.pop(rid, None)
                result.prompt_logprobs.pop(rid, None)
        return result
