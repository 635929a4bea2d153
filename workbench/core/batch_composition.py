"""What one engine step computes (`BatchComposition`), read from the real scheduler's decision.

The engine records it in every step's row (so a calibration can fit a cost model to steps
timed on the serving path itself) and the simulator prices it with a cost model
(workbench/sim/batch.py). `compose` is called between `Scheduler.schedule()` and
`update_from_output()`: the requests' `num_computed_tokens` are still the tokens computed
before this step, which is what the attention terms need.

Definitions (per step, over the scheduled requests; a request is "prefill" while its
computed tokens are below its prompt length, else "decode"):
- `prefill_tokens`: new prompt tokens computed this step (chunked prefill: the chunk sizes).
- `prefill_attn_pairs`: query-key pairs the prefill chunks attend, causal:
  sum over chunks of `n * computed + n * (n + 1) / 2` (n: the chunk, computed: tokens before
  it, prefix-cache hits included).
- `decode_tokens`: tokens decoded this step (1 per decoding request, `1 + k` when verifying
  k draft tokens).
- `decode_context_tokens`: KV tokens the decode queries read (each decoding request's
  context length, computed tokens before this step plus its new tokens).
- `num_seqs`: requests in the step; `prefill_seqs`: of which prefill chunks (each is its own
  attention call over its gathered context on the CPU path); `sampled_rows`: rows the sampler
  draws from (one per
  request whose prefill completes or that decodes, plus one per draft token verified);
  `draft_tokens`: draft tokens verified this step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput


@dataclass(frozen=True)
class BatchComposition:
    """One engine step's work (see the module docstring for each field)."""

    prefill_tokens: int = 0
    prefill_attn_pairs: int = 0
    decode_tokens: int = 0
    decode_context_tokens: int = 0
    num_seqs: int = 0
    sampled_rows: int = 0
    draft_tokens: int = 0
    prefill_seqs: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill_tokens", "prefill_attn_pairs", "decode_tokens",
                     "decode_context_tokens", "num_seqs", "sampled_rows", "draft_tokens",
                     "prefill_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"BatchComposition {name} ({v!r}) must be an integer >= 0")

    @property
    def num_tokens(self) -> int:
        """Tokens through the model's GEMMs this step."""
        return self.prefill_tokens + self.decode_tokens


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
    """The step's BatchComposition (field definitions: the module docstring)."""
    prefill = pairs = decode = context = sampled = drafts = seqs = prefill_seqs = 0
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
            prefill_seqs += 1
            pairs += n * done + n * (n + 1) // 2
            sampled += 1 if c.samples else 0
    return BatchComposition(
        prefill_tokens=prefill, prefill_attn_pairs=pairs, decode_tokens=decode,
        decode_context_tokens=context, num_seqs=seqs, sampled_rows=sampled,
        draft_tokens=drafts, prefill_seqs=prefill_seqs,
    )


def compose(requests: Mapping[str, Request], out: SchedulerOutput) -> BatchComposition:
    """What `out` asks the forward pass to compute; `requests` is the scheduler's table. A
    request decodes when it computes its last token plus the drafts it verifies; anything
    else is a prefill chunk (a preempted request's recompute of its outputs too).

    The simulator's hot path (once per step): `from_chunks`' sums in one pass, without a
    Chunk per request; the same integers (tests/sim/test_composition.py holds them equal)."""
    prefill = pairs = decode = context = sampled = drafts = prefill_seqs = 0
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
            prefill_seqs += 1
            pairs += n * done + n * (n + 1) // 2
            if done + n >= total:
                sampled += 1
    return BatchComposition(
        prefill_tokens=prefill, prefill_attn_pairs=pairs, decode_tokens=decode,
        decode_context_tokens=context, num_seqs=len(out.num_scheduled_tokens),
        sampled_rows=sampled, draft_tokens=drafts, prefill_seqs=prefill_seqs,
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
