"""An experiment whose runs an injected CPU watch calls disturbed: each such run says so on the
console, is tagged run_valid=false in MLflow with its share, and the verdict leaves it out."""

from __future__ import annotations

from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template
from workbench.harness.validity import FixedCpuWatch

TEMPLATE: dict[str, Any] = {
    "name": "tiny-disturbed",
    "question": "Is a verdict ever drawn from runs the neighbours slowed down?",
    "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
    "workload": {"fixture": "balanced-chat", "seed": 3,
                 "params": {"num_requests": 2, "output_len": 4}},
    "arrivals": {"mode": "closed", "concurrency": 2},
    "baseline": {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4,
                 "max_num_batched_tokens": 256},
    "variable": {"name": "max_num_batched_tokens", "values": [64]},
    "repeats": 2,
    "warmup_requests": 0,
}


def test_disturbed_runs_are_flagged_everywhere(tmp_path: Any,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Runs in order: baseline r0, 64 r0, baseline r1, 64 r1; the watch disturbs 64 r1.
    watch = FixedCpuWatch(0.0, 0.1, 0.0, 0.6)
    result = run_experiment(parse_template(TEMPLATE), uri=uri, progress=False, cpu_watch=watch)
    assert watch.calls == 4
    captured = capsys.readouterr()
    assert captured.out.splitlines().count(  # by its value label, once, nothing else said
        "INVALID run budget=64 repeat 2/2: other processes used 60% of the CPUs "
        "(threshold 25%); not used for any result") == 1
    assert "INVALID benchmark run" not in captured.out + captured.err
    assert [(r.label, r.repeat, r.valid, r.disturbed, r.other_cpu_share) for r in result.runs] \
        == [("baseline", 0, True, False, 0.0), ("64", 0, True, False, 0.1),
            ("baseline", 1, True, False, 0.0), ("64", 1, False, True, 0.6)]
    (v,) = result.verdicts
    assert v.inconclusive and not v.adopted and result.adopted is None
    assert v.reason.startswith("inconclusive: runs disturbed (0 baseline and 1 variant run(s)")
    assert "| inconclusive |" in result.table

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.data.tags["adopted"] == "none"
    assert parent.data.tags["disturbed_runs"] == "1" and parent.data.tags["invalid_runs"] == "1"
    runs = {r.run_id: client.get_run(r.run_id) for r in result.runs}
    bad = runs[result.runs[3].run_id]
    assert bad.info.status == "FINISHED"  # measured and kept, marked
    assert bad.data.tags["run_valid"] == "false" and bad.data.tags["max_other_cpu_share"] == "0.25"
    assert bad.data.tags["validity"].startswith("other processes used 60% of the CPUs during "
                                                "the run (threshold 25%)")
    assert bad.data.metrics["other_cpu_share"] == 0.6 and bad.data.metrics["valid"] == 0.0
    ok = runs[result.runs[1].run_id]
    assert ok.data.tags["run_valid"] == "true" and ok.data.tags["validity"] == "valid"
    assert ok.data.metrics["other_cpu_share"] == 0.1 and ok.data.metrics["valid"] == 1.0
    found = client.search_runs([parent.info.experiment_id],
                               filter_string="tags.run_valid = 'false'")
    assert [r.info.run_id for r in found] == [bad.info.run_id]


def test_threshold_is_configurable_and_checked_before_any_run(tmp_path: Any) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ValueError, match=r"max_other_cpu_share \(1.5\) must be a share"):
        run_experiment(parse_template(TEMPLATE), uri=uri, progress=False,
                       max_other_cpu_share=1.5)
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store was touched
