"""The template's `rate_sweep` block: parsed, its rules checked up front, one line per problem."""

from __future__ import annotations

from typing import Any

import pytest

from tests.experiments.template_dicts import TINY_BUDGET, changed
from workbench.errors import TemplateError
from workbench.experiments.rate_sweep import RateSweep, rate_sweep_problems
from workbench.experiments.template import parse_template
from workbench.experiments.validate import check_template
from workbench.harness.goodput import GoodputSLO

BLOCK: dict[str, Any] = {"rates": [0.5, 1, 2, 4], "slo": {"ttft_ms": 500, "tpot_ms": 100},
                         "attainment": 0.9, "num_workers": 2}
SWEEP = changed(TINY_BUDGET, rate_sweep=BLOCK, arrivals=None, slo=None, objective=None)


def test_parsed_sweep_and_its_arrivals() -> None:
    t = parse_template(SWEEP)
    assert t.rate_sweep == RateSweep(rates=(0.5, 1.0, 2.0, 4.0),
                                     slo=GoodputSLO(500.0, 100.0, 0.9), num_workers=2, seed=3)
    assert (t.objective.metric, t.objective.direction) == ("goodput", "maximize")
    assert t.arrivals == {} and t.slo == {}
    assert t.rate_sweep.arrivals(2.0) == {"mode": "poisson", "rate": 2.0, "seed": 3}
    spec = t.rate_sweep.arrival(2.0)
    assert (spec.mode, spec.rate, spec.seed) == ("poisson", 2.0, 3)
    assert t.as_data()["rate_sweep"] == {**BLOCK, "rates": [0.5, 1.0, 2.0, 4.0],
                                         "slo": {"ttft_ms": 500.0, "tpot_ms": 100.0}}
    # defaults: attainment 0.9, one worker; the arrivals' own seed wins over the workload's
    t = parse_template(changed(SWEEP, rate_sweep={"rates": [1], "slo": BLOCK["slo"]},
                               arrivals={"mode": "poisson", "seed": 7, "max_concurrency": 4}))
    assert t.rate_sweep == RateSweep((1.0,), GoodputSLO(500.0, 100.0), 1, 7, 4)
    assert t.rate_sweep.arrivals(1.0)["max_concurrency"] == 4
    assert parse_template(changed(SWEEP, objective={"metric": "goodput_per_worker"})
                          ).objective.metric == "goodput_per_worker"


def test_ordinary_template_has_no_sweep() -> None:
    t = parse_template(TINY_BUDGET)
    assert t.rate_sweep is None and "rate_sweep" not in t.as_data()
    assert rate_sweep_problems(TINY_BUDGET) == []


@pytest.mark.parametrize(("changes", "problem"), [
    ({"rates": [2, 1]}, "rate_sweep.rates ([2, 1]) must be strictly increasing"),
    ({"rates": [1, -2]}, "rate_sweep.rates ([1, -2]) must be positive finite numbers "
                         "(requests/s); -2 is not"),
    ({"rates": []}, "rate_sweep.rates ([]) must be a non-empty list of requests/s, "
                    "e.g. [0.5, 1, 2, 4]"),
    ({"slo": {"ttft_ms": 0, "tpot_ms": 100}}, "rate_sweep.slo.ttft_ms (0) must be a number > "
                                              "0 ms"),
    ({"slo": {"ttft_ms": 500}}, "rate_sweep.slo is missing 'tpot_ms' (ms)"),
    ({"slo": {"ttft_ms": 500, "tpot_ms": 100, "e2el_ms": 9}},
     "unknown rate_sweep.slo key 'e2el_ms'; allowed: ttft_ms, tpot_ms"),
    ({"attainment": 0}, "rate_sweep.attainment (0) must be a share in (0, 1], e.g. 0.9"),
    ({"attainment": 1.5}, "rate_sweep.attainment (1.5) must be a share in (0, 1], e.g. 0.9"),
    ({"num_workers": 0}, "rate_sweep.num_workers (0) must be an integer >= 1"),
    ({"rate": 3}, "unknown rate_sweep key 'rate'; allowed: rates, slo, attainment, "
                  "num_workers"),
])
def test_block_problems(changes: dict[str, Any], problem: str) -> None:
    data = changed(SWEEP, rate_sweep={**BLOCK, **changes})
    assert rate_sweep_problems(data) == [problem]
    with pytest.raises(ValueError) as e:
        parse_template(data)
    assert str(e.value) == problem


@pytest.mark.parametrize(("changes", "problem"), [
    ({"arrivals": {"mode": "poisson", "rate": 8.0}},
     "arrivals.rate (8.0) conflicts with rate_sweep: the sweep sets the Poisson rate per "
     "point; arrivals may only give mode, seed, max_concurrency"),
    ({"arrivals": {"mode": "constant"}},
     "arrivals.mode ('constant') conflicts with rate_sweep: a sweep runs Poisson arrivals; "
     "drop arrivals.mode or set it to poisson"),
    ({"objective": {"metric": "p95_itl_ms"}},
     "objective.metric ('p95_itl_ms') conflicts with rate_sweep: a sweep's objective is one "
     "of goodput, goodput_per_worker (or leave it out)"),
    ({"slo": {"p95_ttft_ms": 1000}},
     "slo ({'p95_ttft_ms': 1000}) conflicts with rate_sweep: the per-request SLO of goodput "
     "is rate_sweep.slo; drop the top-level slo"),
])
def test_conflicts_are_refused_not_overridden(changes: dict[str, Any], problem: str) -> None:
    assert rate_sweep_problems(changed(SWEEP, **changes)) == [problem]


def test_check_template_lists_sweep_problems_with_the_rest() -> None:
    assert check_template(SWEEP).checksum  # a valid sweep template builds its workload
    bad = changed(SWEEP, rate_sweep={**BLOCK, "rates": [2, 1], "attainment": 2},
                  arrivals={"mode": "closed", "concurrency": 2}, repeats=0)
    with pytest.raises(TemplateError) as e:
        check_template(bad)
    text = str(e.value)
    for line in ("repeats (0) must be an integer >= 1",
                 "rate_sweep.rates ([2, 1]) must be strictly increasing",
                 "rate_sweep.attainment (2) must be a share in (0, 1], e.g. 0.9",
                 "arrivals.concurrency (2) conflicts with rate_sweep",
                 "arrivals.mode ('closed') conflicts with rate_sweep"):
        assert line in text, text
