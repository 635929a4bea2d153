"""One proposer interface: any `Proposer` subclass runs in the model runner's step through
`propose_drafts` (no switch on its type); its drafts go back in the ModelRunnerOutput, their
distributions stay in the worker's request states; a raise costs the step's drafts only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from tests.core.test_scheduler import make_request, make_scheduler, runner_output
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import RequestStatus
from workbench.core.sched.output import SchedulerOutput
from workbench.sampling_params import SamplingParams
from workbench.spec_decode.proposer import DraftProposal, Proposer, max_draft_tokens
from workbench.worker.drafting import propose_drafts
from workbench.worker.model_runner import ModelRunner
from workbench.worker.request_state import CachedRequestState
from workbench.worker.sampling_metadata_builder import SamplingMetadataBuilder

CPU = torch.device("cpu")


class RepeatLast(Proposer):
    """A toy proposer with per-request state: drafts the newest token k times, with a
    uniform q over 4 tokens for request "b"; counts the requests it was told about."""

    def __init__(self, k: int, fail: bool = False) -> None:
        self.num_speculative_tokens = k
        self.fail = fail
        self.started: list[str] = []
        self.removed: list[str] = []

    def propose(
        self, requests: Sequence[CachedRequestState], scheduler_output: SchedulerOutput,
        sampled: dict[str, list[int]], failed: dict[str, str] | None = None,
    ) -> DraftProposal:
        if self.fail:
            raise RuntimeError("injected proposer failure")
        drafts = {r.req_id: [sampled[r.req_id][-1]] * max_draft_tokens(
                      r, self.num_speculative_tokens, 64, len(sampled[r.req_id]))
                  for r in requests if r.req_id in sampled}
        probs = {"b": torch.full((self.num_speculative_tokens, 4), 0.25)} if "b" in drafts \
            else {}
        return DraftProposal(drafts, probs)

    def start_requests(self, requests: Sequence[CachedRequestState]) -> None:
        self.started.extend(r.req_id for r in requests)

    def remove_requests(self, req_ids: Iterable[str]) -> None:
        self.removed.extend(req_ids)


def _states() -> list[CachedRequestState]:
    return [CachedRequestState(rid, [1, 2, 3], SamplingParams(max_tokens=mt), [1], 3)
            for rid, mt in (("a", 10), ("b", 10), ("c", 2))]


def test_any_proposer_runs_through_propose_drafts() -> None:
    reqs = _states()
    output = ModelRunnerOutput(sampled_token_ids={"a": [7], "b": [8], "c": [9]})
    propose_drafts(RepeatLast(3), reqs, SchedulerOutput(), output)
    # c may emit 1 more token after this one (max_tokens 2): no room for a draft + bonus
    assert output.spec_token_ids == {"a": [7, 7, 7], "b": [8, 8, 8], "c": []}
    assert output.spec_decode_error is None
    assert [r.spec_token_probs is not None for r in reqs] == [False, True, False]


def test_a_failing_proposer_costs_only_the_drafts() -> None:
    reqs = _states()
    reqs[1].spec_token_probs = torch.ones(3, 4)  # last step's: no longer valid
    output = ModelRunnerOutput(sampled_token_ids={"a": [7], "b": [8]})
    propose_drafts(RepeatLast(3, fail=True), reqs, SchedulerOutput(), output)
    assert output.spec_token_ids == {}
    assert output.spec_decode_error == "RuntimeError: injected proposer failure"
    assert output.sampled_token_ids == {"a": [7], "b": [8]}  # the tokens are untouched
    assert all(r.spec_token_probs is None for r in reqs)


def test_the_runner_tells_the_proposer_which_requests_start_and_finish() -> None:
    """New and resumed requests start (a draft model's progress starts at their
    num_computed_tokens); finished ones are removed: from the step message alone."""
    s = make_scheduler(block_size=4)
    for rid in ("a", "b"):
        s.add_request(make_request(rid, 5, start=10 if rid == "a" else 40))
    prop = RepeatLast(2)
    runner: Any = SimpleNamespace(sampling_metadata_builder=SamplingMetadataBuilder(CPU),
                                  drafter=prop, requests={}, is_driver_worker=True,
                                  kivi_map=None)
    out = s.schedule()
    ModelRunner._update_states(runner, out)
    assert (prop.started, prop.removed) == (["a", "b"], [])
    s.update_from_output(out, runner_output({"a": [7], "b": [7]}))
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    ModelRunner._update_states(runner, s.schedule())
    assert (prop.started, prop.removed) == (["a", "b"], ["a"])
    b = s.requests["b"]
    s.running.remove(b)
    s._preempt(b)
    ModelRunner._update_states(runner, s.schedule())  # b resumes
    assert prop.started == ["a", "b", "b"] and sorted(runner.requests) == ["b"]
    assert runner.requests["b"].num_computed_tokens == 4  # its first block, a prefix hit
