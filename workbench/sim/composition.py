"""The `BatchComposition` of one scheduler step, read from the real scheduler's decision.

Called between `Scheduler.schedule()` and `update_from_output()`: the requests'
`num_computed_tokens` are still the tokens computed before this step, which is what the
attention terms need (see workbench/sim/batch.py for each field's definition).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput
from workbench.sim.batch import BatchComposition


class Chunk(NamedTuple):
    """One request's part of a step: tokens computed before it, tokens computed in it,
    whether it decodes (else a prefill chunk), drafts it verifies, and whether a prefill
    chunk completes the prompt (then one row is sampled)."""

    computed: int
    num_new: int
    decoding: bool
    num_drafts: int = 0
    samples: bool = False


def from_chunks(chunks: Iterable[Chunk]) -> BatchComposition:
    """The step's BatchComposition (field definitions: workbench/sim/batch.py)."""
    prefill = pairs = decode = context = sampled = drafts = seqs = 0
    for c in chunks:
        seqs += 1
        n, done = c.num_new, c.computed
        if c.decoding:
            decode += n
            context += done + n
            drafts += c.num_drafts
            sampled += n
        else:
            prefill += n
            pairs += n * done + n * (n + 1) // 2
            sampled += 1 if c.samples else 0
    return BatchComposition(
        prefill_tokens=prefill, prefill_attn_pairs=pairs, decode_tokens=decode,
        decode_context_tokens=context, num_seqs=seqs, sampled_rows=sampled,
        draft_tokens=drafts,
    )


def compose(requests: Mapping[str, Request], out: SchedulerOutput) -> BatchComposition:
    """What `out` asks the forward pass to compute; `requests` is the scheduler's table. A
    request decodes when it computes its last token plus the drafts it verifies; anything
    else is a prefill chunk (a preempted request's recompute of its outputs too).

    The simulator's hot path (once per step): `from_chunks`' sums in one pass, without a
    Chunk per request; the same integers (tests/sim/test_composition.py holds them equal)."""
    prefill = pairs = decode = context = sampled = drafts = 0
    spec = out.scheduled_spec_decode_tokens
    for rid, n in out.num_scheduled_tokens.items():
        req = requests[rid]
        done = req.num_computed_tokens
        total = req.num_tokens
        k = len(spec[rid]) if spec and rid in spec else 0
        if n == 1 + k and done + 1 == total:  # decoding
            decode += n
            context += done + n
            drafts += k
            sampled += n
        else:
            prefill += n
            pairs += n * done + n * (n + 1) // 2
            if done + n >= total:
                sampled += 1
    return BatchComposition(
        prefill_tokens=prefill, prefill_attn_pairs=pairs, decode_tokens=decode,
        decode_context_tokens=context, num_seqs=len(out.num_scheduled_tokens),
        sampled_rows=sampled, draft_tokens=drafts,
    )


def compose_by_chunks(requests: Mapping[str, Request], out: SchedulerOutput
                      ) -> BatchComposition:
    """`compose` by way of one `Chunk` per request and `from_chunks` (the reference the
    one-pass version is tested against)."""
    chunks = []
    for rid, n in out.num_scheduled_tokens.items():
        req = requests[rid]
        done = req.num_computed_tokens
        k = len(out.scheduled_spec_decode_tokens.get(rid, ()))
        decoding = n == 1 + k and done + 1 == req.num_tokens
        chunks.append(Chunk(done, n, decoding, k if decoding else 0,
                            done + n >= req.num_tokens))
    return from_chunks(chunks)
