"""The forward context: what a compiled forward's opaque attention op reads besides its tensors
(vLLM's `forward_context.py`).

A compiled graph cannot take the `AttentionMetadata` as an argument: dynamo would guard on its
host lists (`query_lens_cpu`, `seq_lens_cpu`, ...) and recompile on every new batch. So the
compiled forward takes only tensors, and the runner scopes the batch's metadata and the model's
attention backend around the call:

    with set_forward_context(ForwardContext(attn_metadata, backend)):
        hidden = compiled(input_ids, positions)     # each layer's workbench::unified_attention
                                                    # op calls get_forward_context()

The context lives in a ContextVar, set and reset by the `with` (scoped, never left behind);
outside one, `get_forward_context()` raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from workbench.attention.backends import AttentionBackend
from workbench.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class ForwardContext:
    """One forward's batch description and the backend its attention layers run on."""

    attn_metadata: AttentionMetadata
    backend: AttentionBackend


_CURRENT: ContextVar[ForwardContext | None] = ContextVar("workbench_forward_context",
                                                         default=None)


@contextmanager
def set_forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def get_forward_context() -> ForwardContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError(
            "no forward context: workbench::unified_attention runs inside a compiled forward "
            "(workbench.compilation.CompiledForward sets it around the call)"
        )
    return ctx
