"""The `BatchComposition` of one scheduler step, read from the real scheduler's decision.

Called between `Scheduler.schedule()` and `update_from_output()`: the requests'
`num_computed_tokens` are still the tokens computed before this step, which is what the
attention terms need (see workbench/sim/batch.py for each field's definition).
"""

from __future__ import annotations

from collections.abc import Mapping

from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput
from workbench.sim.batch import BatchComposition


def compose(requests: Mapping[str, Request], out: SchedulerOutput) -> BatchComposition:
    """What `out` asks the forward pass to compute; `requests` is the scheduler's table."""
    prefill = pairs = decode = context = sampled = drafts = 0
    for rid, n in out.num_scheduled_tokens.items():
        req = requests[rid]
        done = req.num_computed_tokens
        k = len(out.scheduled_spec_decode_tokens.get(rid, ()))
        if n == 1 + k and done + 1 == req.num_tokens:  # decoding: one token + its drafts
            decode += n
            context += done + n
            drafts += k
            sampled += 1 + k
        else:  # a prefill chunk (a preempted request's recompute of its outputs counts too)
            prefill += n
            pairs += n * done + n * (n + 1) // 2
            if done + n >= req.num_tokens:
                sampled += 1
    return BatchComposition(
        prefill_tokens=prefill, prefill_attn_pairs=pairs, decode_tokens=decode,
        decode_context_tokens=context, num_seqs=len(out.num_scheduled_tokens),
        sampled_rows=sampled, draft_tokens=drafts,
    )
