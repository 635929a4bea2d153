"""The template's key tables and the one-variable rule: what `template.py` parses and
`validate.py` checks against, kept apart so that neither imports the other."""

from __future__ import annotations

from typing import Any

from workbench.harness.replay import CACHE_STATES as CACHE_STATES  # the harness owns them
from workbench.metrics.registry import SLO_BOUNDS

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


def verdict_key_problem(key: str, value: Any, repeats: int = 1) -> str | None:
    """What is wrong with the verdict key `key` (smallest_effect, alpha, max_repeats), or
    None; `repeats`: what max_repeats must reach."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key == "smallest_effect" and not (number and 0 < value < 1):
        return (f"smallest_effect ({value!r}) must be a relative effect in (0, 1), "
                "e.g. 0.02 for +-2%")
    if key == "alpha" and not (number and 0 < value < 0.5):
        return f"alpha ({value!r}) must be an error rate in (0, 0.5), e.g. 0.05"
    if key == "max_repeats" and value is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= repeats):
        return (f"max_repeats ({value!r}) must be an integer >= repeats ({repeats}), "
                "e.g. 10; leave it out for no extra rounds")
    return None
