"""The protocol every cost model implements: one engine step's `BatchComposition` (defined
with the engine's step record in workbench/core/batch_composition.py) -> its wall time.

The simulator builds one `BatchComposition` per scheduler step from the step's
`SchedulerOutput` (the real scheduler's decision) and asks a `CostModel` how long the forward
pass, sampling and the step's fixed overhead take. Vidur's split: the cost follows from the
batch's shape, not from the requests' identities.
"""

from __future__ import annotations

from typing import Any, Protocol

from workbench.core.batch_composition import BatchComposition

__all__ = ["BatchComposition", "CostModel"]


class CostModel(Protocol):
    """Predicts one engine step's wall time."""

    def step_time_s(self, batch: BatchComposition) -> float:
        """Seconds for one step of `batch` (forward, sampling and the step's overhead)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What predicted the times: {"source": "calibrated" | "analytic" | ..., "profile":
        name, "hardware": ..., "model": ..., ...}; logged with every simulated run."""
        ...
