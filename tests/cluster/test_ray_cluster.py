"""`--executor ray` end to end on a real two-node Ray cluster on this machine (`ray start
--head` + `ray start --address`, 1 CPU and one `workbench_node` each) with an MLflow
tracking server (workbench/testing/local_cluster.py):

- an experiment and a notebook sweep run across both nodes, each run on one node at a time
  (the runs' node tags and times say so), with results identical in structure to a local run;
- a worker node killed mid-sweep loses no point: the point reruns on the other node and its
  killed run is marked KILLED.

Skipped when Ray is not installed (`pip install -e '.[cluster]'`). Every step is bounded in
time and every process the module starts is killed at its end.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[cluster]'")

from mlflow.tracking import MlflowClient  # noqa: E402

from tests.experiments.template_dicts import TINY_BUDGET, changed  # noqa: E402
from tests.sweeps.test_sweep import _tiny_notebook, _waiting_notebook  # noqa: E402
from workbench.testing.local_cluster import LocalCluster  # noqa: E402

pytestmark = pytest.mark.slow
PARENT_TAG = "mlflow.parentRunId"
RAY_ONLY_TAGS = {"ray_node_id", "ray_worker_pid"}  # where a Ray task ran; nothing else differs
CLI_TIMEOUT_S = 300
TEMPLATE = changed(TINY_BUDGET, name="cluster-budget", repeats=2)  # 4 runs: A B A B


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *argv], cwd=cwd, text=True,
                          capture_output=True, timeout=CLI_TIMEOUT_S)


def children(client: MlflowClient, parent: str) -> list[Any]:
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")


def one_at_a_time(runs: list[Any]) -> None:
    """No two runs overlapped on one node (MLflow start / end times, ms)."""
    by_node: dict[str, list[tuple[int, int]]] = {}
    for r in runs:
        by_node.setdefault(r.data.tags["node"], []).append((r.info.start_time, r.info.end_time))
    for node, spans in by_node.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"two runs overlapped on node {node}: {spans}"


def structure(client: MlflowClient, run: Any) -> dict[str, Any]:
    """What a run holds, without the values: tag, param and metric names, artifacts."""
    return {"tags": sorted(set(run.data.tags) - RAY_ONLY_TAGS),
            "params": sorted(run.data.params), "metrics": sorted(run.data.metrics),
            "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id))}


def read_csv(folder: Path) -> list[dict[str, str]]:
    with (folder / "runs.csv").open() as f:
        return list(csv.DictReader(f))


def test_experiment_runs_across_both_nodes_like_a_local_run(cluster: LocalCluster,
                                                            tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(TEMPLATE))
    out = cli("run", str(path), "--executor", "ray", "--address", cluster.address,
              "--tracking-uri", cluster.tracking_uri, "--results-dir", str(tmp_path / "r"),
              cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("[")]
    assert len(lines) == 4 and all(" on head" in x or " on worker" in x for x in lines), lines
    client = MlflowClient(tracking_uri=cluster.tracking_uri)
    parent_id = next(x for x in out.stdout.splitlines() if "MLflow parent run" in x
                     ).split("MLflow parent run ")[1].rstrip(")")
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["executor"] == "ray"
    kids = children(client, parent_id)
    assert sorted(k.info.status for k in kids) == ["FINISHED"] * 4
    assert {k.data.tags["node"] for k in kids} == {"head", "worker"}
    assert len({k.data.tags["hardware_fingerprint"] for k in kids}) == 1
    one_at_a_time(kids)
    (folder,) = (tmp_path / "r" / "cluster-budget").iterdir()
    rows = read_csv(folder)
    assert [(r["value"], r["repeat"]) for r in rows] == [  # the interleaved order, kept
        ("baseline", "1"), ("64", "1"), ("baseline", "2"), ("64", "2")]

    # the same template run here (local executor): the same structure everywhere
    from workbench.experiments.runner import run_experiment
    from workbench.experiments.template import parse_template

    local = run_experiment(parse_template(TEMPLATE), uri=f"sqlite:///{tmp_path / 'l.db'}",
                           progress=False, results_dir=tmp_path / "local")
    lclient = MlflowClient(tracking_uri=local.tracking_uri)
    lkids = children(lclient, local.parent_run_id)
    assert {k.data.tags["executor"] for k in lkids} == {"local"}
    ray_kid = next(k for k in kids if k.data.tags["value"] == "64")
    local_kid = next(k for k in lkids if k.data.tags["value"] == "64")
    assert structure(client, ray_kid) == structure(lclient, local_kid)
    assert structure(client, parent)["artifacts"] == sorted(
        structure(lclient, lclient.get_run(local.parent_run_id))["artifacts"] + ["nodes.json"])
    assert list(rows[0]) == list(read_csv(local.results_dir)[0])
    verdict = [x for x in out.stdout.splitlines() if x.startswith("| budget=64")]
    assert len(verdict) == 1 and local.table.splitlines()[0] in out.stdout


def test_sweep_runs_across_both_nodes_like_a_local_sweep(cluster: LocalCluster,
                                                         tmp_path: Path) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")  # x=2 fails: a failed point, as locally
    args = ["sweep", str(nb), "-p", "x", "1", "2", "--set", "flag=none", "--no-progress"]
    out = cli(*args, "--executor", "ray", "--address", cluster.address, "--tracking-uri",
              cluster.tracking_uri, "--results-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]  # x=2 failed
    (folder,) = (tmp_path / "r" / "sweep-tiny").iterdir()
    rows = read_csv(folder)
    assert [(r["value"], r["status"]) for r in rows] == [("1", "FINISHED"), ("2", "FAILED")]
    assert sorted(p.name for p in (folder / "notebooks").iterdir()) == [
        "00_x=1.ipynb", "01_x=2.ipynb"]
    client = MlflowClient(tracking_uri=cluster.tracking_uri)
    parent = client.get_run(rows[0]["run_id"]).data.tags[PARENT_TAG]
    kids = children(client, parent)
    assert {k.data.tags["node"] for k in kids} == {"head", "worker"}
    assert all(Path(k.data.tags["output_path"]).parent == folder / "notebooks" for k in kids)
    one_at_a_time(kids)

    local = cli(*args, "--tracking-uri", f"sqlite:///{tmp_path / 'l.db'}", "--results-dir",
                str(tmp_path / "l"), cwd=tmp_path)
    assert local.returncode == 1, local.stderr[-3000:]
    (lfolder,) = (tmp_path / "l" / "sweep-tiny").iterdir()
    assert list(read_csv(lfolder)[0]) == list(rows[0])
    lclient = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'l.db'}")
    lparent = lclient.get_run(read_csv(lfolder)[0]["run_id"]).data.tags[PARENT_TAG]
    one = {k.data.tags["sweep_value"]: k for k in kids}
    lone = {k.data.tags["sweep_value"]: k for k in children(lclient, lparent)}
    for value in ("1", "2"):
        assert structure(client, one[value]) == structure(lclient, lone[value])


def test_a_killed_worker_node_loses_no_point(cluster: LocalCluster, tmp_path: Path) -> None:
    nb = _waiting_notebook(tmp_path / "wait.ipynb")  # each point waits for the flag file
    flag = tmp_path / "go"
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", str(nb), "-p", "x", "1", "2", "3",
           "4", "--set", f"flag={flag}", "--no-progress", "--executor", "ray", "--address",
           cluster.address, "--tracking-uri", cluster.tracking_uri, "--experiment", "kill",
           "--results-dir", str(tmp_path / "r")]
    log = tmp_path / "sweep.log"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path,
                                start_new_session=True)
    client = MlflowClient(tracking_uri=cluster.tracking_uri)
    try:
        deadline = time.monotonic() + 180
        victim = None
        while victim is None:  # a point running on the worker node
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            exp = client.get_experiment_by_name("kill")
            runs = [] if exp is None else client.search_runs(
                [exp.experiment_id], filter_string="attributes.status = 'RUNNING'")
            victim = next((r for r in runs if r.data.tags.get("node") == "worker"), None)
            time.sleep(0.5)
        cluster.kill("worker")
        flag.write_text("go")
        rc = proc.wait(timeout=CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert f"(run {victim.info.run_id}) was lost: " in text and "marked KILLED; it runs again" \
        in text, text[-3000:]
    killed = client.get_run(victim.info.run_id)
    assert killed.info.status == "KILLED" and killed.data.tags["error"].startswith(
        "killed: its node was lost")
    runs = client.search_runs([client.get_experiment_by_name("kill").experiment_id],
                              filter_string="tags.kind = 'sweep-point'")
    finished = {r.data.tags["sweep_value"]: r for r in runs if r.info.status == "FINISHED"}
    assert sorted(finished) == ["1", "2", "3", "4"]  # no point lost
    assert [r.info.status for r in runs].count("KILLED") == 1
    rerun = finished[victim.data.tags["sweep_value"]]
    assert rerun.data.tags["node"] == "head"  # the point ran again elsewhere
