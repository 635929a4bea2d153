"""The verdict's directions and the template's objective come from the metric registry."""

from __future__ import annotations

import pytest

from workbench.experiments import verdict
from workbench.experiments.template import SLO_KEYS, Objective
from workbench.experiments.validate import _check_objective_metric, _check_scalars
from workbench.metrics import registry


@pytest.mark.parametrize("metric", registry.metric_names())
def test_verdict_directions_are_the_registry_directions(metric: str) -> None:
    want = {"lower": "minimize", "higher": "maximize", "none": "none"}
    assert verdict.direction(metric) == want[registry.get(metric).direction]


def test_verdict_follows_a_changed_registry_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flip one row: the verdict flips with it (no direction lives in the verdict)."""
    base, var = [10.0, 10.1, 10.2], [20.0, 20.1, 20.2]
    assert verdict.compare_metric("output_throughput", base, var, "spread").verdict == "better"
    row = registry._BY_NAME["output_throughput"]
    monkeypatch.setitem(registry._BY_NAME, "output_throughput",
                        registry.replace(row, direction="lower"))
    assert verdict.compare_metric("output_throughput", base, var, "spread").verdict == "worse"
    assert verdict.compare_metric("p95_ttft_ms", base, var, "spread").verdict == "worse"
    assert verdict.compare_metric("duration", base, var, "spread").verdict == "higher"


def test_slo_keys_are_the_registry_bounds() -> None:
    assert SLO_KEYS == tuple(registry.SLO_BOUNDS)


def test_objective_direction_defaults_to_the_registry() -> None:
    assert Objective("p95_itl_ms").direction == "minimize"
    assert Objective("output_throughput").direction == "maximize"


def _objective_problems(objective: dict) -> list[str]:
    out: list[str] = []
    _check_scalars({"objective": objective}, out)
    return out


def test_unknown_objective_metric_is_refused_with_did_you_mean() -> None:
    out = _objective_problems({"metric": "p95_itl_msec", "direction": "minimize"})
    assert out == ["objective.metric ('p95_itl_msec') is not a metric a run computes "
                   "(did you mean 'p95_itl_ms'?); the metrics are listed in docs/metrics.md"]
    assert "did you mean 'output_throughput'" in _objective_problems(
        {"metric": "output_throughput_tok"})[0]


def test_objective_metric_checks() -> None:
    assert _objective_problems({"metric": "p95_itl_ms", "direction": "minimize"}) == []
    assert _objective_problems({"metric": "p95_itl_ms"}) == []
    assert _objective_problems({"metric": "p99_e2el_ms"}) == []
    out = _objective_problems({"metric": "p95_itl_ms", "direction": "maximize"})
    assert out == ["objective.direction ('maximize') contradicts the metric registry "
                   "(p95_itl_ms: lower is better, so minimize)"]
    assert "no better direction" in _objective_problems({"metric": "duration"})[0]
    assert _objective_problems({"metric": "duration", "direction": "minimize"}) == []
    assert "not a metric a run computes" in _objective_problems(
        {"metric": "vllm:time_to_first_token_seconds"})[0]
    out: list[str] = []
    _check_objective_metric(3, None, False, out)
    assert "not a metric a run computes" in out[0]
