"""Every template in experiments/ parses, names a known fixture and valid engine configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.config import EngineConfig
from workbench.config.named_models import bundled_checkpoint
from workbench.experiments.template import load_template
from workbench.harness.workloads import FIXTURES
from workbench.router.cli import ROUTER_KNOBS

TEMPLATES = sorted((Path(__file__).parents[2] / "experiments").glob("*.yaml"))


def test_the_three_templates_ship() -> None:
    assert {p.stem for p in TEMPLATES} >= {
        "chunked_prefill_budget", "prefix_caching", "max_num_seqs_saturation"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_is_valid(path: Path) -> None:
    t = load_template(path)
    assert t.workload["fixture"] in FIXTURES
    model = str(bundled_checkpoint())
    # A template that runs the router: its router-only knobs (policy, replicas) are the
    # router's, not the engine's; the rest must still be valid engine knobs.
    router = "router" in [str(c) for c in (t.target.get("command") or [])]
    if t.target.get("kind") == "simulated":
        return  # the simulator's own knob check ran in load_template (sim.target)
    for value in [None, *t.variable_values]:
        cfg = t.baseline if value is None else t.variant_config(value)
        if router:
            cfg = {k: v for k, v in cfg.items() if k not in ROUTER_KNOBS}
        EngineConfig.from_kwargs(model, **cfg)  # raises on a bad knob or value
