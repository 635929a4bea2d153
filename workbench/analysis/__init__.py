"""Analysis: pandas frames read back from MLflow, and the workbench's standard plots.

Place in the flow: experiments and sweeps write runs to MLflow (`workbench.tracking`);
`frames` reads them back as one row per run (params, metrics and tags flattened) and builds
the baseline-vs-variant comparison; `plots` turns frames into matplotlib Figures (Agg
canvas, never a window); `notebook` is the small glue notebooks use to resolve a tracking
URI and publish their figures and headline metrics; `kv_tiers` reads a tiered KV cache's
runs back per config and per chat turn (notebook 11). Nothing here measures: the measuring
drivers are `workbench.experiments` (its runner and `studies`).
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.frames import (
    compare_frame,
    parent_runs,
    request_frames,
    run_artifact_frame,
    runs_frame,
)
from workbench.analysis.plots import (
    bar_compare,
    compare_plot,
    experiment_sweep,
    grid_heatmap,
    latency_ecdf,
    memory_split,
    saturation_curve,
    save,
    step_series,
    sweep_tradeoff,
)

# workbench.analysis.kv_tiers's names, imported on first use
_KV_TIERS = ("by_turn", "tier_table", "turn_table")

__all__ = [
    "bar_compare",
    "by_turn",
    "compare_frame",
    "compare_plot",
    "experiment_sweep",
    "grid_heatmap",
    "latency_ecdf",
    "memory_split",
    "parent_runs",
    "request_frames",
    "run_artifact_frame",
    "runs_frame",
    "saturation_curve",
    "save",
    "step_series",
    "sweep_tradeoff",
    "tier_table",
    "turn_table",
]


def __getattr__(name: str) -> Any:
    if name in _KV_TIERS:
        from workbench.analysis import kv_tiers

        return getattr(kv_tiers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
