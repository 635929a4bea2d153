"""The template's key tables and the one-variable rule: what `template.py` parses and
`validate.py` checks against, kept apart so that neither imports the other."""

from __future__ import annotations

from typing import Any

from workbench.harness.metric_registry import SLO_BOUNDS
from workbench.harness.runner import CACHE_STATES as CACHE_STATES  # the harness owns them

DIRECTIONS = ("minimize", "maximize")
SLO_KEYS = tuple(SLO_BOUNDS)  # the metric registry's SLO bounds
_TOP_KEYS = {
    "name", "question", "objective", "slo", "workload", "arrivals", "target", "baseline",
    "variable", "variants", "repeats", "cache_state", "quality_gate", "warmup_requests",
    "noise", "percentiles", "sampling", "description", "max_other_cpu_share", "rate_sweep",
    "smallest_effect", "alpha", "max_repeats",  # the verdict's rule (verdict_rule, sequential)
    "cluster",  # where runs execute on a cluster (`executors.config`: num_cpus, num_gpus, ...)
}


_MISSING = object()


def one_variable(baseline: dict[str, Any], variants: list[dict[str, Any]]) -> str:
    """The single key every variant changes; ValueError naming the keys otherwise."""
    changed: set[str] = set()
    for i, variant in enumerate(variants):
        diff = sorted(k for k in set(baseline) | set(variant)
                      if baseline.get(k, _MISSING) != variant.get(k, _MISSING))
        if len(diff) != 1:
            raise ValueError(
                f"variants[{i}] differs from the baseline in {len(diff)} keys "
                f"({', '.join(diff) or 'none'}); an experiment changes exactly one variable"
            )
        changed.update(diff)
    if len(changed) != 1:
        raise ValueError(
            f"variants change different keys ({', '.join(sorted(changed))}); an experiment "
            "changes exactly one variable"
        )
    return changed.pop()
