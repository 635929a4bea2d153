"""A rate sweep end to end on the bundled checkpoint, logged to a temporary MLflow store.

The SLO is generous (10 minutes), so every request that runs meets it whatever the machine's
speed: attainment is 1.0 on every measured point and the goodput values are exact. Failures
give the other cases: value 4 (< max_num_seqs) fails every point (check=False lets it run),
and an injected failure of the harness's `run` fails budget=64 at 8 req/s (attainment 0 there).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.experiments.template_dicts import TINY_BUDGET, changed
from workbench.experiments.runner import ExperimentResult, run_experiment
from workbench.experiments.template import parse_template
from workbench.harness.goodput import GoodputSLO, goodput, meets_slo
from workbench.harness.metrics import RequestRecord

TEMPLATE = changed(
    TINY_BUDGET, name="tiny-rate-sweep", question="Does the budget change goodput?",
    objective=None, slo=None, arrivals=None, repeats=2,
    workload={"fixture": "balanced-chat", "seed": 3,
              "params": {"num_requests": 3, "output_len": {"kind": "uniform", "low": 2,
                                                           "high": 4}}},
    variable={"name": "max_num_batched_tokens", "values": [64, 4]},
    rate_sweep={"rates": [2, 8], "slo": {"ttft_ms": 600000, "tpot_ms": 600000},
                "attainment": 0.75, "num_workers": 2})
SLO = GoodputSLO(600000, 600000, 0.75)
CONSOLE: dict[str, str] = {}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentResult, str]:
    import workbench.harness.replay as harness_runner

    real_run = harness_runner.run

    def run(target: Any, workload: Any, arrival: Any, **kw: Any) -> Any:
        if target.engine_kwargs.get("max_num_batched_tokens") == 64 and arrival.rate == 8.0:
            raise RuntimeError("injected failure at 8 req/s")
        return real_run(target, workload, arrival, **kw)

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.setattr(harness_runner, "run", run)
        result = run_experiment(parse_template(TEMPLATE), uri=uri, progress=False,
                                check=False, results_dir=tmp_path_factory.mktemp("results"))
    CONSOLE["out"] = buf.getvalue()
    return result, uri


def test_goodput_per_value_and_repeat(experiment: tuple[ExperimentResult, str]) -> None:
    result, _ = experiment
    assert [(r.label, r.repeat, r.error) for r in result.runs] == [
        ("baseline", 0, None), ("64", 0, None),
        ("4", 0, "every sweep point failed: RuntimeError: ValueError: "
                 "max_num_batched_tokens (4) must be "
                 ">= max_num_seqs (8); raise it or lower max_num_seqs"),
        ("baseline", 1, None), ("64", 1, None), ("4", 1, result.runs[2].error)]
    # baseline: passes at 2 and 8 -> 8, a lower bound; budget=64: (2, 1.0) -> (8, 0.0)
    # crosses 0.75 at 2 + 0.25 * 6 = 3.5; budget=4: (0, 1.0) -> (2, 0.0) gives 0.5
    assert [(r.label, r.metrics) for r in result.runs[:3]] == [
        ("baseline", {"goodput": 8.0, "goodput_per_worker": 4.0, "goodput_lower_bound": 1.0,
                      "failed_points": 0.0}),
        ("64", {"goodput": 3.5, "goodput_per_worker": 1.75, "goodput_lower_bound": 0.0,
                "failed_points": 1.0}),
        ("4", {"goodput": 0.5, "goodput_per_worker": 0.25, "goodput_lower_bound": 0.0,
               "failed_points": 2.0})]
    assert result.rate_sweep.bands() == {
        "baseline (256)": [(2.0, 1.0, 1.0, 1.0), (8.0, 1.0, 1.0, 1.0)],
        "budget=64": [(2.0, 1.0, 1.0, 1.0), (8.0, 0.0, 0.0, 0.0)],
        "budget=4": [(2.0, 0.0, 0.0, 0.0), (8.0, 0.0, 0.0, 0.0)]}


def test_verdict_compares_goodput(experiment: tuple[ExperimentResult, str]) -> None:
    result, _ = experiment
    by = {v.value: v for v in result.verdicts}
    g = by[64].metrics["goodput"]
    assert (g.baseline_median, g.variant_median, g.verdict) == (8.0, 3.5, "worse")
    assert by[64].reason == ("objective goodput worse (-56.2%, interval -56.2% .. -56.2%)"
                             ) and not by[64].adopted  # equal repeats: a zero-width interval
    assert by[4].reason == "2 run(s) failed" and result.adopted is None
    assert ("| budget=64 | 3.5 (-56.2% [-56.2%, -56.2%], worse) | 1.75 (-56.2% [-56.2%, "
            "-56.2%], worse) | reject |") in result.table
    assert "| baseline (256) | 1.00 [1.00, 1.00] | 1.00 [1.00, 1.00] | >= 8 | >= 4 |" \
        in result.table
    assert "- budget=64 @ 8 req/s repeat 2: RuntimeError: injected failure at 8 req/s" \
        in result.table
    assert ("sweep point budget=64 @ 8 req/s repeat 1/2 FAILED (RuntimeError: injected "
            "failure at 8 req/s): counted as SLO attainment 0") in CONSOLE["out"].splitlines()


def _children(client: MlflowClient, run: Any, parent_id: str) -> list[Any]:
    return client.search_runs([run.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")


def test_logged_sweep_runs_and_points(experiment: tuple[ExperimentResult, str],
                                      tmp_path: Path) -> None:
    result, uri = experiment
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result.parent_run_id)
    sweeps = _children(client, parent, result.parent_run_id)
    assert sorted((c.info.run_name, c.info.status) for c in sweeps) == [
        ("baseline (256) r1", "FINISHED"), ("baseline (256) r2", "FINISHED"),
        ("budget=4 r1", "FAILED"), ("budget=4 r2", "FAILED"),
        ("budget=64 r1", "FINISHED"), ("budget=64 r2", "FINISHED")]
    child = client.get_run(result.runs[1].run_id)  # budget=64, repeat 1
    assert child.data.tags["rates"] == "[2.0, 8.0]" and child.data.tags["verdict"] == "worse"
    assert child.data.tags["failed_rates"] == "[8.0]"
    assert child.data.params["rate_sweep.rates"] == "[2.0, 8.0]"
    assert child.data.params["arrival_mode"] == "poisson"
    assert child.data.metrics["goodput"] == 3.5 and child.data.metrics["goodput_per_worker"] \
        == 1.75
    history = client.get_metric_history(child.info.run_id, "slo_attainment")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.0)]

    checked = 0
    for sweep in (s for s in sweeps if s.info.status == "FINISHED"):
        points = sorted(_children(client, sweep, sweep.info.run_id),
                        key=lambda p: int(p.data.tags["rate_index"]))
        assert [p.data.params["request_rate"] for p in points] == ["2.0", "8.0"]
        curve = []
        for p in points:
            if p.info.status == "FAILED":  # the injected failure: attainment 0 at its rate
                assert p.info.run_name == "budget=64 @ 8 req/s"
                curve.append((float(p.data.params["request_rate"]), 0.0))
                continue
            # the logged attainment is the one the point's per-request records give
            path = client.download_artifacts(p.info.run_id, "requests.csv", str(tmp_path))
            met = sum(meets_slo(_record(row), SLO)
                      for row in pd.read_csv(path).to_dict("records"))
            assert p.data.metrics["slo_requests"] == 3
            assert p.data.metrics["slo_met_requests"] == met == 3
            assert p.data.metrics["slo_attainment"] == met / 3
            assert p.data.params["arrival_seed"] == "3"
            curve.append((float(p.data.params["request_rate"]),
                          p.data.metrics["slo_attainment"]))
            checked += 1
        # ...and the sweep's goodput the one its points' attainments give
        assert sweep.data.metrics["goodput"] == goodput(curve, 0.75, 2).rate
    assert checked == 6


def _record(row: dict[str, Any]) -> RequestRecord:
    """A requests.csv row back as the record it was written from (the times meets_slo reads)."""
    def opt(v: Any) -> float | None:
        return None if pd.isna(v) else float(v)

    return RequestRecord(str(row["request_id"]), int(row["prompt_tokens"]),
                         int(row["output_tokens"]), bool(row["success"]),
                         start_s=float(row["start_s"]), first_token_s=opt(row["first_token_s"]),
                         end_s=opt(row["end_s"]))


def test_parent_artifacts_and_results_folder(experiment: tuple[ExperimentResult, str]) -> None:
    result, uri = experiment
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result.parent_run_id)
    arts = client.list_artifacts(result.parent_run_id)
    assert not [a.path for a in arts if a.is_dir]
    assert sorted(a.path for a in arts)[0] == "VERDICT.md"
    assert {"slo_attainment.png", "slo_attainment.csv", "verdicts.json"} <= {
        a.path for a in arts}
    assert parent.data.metrics["goodput/baseline"] == 8.0
    assert parent.data.metrics["goodput/budget_64"] == 3.5
    history = client.get_metric_history(result.parent_run_id, "slo_attainment/budget_64")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.0)]
    folder = result.results_dir
    assert sorted(p.name for p in folder.iterdir()) == [
        "VERDICT.md", "points.csv", "runs.csv", "runs.json", "slo_attainment.csv",
        "slo_attainment.png"]
    points = pd.read_csv(folder / "points.csv")
    assert len(points) == 12 and list(points["status"]).count("FAILED") == 6
    band = pd.read_csv(folder / "slo_attainment.csv")
    assert list(band.columns) == ["label", "rate", "attainment_median", "attainment_min",
                                  "attainment_max", "goodput", "goodput_per_worker",
                                  "goodput_lower_bound"]
    assert list(band["goodput"]) == [8.0, 8.0, 3.5, 3.5, 0.5, 0.5]
