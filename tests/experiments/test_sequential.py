"""Adaptive repeats (`sequential`): an undecided objective gets more interleaved rounds up to
`max_repeats`, with alpha split over the planned looks; the simulated A/A false-adoption rate
stays <= 5% (`verdict_sim`). Metrics are injected (fixed tables or a seeded generator); no
timing anywhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.experiments.test_template import make
from workbench.experiments import runner
from workbench.experiments.child_run import RunContext
from workbench.experiments.run_record import RunRecord
from workbench.experiments.sequential import add_rounds
from workbench.experiments.template import parse_template
from workbench.experiments.verdict import judge_runs
from workbench.experiments.verdict_sim import Tally, lognormal, sim_template, simulate

OBJECTIVE = {"metric": "p95_ttft_ms", "direction": "minimize"}
# p95 TTFT per (label, repeat): 64 is ~45% faster, 128 the same as the baseline
VALUES = {"baseline": [100, 130, 95, 120, 105, 125], "64": [60, 66, 58, 63, 61, 64],
          "128": [98, 135, 110, 97, 128, 101]}
PLAN = [("baseline", None), ("64", 64), ("128", 128)]


def _rounds(calls: list[tuple[int, list[str]]]) -> Any:
    def measure_round(repeat: int, plan: Any) -> list[RunRecord]:
        calls.append((repeat, [label for label, _ in plan]))
        return [RunRecord(label, value, repeat, f"{label}-{repeat}",
                          metrics={"p95_ttft_ms": float(VALUES[label][repeat])})
                for label, value in plan]
    return measure_round


def test_undecided_variants_get_rounds_until_decided_or_the_cap() -> None:
    t = parse_template(make(objective=OBJECTIVE, repeats=2, max_repeats=6))
    calls: list[tuple[int, list[str]]] = []
    measure = _rounds(calls)
    first = measure(0, PLAN) + measure(1, PLAN)
    assert [v.decision for v in judge_runs(t, first)] == ["undecided", "undecided"]
    calls.clear()
    said: list[str] = []
    runs = add_rounds(t, first, PLAN, measure, say=said.append)
    # 64 is decided after round 4 and gets no more; the baseline runs in every round
    assert calls == [(2, ["baseline", "64", "128"]), (3, ["baseline", "64", "128"]),
                     (4, ["baseline", "128"]), (5, ["baseline", "128"])]
    assert said[0] == ("undecided after 2 repeats: budget=64, budget=128; round 3 of up to 6 "
                       "(baseline and the undecided variant(s))")
    by = {v.value: v for v in judge_runs(t, runs)}
    assert by[64].decision == "ADOPT" and by[64].valid_runs == 4
    assert by[64].reason == ("objective p95_ttft_ms improves -45.3% (interval -55.1% .. "
                             "-32.2%)")
    assert by[128].decision == "undecided" and by[128].valid_runs == 6
    assert by[64].baseline_valid_runs == 6


def test_no_rounds_without_max_repeats_or_once_everything_is_decided() -> None:
    calls: list[tuple[int, list[str]]] = []
    measure = _rounds(calls)
    first = measure(0, PLAN) + measure(1, PLAN)
    calls.clear()
    off = parse_template(make(objective=OBJECTIVE, repeats=2))  # max_repeats = repeats
    assert add_rounds(off, first, PLAN, measure) == first and calls == []
    slo = parse_template(make(objective=OBJECTIVE, repeats=2, max_repeats=6,
                              slo={"p95_ttft_ms": 10}))  # every variant fails its SLO
    assert add_rounds(slo, first, PLAN, measure) == first and calls == []


def test_seeded_a_a_simulation_keeps_false_adoptions_under_five_percent() -> None:
    # Identical configurations, lognormal noise (CV 10%), fixed and adaptive designs.
    for repeats, cap in ((3, None), (5, None), (3, 10)):
        tally = simulate(sim_template(repeats, cap), lognormal(0.10), 0.0, 400, seed=1)
        assert tally.sims == 400 and tally.share(tally.adopt) <= 0.05
        assert tally.share(tally.adopt + tally.worse) <= 0.075  # two-sided, + sampling error
    # The same seed gives the same tally (the generator is the only randomness)
    again = simulate(sim_template(3, 10), lognormal(0.10), 0.0, 400, seed=1)
    assert again == Tally(sims=400, adopt=6, worse=2, no_change=0, undecided=392,
                          repeats=3963)
    # ... and a 40% effect is found almost always with adaptive repeats at CV 10%
    hit = simulate(sim_template(3, 10), lognormal(0.10), 0.40, 200, seed=2)
    assert hit.share(hit.adopt) >= 0.95


def test_simulation_takes_an_injected_metric_generator() -> None:
    drawn: list[float] = []

    def constant(rng: random.Random, factor: float) -> float:
        drawn.append(factor)
        return 100.0 * factor + rng.random() * 1e-6  # no noise to speak of

    tally = simulate(sim_template(3), constant, 0.10, 5, seed=0)
    assert tally == Tally(sims=5, adopt=5, repeats=15)
    assert sorted(set(drawn)) == [0.9, 1.0] and len(drawn) == 30


def _fake_run_one(calls: list[tuple[str, int]]) -> Any:
    """`runner.run_one` without an engine: a child run in the store with the p95 TTFT of
    VALUES (label, repeat)."""
    def run_one(ctx: RunContext, label: str, value: Any, repeat: int, arrival: Any,
                slo: Any, **kw: Any) -> RunRecord:
        calls.append((label, repeat))
        run_id = ctx.store.create_run(f"{label} r{repeat}", parent_id=ctx.parent, tags={
            "value": label, "repeat": str(repeat), "role": "variant" if value else "baseline",
            "hardware_fingerprint": ctx.preflight["fingerprint"]})
        metrics = {"p95_ttft_ms": float(VALUES[label][repeat]), "error_rate": 0.0}
        ctx.store.log_metrics(run_id, metrics)
        ctx.store.finish(run_id)
        return RunRecord(label, value, repeat, run_id, metrics=metrics,
                         fingerprint=str(ctx.preflight["fingerprint"]))
    return run_one


def test_runner_adds_rounds_for_an_undecided_objective_and_resume_keeps_them(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(runner, "run_one", _fake_run_one(calls))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    t = parse_template(make(objective=OBJECTIVE, repeats=2, max_repeats=6, warmup_requests=0,
                            workload={"fixture": "balanced-chat", "seed": 0,
                                      "params": {"num_requests": 2}}))
    result = runner.run_experiment(t, uri=uri, progress=False, check=False)
    assert calls == [("baseline", 0), ("64", 0), ("128", 0), ("baseline", 1), ("64", 1),
                     ("128", 1), ("baseline", 2), ("64", 2), ("128", 2), ("baseline", 3),
                     ("64", 3), ("128", 3), ("baseline", 4), ("128", 4), ("baseline", 5),
                     ("128", 5)]
    assert [v.decision for v in result.verdicts] == ["ADOPT", "undecided"]
    assert result.adopted == 64
    assert result.table.startswith("Rule: a 99% Welch t interval")
    assert "| baseline (512) | 112.5 |" in result.table
    # --resume of the same experiment keeps every run, the extra rounds too: none measured
    client = MlflowClient(tracking_uri=uri)
    client.update_run(result.parent_run_id, status="RUNNING")
    client.set_tag(result.parent_run_id, "driver_host", "another-host")  # its driver gone
    calls.clear()
    again = runner.run_experiment(t, uri=uri, progress=False, check=False, resume=True)
    assert again.parent_run_id == result.parent_run_id and calls == []
    assert [v.decision for v in again.verdicts] == ["ADOPT", "undecided"]
    assert len(again.runs) == 16


# goodput (req/s) per (label, repeat) of the rate-sweep case: 64 is ~45% higher
GOODPUT = {"baseline": [2.0, 2.6, 1.9, 2.4, 2.1, 2.5], "64": [3.0, 3.3, 2.9, 3.2, 3.05, 3.1],
           "128": [2.0, 2.7, 2.2, 1.95, 2.55, 2.0]}


def _fake_sweep_point(calls: list[tuple[str, int, float]]) -> Any:
    """`runner.run_one` for one sweep point: attainment 1.0 at 1 req/s and, at 4 req/s, the
    share whose linear crossing of 0.9 lands on GOODPUT (label, repeat)."""
    def run_one(ctx: RunContext, label: str, value: Any, repeat: int, arrival: Any,
                slo: Any, **kw: Any) -> RunRecord:
        calls.append((label, repeat, arrival.rate))
        g = GOODPUT[label][repeat]
        attainment = 1.0 if arrival.rate == 1.0 else 1.0 - 0.3 / (g - 1.0)
        run_id = ctx.store.create_run(kw["name"], parent_id=ctx.parent, tags=kw["tags"])
        metrics = {"slo_attainment": attainment, "slo_requests": 10.0,
                   "slo_met_requests": round(10 * attainment), "error_rate": 0.0}
        ctx.store.log_metrics(run_id, metrics)
        ctx.store.finish(run_id)
        return RunRecord(label, value, repeat, run_id, metrics=metrics,
                         fingerprint=str(ctx.preflight["fingerprint"]))
    return run_one


def test_rate_sweep_rounds_sweep_every_rate_for_the_baseline_and_the_undecided(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int, float]] = []
    monkeypatch.setattr(runner, "run_one", _fake_sweep_point(calls))
    t = parse_template(make(
        arrivals=None, objective=None, slo=None, repeats=2, max_repeats=6, warmup_requests=0,
        workload={"fixture": "balanced-chat", "seed": 0, "params": {"num_requests": 2}},
        rate_sweep={"rates": [1, 4], "slo": {"ttft_ms": 1000, "tpot_ms": 100}}))
    result = runner.run_experiment(t, uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                                   progress=False, check=False)
    rounds = [(label, repeat) for label, repeat, rate in calls if rate == 1.0]
    assert [rate for _, _, rate in calls] == [1.0, 4.0] * len(rounds)  # whole sweeps
    # 64 is decided (ADOPT) after round 5; 128 stays undecided up to the cap of 6
    assert rounds == [("baseline", 0), ("64", 0), ("128", 0), ("baseline", 1), ("64", 1),
                      ("128", 1), ("baseline", 2), ("64", 2), ("128", 2), ("baseline", 3),
                      ("64", 3), ("128", 3), ("baseline", 4), ("64", 4), ("128", 4),
                      ("baseline", 5), ("128", 5)]
    by = {v.value: v for v in result.verdicts}
    assert by[64].decision == "ADOPT" and by[64].valid_runs == 5
    assert by[128].decision == "undecided" and by[128].valid_runs == 6
    assert [(r.label, r.repeat) for r in result.runs] == rounds
    assert [round(r.metrics["goodput"], 6) for r in result.runs[:3]] == [2.0, 3.0, 2.0]
    # the sweep's curves hold every round: the baseline has 6 repeats, 64 five
    assert [len(c) for c in result.rate_sweep.curves().values()] == [6, 5, 6]
