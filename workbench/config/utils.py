"""`knob`: a config field that is an engine knob, with its one-line help.

A knob whose default is None is resolved in its config's `__post_init__` (the model's
max_position_embeddings for `max_model_len`, 8192 or max_model_len for
`max_num_batched_tokens`, ...): its annotation is the *resolved* type, so every reader after
validation gets a value of that type, and `accepts` names what a caller may pass instead
(None for "resolve it", a dict for a JSON knob). `workbench.engine.arg_utils` turns the
knobs into command-line flags from the same metadata, as vLLM's `EngineArgs.add_cli_args`.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def knob(default: Any, help: str, accepts: Any = None) -> Any:  # noqa: A002 - argparse's word
    """A config field that is an engine knob: its default, its one-line help (the flag's help)
    and, when the caller may pass something other than the annotated resolved type, `accepts`
    (the input type, e.g. `dict[str, Any] | None` for a JSON knob)."""
    metadata: dict[str, Any] = {"help": help}
    if accepts is not None:
        metadata["accepts"] = accepts
    return field(default=default, metadata=metadata)
