"""What rank 0 sends the TP workers each step: the SchedulerOutput as a delta (vLLM V1's
NewRequestData / CachedRequestData idea), so a step costs O(scheduled tokens), not O(context).

    rank 0: StepInputEncoder.encode(out) -> StepInput --pickle--> pipe --> worker:
            StepInputDecoder.decode(step) -> SchedulerOutput over MirrorRequests
                                             -> ModelRunner.execute_model (same batch as rank 0)

A request's token ids travel once: in full the first time it is scheduled, afterwards only the
ids appended since (its sampled tokens). The worker keeps a `MirrorRequest` per request
(request_id, all_token_ids, num_computed_tokens, and the prompt length and prompt_logprobs
k that decide which rows score prompt logprobs: what the runner reads) and drops it
when rank 0 lists it in `finished_req_ids` (rank 0 notices a finished request at the next
step it encodes). Block tables are sent whole (a few ints per block).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput


@dataclass
class ScheduledRequestData:
    request_id: str
    num_computed_tokens: int
    new_token_ids: list[int]  # all token ids when is_new, else the ones appended since
    is_new: bool
    num_prompt_tokens: int = 0  # sent when is_new
    num_prompt_logprobs: int | None = None  # sent when is_new


@dataclass
class StepInput:
    requests: list[ScheduledRequestData]
    num_scheduled_tokens: dict[str, int]
    block_ids: dict[str, list[int]]
    blocks_to_copy: list[tuple[int, int]]
    finished_req_ids: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0


class MirrorRequest:
    """A worker's copy of the request fields the model runner reads."""

    __slots__ = ("request_id", "all_token_ids", "num_computed_tokens", "num_prompt_tokens",
                 "num_prompt_logprobs")

    def __init__(
        self, request_id: str, token_ids: list[int], num_prompt_tokens: int = 0,
        num_prompt_logprobs: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.all_token_ids = token_ids
        self.num_computed_tokens = 0
        self.num_prompt_tokens = num_prompt_tokens
        # the LM head's all-gather is a collective: every rank scores the same prompt rows
        self.num_prompt_logprobs = num_prompt_logprobs

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


class StepInputEncoder:
    """Rank 0: remembers, per request object, how many of its token ids the workers have."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[Request, int]] = {}

    def encode(self, out: SchedulerOutput) -> StepInput:
        if out.scheduled_spec_decode_tokens:
            raise ValueError("speculative decoding with tensor_parallel_size > 1 is not supported")
        finished = [rid for rid, (req, _) in self._sent.items() if req.is_finished()]
        for rid in finished:
            del self._sent[rid]
        reqs: list[ScheduledRequestData] = []
        for req in out.scheduled_requests:
            rid = req.request_id
            ids = req.all_token_ids
            known = self._sent.get(rid)
            if known is None or known[0] is not req:  # new (or a reused id: start afresh)
                reqs.append(ScheduledRequestData(
                    rid, req.num_computed_tokens, list(ids), True, req.num_prompt_tokens,
                    req.num_prompt_logprobs,
                ))
            else:
                reqs.append(
                    ScheduledRequestData(rid, req.num_computed_tokens, ids[known[1]:], False)
                )
            self._sent[rid] = (req, len(ids))
        return StepInput(
            requests=reqs,
            num_scheduled_tokens=out.num_scheduled_tokens,
            block_ids={r.request_id: out.block_ids[r.request_id] for r in out.scheduled_requests},
            blocks_to_copy=out.blocks_to_copy,
            finished_req_ids=finished,
            num_prefill_tokens=out.num_prefill_tokens,
            num_decode_tokens=out.num_decode_tokens,
        )


class StepInputDecoder:
    """Worker: applies each StepInput to its mirrors and rebuilds the SchedulerOutput."""

    def __init__(self) -> None:
        self.requests: dict[str, MirrorRequest] = {}

    def decode(self, step: StepInput) -> SchedulerOutput:
        for rid in step.finished_req_ids:
            self.requests.pop(rid, None)
        scheduled: list[MirrorRequest] = []
        for data in step.requests:
            if data.is_new:
                mirror = MirrorRequest(data.request_id, data.new_token_ids,
                                       data.num_prompt_tokens, data.num_prompt_logprobs)
                self.requests[data.request_id] = mirror
            else:
                mirror = self.requests[data.request_id]
                mirror.all_token_ids.extend(data.new_token_ids)
            mirror.num_computed_tokens = data.num_computed_tokens
            scheduled.append(mirror)
        return SchedulerOutput(
            scheduled_requests=scheduled,  # type: ignore[arg-type]  (duck-typed Requests)
            num_scheduled_tokens=step.num_scheduled_tokens,
            block_ids=step.block_ids,
            blocks_to_copy=step.blocks_to_copy,
            num_prefill_tokens=step.num_prefill_tokens,
            num_decode_tokens=step.num_decode_tokens,
        )
