"""Every template in experiments/ parses, names a known fixture and valid engine configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.bench.workloads import FIXTURES
from workbench.config import EngineConfig
from workbench.demo import bundled_checkpoint
from workbench.experiments.template import load_template

TEMPLATES = sorted((Path(__file__).parents[2] / "experiments").glob("*.yaml"))


def test_the_three_templates_ship() -> None:
    assert {p.stem for p in TEMPLATES} >= {
        "chunked_prefill_budget", "prefix_caching", "max_num_seqs_saturation"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_is_valid(path: Path) -> None:
    t = load_template(path)
    assert t.workload["fixture"] in FIXTURES
    model = str(bundled_checkpoint())
    for value in [None, *t.variable_values]:
        cfg = t.baseline if value is None else t.variant_config(value)
        EngineConfig.from_kwargs(model, **cfg)  # raises on a bad knob or value
