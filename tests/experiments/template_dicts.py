"""Test helper: a template dict with some top-level keys changed (None removes the key)."""

from __future__ import annotations

import copy
from typing import Any


def changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(base)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


# A tiny budget experiment (baseline 256 against 64, one repeat, four chat requests: a few
# seconds on the bundled checkpoint) for tests that need an experiment in an MLflow store.
TINY_BUDGET: dict[str, Any] = {
    "name": "tiny-budget-check",
    "question": "Does a smaller token budget change p95 ITL on four chat requests?",
    "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
    "slo": {"p95_ttft_ms": 60000, "max_error_rate": 0.0},
    "workload": {"fixture": "balanced-chat", "seed": 3, "params": {"num_requests": 4}},
    "arrivals": {"mode": "closed", "concurrency": 2},
    "baseline": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
                 "max_num_batched_tokens": 256},
    "variable": {"name": "max_num_batched_tokens", "values": [64]},
    "repeats": 1,
    "warmup_requests": 0,
}
