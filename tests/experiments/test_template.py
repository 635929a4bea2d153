"""Template parsing and the one-variable rule."""

from __future__ import annotations

from typing import Any

import pytest

from tests.experiments.template_dicts import changed
from workbench.experiments.template import one_variable, parse_template

BASE: dict[str, Any] = {
    "name": "t",
    "question": "q?",
    "workload": {"fixture": "balanced-chat", "seed": 0},
    "baseline": {"max_num_batched_tokens": 512, "max_num_seqs": 32},
    "variable": {"name": "max_num_batched_tokens", "values": [64, 128]},
}


def make(**changes: Any) -> dict[str, Any]:
    return changed(BASE, **changes)


def test_variable_template_defaults_and_variant_configs() -> None:
    t = parse_template(make())
    assert (t.variable_name, t.variable_values, t.repeats, t.cache_state) == (
        "max_num_batched_tokens", [64, 128], 3, "warm-model")
    assert t.variant_config(64) == {"max_num_batched_tokens": 64, "max_num_seqs": 32}
    assert t.baseline == {"max_num_batched_tokens": 512, "max_num_seqs": 32}  # untouched
    assert t.objective.metric == "output_throughput" and t.objective.direction == "maximize"


def test_variants_that_change_one_key_are_accepted() -> None:
    t = parse_template(make(variable=None, variants=[
        {"max_num_batched_tokens": 64, "max_num_seqs": 32},
        {"max_num_batched_tokens": 256, "max_num_seqs": 32},
    ]))
    assert (t.variable_name, t.variable_values) == ("max_num_batched_tokens", [64, 256])


def test_two_changed_keys_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"variants\[1\] differs from the baseline in 2 keys "
                                         r"\(max_num_batched_tokens, max_num_seqs\)"):
        parse_template(make(variable=None, variants=[
            {"max_num_batched_tokens": 64, "max_num_seqs": 32},
            {"max_num_batched_tokens": 64, "max_num_seqs": 8},
        ]))


def test_variants_changing_different_keys_are_refused() -> None:
    with pytest.raises(ValueError, match=r"variants change different keys "
                                         r"\(enable_prefix_caching, max_num_seqs\)"):
        one_variable({"max_num_seqs": 32}, [
            {"max_num_seqs": 8}, {"max_num_seqs": 32, "enable_prefix_caching": False},
        ])


@pytest.mark.parametrize(("changes", "message"), [
    ({"repeats": 0}, r"repeats \(0\) must be an integer >= 1"),
    ({"cache_state": "lukewarm"}, r"cache_state \('lukewarm'\) must be one of"),
    ({"slo": {"p42_ttft_ms": 1}}, r"slo keys p42_ttft_ms are not known"),
    ({"objective": {"metric": "x", "direction": "up"}}, r"objective.direction \('up'\)"),
    ({"extra_thing": 1}, r"unknown template key\(s\) extra_thing"),
    ({"variable": {"name": "max_num_batched_tokens", "values": [512, 64]}},
     r"value 512 equals the baseline"),
    ({"variable": None}, r"must name one 'variable'"),
    ({"workload": {"seed": 0}}, r"workload must name a 'fixture' or a 'jsonl'"),
])
def test_bad_templates(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_template(make(**changes))
