"""The figure in docs/cluster.md: the same 12-run experiment (baseline + 3 budgets x 3
repeats, bundled checkpoint) with `--executor local` and on a two-node local Ray cluster
(`workbench.testing.local_cluster`: `ray start --head` + `ray start --address`, 1 CPU each,
an `mlflow server` on 127.0.0.1). Prints one Markdown row per executor: wall time, runs per
node, the other processes' CPU share each run measured (`validity.CpuWatch`: min / median /
max) and how many runs that share made invalid (threshold 0.25); then the same on the
head node alone (the worker stopped).

    .venv/bin/python scripts/cluster_figure.py [--requests 32]

The local run goes first, with a sqlite store and no cluster up; the cluster then starts and
the same template runs on it. WORKBENCH_OTHER_CPU_SHARE must be unset (it states the share
instead of measuring it).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def template(requests: int) -> dict[str, object]:
    return {
        "name": "cluster-figure",
        "question": "Where does the same 12-run experiment spend its time: here or on 2 nodes?",
        "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
        "workload": {"fixture": "balanced-chat", "seed": 3,
                     "params": {"num_requests": requests}},
        "arrivals": {"mode": "closed", "concurrency": 2},
        "baseline": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
                     "max_num_batched_tokens": 256},
        "variable": {"name": "max_num_batched_tokens", "values": [32, 64, 128]},
        "repeats": 3,
        "warmup_requests": 1,
    }


def run(argv: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "workbench.cli", *argv], cwd=cwd, text=True,
                         capture_output=True, timeout=1800)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed:\n{out.stdout[-3000:]}\n"
                         f"{out.stderr[-3000:]}")
    return wall


def wait_for_nodes(address: str, count: int, timeout_s: float = 120.0) -> None:
    """Until Ray counts `count` workbench_node resources (a killed node is declared dead
    after its missed heartbeats)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run([str(Path(sys.executable).parent / "ray"), "status",
                              f"--address={address}"], text=True, capture_output=True,
                             timeout=60).stdout
        if f"/{count}.0 workbench_node" in out:
            return
        time.sleep(2)
    raise SystemExit(f"the cluster did not come down to {count} node(s) in {timeout_s:.0f} s")


def row(name: str, wall: float, folder: Path) -> str:
    (res,) = folder.iterdir()
    with (res / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    shares = sorted(float(r["other_cpu_share"]) for r in runs if r["other_cpu_share"])
    nodes = Counter(r["node"] for r in runs)
    invalid = sum(r["valid"] == "False" for r in runs)
    per_node = ", ".join(f"{n}: {c}" for n, c in sorted(nodes.items()))
    return (f"| {name} | {len(runs)} | {wall:.0f} | {per_node} | {shares[0]:.2f} / "
            f"{statistics.median(shares):.2f} / {shares[-1]:.2f} | {invalid} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32, help="requests per run")
    args = ap.parse_args()
    if os.environ.get("WORKBENCH_OTHER_CPU_SHARE"):
        raise SystemExit("unset WORKBENCH_OTHER_CPU_SHARE: the share must be measured")
    from workbench.testing.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="wbfig") as tmp:
        work = Path(tmp)
        path = work / "t.yaml"
        path.write_text(yaml.safe_dump(template(args.requests)))
        local = run(["run", str(path), "--tracking-uri", f"sqlite:///{work / 'l.db'}",
                     "--results-dir", str(work / "local")], work)
        lines = ["| executor | runs | wall s | runs per node | others' CPU share per run "
                 "(min / median / max) | invalid runs |", "|---|---|---|---|---|---|",
                 row("local", local, work / "local" / "cluster-figure")]
        with LocalCluster.start() as c:
            ray = ["run", str(path), "--executor", "ray", "--address", c.address,
                   "--tracking-uri", c.tracking_uri, "--results-dir"]
            wall = run([*ray, str(work / "ray2")], work)
            lines.append(row("ray, 2 nodes", wall, work / "ray2" / "cluster-figure"))
            c.kill("worker")  # the head alone: one run at a time, Ray's daemons still up
            wait_for_nodes(c.address, 1)
            wall = run([*ray, str(work / "ray1")], work)
            lines.append(row("ray, 1 node (worker stopped)", wall,
                             work / "ray1" / "cluster-figure"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
