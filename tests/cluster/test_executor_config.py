"""The executor seam without a cluster: the config and its refusals (one line each, before
any work), the template's `cluster` block, the mixed-hardware rule, the local executor's
order, and what `--executor ray` says when Ray is missing."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.test_cli_errors import last_line, run_main
from workbench.errors import UserError
from workbench.experiments.executors.base import LocalExecutor
from workbench.experiments.executors.config import (
    ExecutorConfig,
    check_tracking_uri,
    cluster_problems,
)
from workbench.experiments.fingerprints import common_fingerprint, mixed_nodes, mixed_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "rey"}, "executor ('rey') must be one of local, ray (did you mean 'ray'?)"),
    ({"address": "10.0.0.1:6379"}, "address ('10.0.0.1:6379') names a Ray cluster: it needs "
                                   "--executor ray"),
    ({"kind": "ray", "num_gpus": -1}, "num_gpus (-1) must be a number >= 0"),
    ({"kind": "ray", "runs_per_node": 0}, "runs_per_node (0) must be an integer >= 1"),
    ({"kind": "ray", "max_attempts": 0}, "max_attempts (0) must be an integer >= 1"),
])
def test_config_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as e:
        ExecutorConfig(**kwargs)
    assert str(e.value).startswith(message)


def test_node_share_and_cluster_block() -> None:
    assert ExecutorConfig("ray", runs_per_node=4).node_share == 0.25
    assert cluster_problems({"num_gpus": 1, "runs_per_node": 2}) == []
    assert cluster_problems({"num_gpu": 1, "runs_per_node": 1.5}) == [
        "unknown cluster key 'num_gpu' (did you mean 'num_gpus'?); allowed: num_cpus, "
        "num_gpus, runs_per_node",
        "cluster.runs_per_node (1.5) must be an integer >= 1 (1: each run holds a whole node)"]
    assert cluster_problems([1]) == [
        "cluster must be a mapping {num_cpus, num_gpus, runs_per_node}, not [1]"]


def test_a_template_with_a_bad_cluster_block_is_refused_whole() -> None:
    from tests.experiments.template_dicts import TINY_BUDGET, changed
    from workbench.experiments.validate import template_problems

    problems = template_problems(changed(TINY_BUDGET, cluster={"runs_per_node": 0})).problems
    assert problems == ["cluster.runs_per_node (0) must be an integer >= 1 (1: each run holds "
                        "a whole node)"]


def test_a_cluster_needs_a_tracking_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ray = ExecutorConfig("ray")
    check_tracking_uri(ray, "http://10.0.0.1:5000")
    check_tracking_uri(ExecutorConfig(), None)  # local: anything
    check_tracking_uri(ExecutorConfig("ray", address="local"), "sqlite:///x.db")  # one machine
    with pytest.raises(UserError, match=r"tracking URI \('sqlite:///x.db', --tracking-uri\) "
                                        "must be an MLflow tracking server every node"):
        check_tracking_uri(ray, "sqlite:///x.db")
    with pytest.raises(UserError, match="the default store"):
        check_tracking_uri(ray, None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.1:5000")
    check_tracking_uri(ray, None)


def _run(fp: str | None, node: str, error: str | None = None) -> Any:
    return SimpleNamespace(fingerprint=fp, node=node, error=error)


def test_mixed_hardware_has_no_verdict() -> None:
    assert mixed_runs([_run("a", "n1"), _run("a", "n2"), _run("b", "n3", error="x")]) is None
    reason = mixed_runs([_run("a", "n1"), _run("b", "n2"), _run("a", "n3")])
    assert reason == ("no verdict: the runs were measured on different hardware/software "
                      "(fingerprint a on n1, n3; b on n2), so their numbers do not compare; "
                      "run on nodes of one kind, or pass --allow-mixed-hardware to compare "
                      "them anyway")


def test_mixed_nodes_are_refused_naming_the_fields() -> None:
    def probe(node: str, gpu: str) -> dict[str, Any]:
        pre = {"gpu": [{"name": gpu, "driver_version": "570"}], "software": {"torch": "2.13.0"}}
        return {"node": node, "fingerprint": gpu[:4], "preflight": pre}

    same = [probe("a", "H100"), probe("b", "H100")]
    assert mixed_nodes(same) is None and common_fingerprint(same) == "H100"
    mixed = [probe("a", "H100"), probe("b", "A100")]
    reason = mixed_nodes(mixed)
    assert reason is not None and reason.startswith(
        "the Ray cluster's nodes differ in hardware/software (fingerprint A100 on b; H100 on a; "
        "gpu_name differs: 'A100' vs 'H100')")
    assert reason.endswith("or pass --allow-mixed-hardware")
    assert common_fingerprint(mixed) == "mixed:A100,H100"


def test_local_executor_runs_in_order() -> None:
    seen: list[tuple[int, str]] = []
    done = list(LocalExecutor(ExecutorConfig()).run(
        lambda p, attempt: p * 10, [1, 2, 3], started=lambda i: seen.append((i, "start"))))
    assert [(d.index, d.value) for d in done] == [(0, 10), (1, 20), (2, 30)]
    assert seen == [(0, "start"), (1, "start"), (2, "start")]


@pytest.mark.parametrize(("argv", "line"), [
    (["run", "experiments/ngram_speculation.yaml", "--address", "10.0.0.1:6379"],
     "workbench run: address ('10.0.0.1:6379') names a Ray cluster: it needs --executor ray"),
    (["run", "experiments/ngram_speculation.yaml", "--executor", "ray", "--num-gpus", "-1"],
     "workbench run: num_gpus (-1.0) must be a number >= 0"),
    (["sweep", "notebooks/01_quickstart.ipynb", "-p", "num_requests", "4", "--executor",
      "ray", "--tracking-uri", "sqlite:///x.db"],
     "workbench sweep: tracking URI ('sqlite:///x.db', --tracking-uri) must be an MLflow "
     "tracking server"),
])
def test_cli_refuses_bad_executor_input(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                        line: str) -> None:
    monkeypatch.chdir(ROOT)
    code, err = run_main(capsys, *argv)
    assert code == 2 and "Traceback" not in err
    assert last_line(err).startswith(line), err


def test_ray_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.experiments.executors.factory import make_executor

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(UserError, match=r"--executor ray needs Ray, which is not installed: "
                                        r"pip install -e '\.\[cluster\]'"):
        make_executor(ExecutorConfig("ray"))
