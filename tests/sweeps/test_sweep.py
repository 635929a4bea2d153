"""workbench.sweeps: one papermill run per value, MLflow child runs, failures recorded, resume."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from mlflow.tracking import MlflowClient

from workbench.sweeps.cli import main, parse_value
from workbench.sweeps.driver import sweep

PARENT_TAG = "mlflow.parentRunId"


def _tiny_notebook(path: Path) -> Path:
    """Parameters cell + an assert that fails for x == 2 unless the `flag` file exists."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'x = 1\ny = 5\nflag = ""\nmlflow_uri = ""\nmlflow_parent_run_id = ""\n'
        'mlflow_experiment = ""'
    )
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell(
            "from pathlib import Path\n"
            "assert x != 2 or Path(flag).exists(), f'x={x} is refused'\n"
            "print('ran', x, mlflow_parent_run_id)"
        ),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def _children(client: MlflowClient, parent: str) -> list:
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")


def test_sweep_records_failures_and_resume_reruns_only_them(tmp_path: Path) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    flag = tmp_path / "flag"
    kw = dict(fixed={"flag": str(flag)}, experiment="sweep-test", uri=uri,
              out_dir=tmp_path / "out", progress=False)
    rows = sweep(nb, "x", [1, 2, 3], **kw)
    assert [r["status"] for r in rows] == ["FINISHED", "FAILED", "FINISHED"]
    assert "AssertionError" in rows[1]["error"] and "x=2 is refused" in rows[1]["error"]
    assert all(Path(r["output_path"]).is_file() for r in rows)  # the failed one too

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(rows[0]["run_id"]).data.tags[PARENT_TAG]
    assert client.get_run(parent).info.status == "FAILED"
    kids = {r.info.run_id: r for r in _children(client, parent)}
    assert sorted(r.info.status for r in kids.values()) == ["FAILED", "FINISHED", "FINISHED"]
    failed = kids[rows[1]["run_id"]]
    assert "x=2 is refused" in failed.data.tags["error"]
    assert failed.data.params["x"] == "2" and failed.data.params["flag"] == str(flag)
    assert failed.data.params["y"] == "5"  # declared defaults are logged as params ...
    assert "mlflow_uri" not in failed.data.params  # ... the injected plumbing is not
    arts = {a.path for a in client.list_artifacts(rows[1]["run_id"])}
    assert {"error.txt", Path(rows[1]["output_path"]).name} <= arts
    executed = nbformat.read(rows[0]["output_path"], as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert f"ran 1 {rows[0]['run_id']}" in text  # mlflow_parent_run_id was injected

    flag.write_text("now x=2 passes")
    again = sweep(nb, "x", [1, 2, 3], resume=True, **kw)
    assert [r["status"] for r in again] == ["SKIPPED", "FINISHED", "SKIPPED"]
    assert again[0]["run_id"] == rows[0]["run_id"] and again[1]["run_id"] != rows[1]["run_id"]
    kids = _children(client, parent)
    assert len(kids) == 4
    assert sorted(r.info.status for r in kids) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    assert client.get_run(parent).info.status == "FINISHED"


def test_sweep_rejects_undeclared_parameter(tmp_path: Path) -> None:
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    with pytest.raises(ValueError, match="not declared"):
        sweep(nb, "z", [1], uri=f"sqlite:///{tmp_path / 'm.db'}", out_dir=tmp_path,
              progress=False)


def test_cli_parses_values_and_fixed(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Also: the kernel (a child process: capfd sees its stderr) does not warn about TCP;
    the console ends with the summary table and the results folder, which holds the
    executed notebooks, runs.csv, runs.json and summary.md."""
    import csv

    assert parse_value("8") == 8 and parse_value("[1, 2]") == [1, 2]
    assert parse_value("abc") == "abc" and parse_value("true") is True
    nb = _tiny_notebook(tmp_path / "tiny.ipynb")
    code = main([str(nb), "-p", "x", "1", "3", "--set", "flag=none", "--tracking-uri",
                 f"sqlite:///{tmp_path / 'cli.db'}", "--results-dir", str(tmp_path / "r"),
                 "--no-progress", "--resume"])  # nothing to resume yet: a new sweep
    assert code == 0
    out, err = capfd.readouterr()
    assert "IPKernelApp" not in err and "without encryption" not in err
    assert out.count("FINISHED") == 2
    lines = out.strip().splitlines()
    assert lines[0].split("|")[1:4] == [" x ", " status   ", " run          "]
    assert lines[2].startswith("| 1 | FINISHED |") and lines[3].startswith("| 3 | FINISHED |")
    (folder,) = (tmp_path / "r" / "sweep-tiny").iterdir()
    assert lines[-1] == f"results folder: {folder}"
    assert sorted(p.name for p in folder.iterdir()) == [
        "notebooks", "runs.csv", "runs.json", "summary.md"]
    assert sorted(p.name for p in (folder / "notebooks").iterdir()) == [
        "00_x=1.ipynb", "01_x=3.ipynb"]
    with (folder / "runs.csv").open() as f:
        header = next(csv.reader(f))
    assert header == ["param", "value", "status", "valid", "other_cpu_share", "run_id",
                      "notebook", "error", "node"]
    parent = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'cli.db'}").search_runs(
        ["1"], filter_string="tags.kind = 'sweep'")[0]
    assert lines[-3] == ("sweep (the parent run's summary and plot): http://127.0.0.1:5000/#/"
                         f"experiments/1/runs/{parent.info.run_id}/artifacts/summary.md"
                         "?workflowType=machine_learning")
    assert lines[-2].startswith("points (one child run per value): http://127.0.0.1:5000/#/"
                                "experiments/1/runs?") and parent.info.run_id in lines[-2]
    assert (folder / "summary.md").read_text().strip() == "\n".join(lines[:-3])


def test_summary_table_has_key_metrics_and_errors() -> None:
    from workbench.sweeps.report import summary_table

    rows = [{"value": 2, "status": "FINISHED", "valid": True, "other_cpu_share": 0.0,
             "run_id": "abcdef0123456789", "output_path": "/r/00_n=2.ipynb", "error": None,
             "metrics": {"p95_ttft_ms": 12.5, "output_throughput": 101.25, "zz": 1.0}},
            {"value": 4, "status": "FAILED", "valid": False, "other_cpu_share": 0.7,
             "run_id": "ffff", "output_path": "/r/01_n=4.ipynb", "error": "ValueError: no",
             "metrics": {}}]
    lines = summary_table(rows, "n").splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[:4]]
    assert cells[0] == ["n", "status", "output_throughput", "p95_ttft_ms", "run", "notebook"]
    assert set("".join(cells[1])) == {"-"}
    assert cells[2] == ["2", "FINISHED", "101.2", "12.5", "abcdef012345", "00_n=2.ipynb"]
    assert cells[3] == ["4", "FAILED INVALID (other processes 70% of the CPUs)", "-", "-",
                        "ffff", "01_n=4.ipynb"]
    assert len({len(line) for line in lines[:4]}) == 1  # aligned
    assert lines[4:] == ["n=4: ValueError: no"]


def _waiting_notebook(path: Path) -> Path:
    """Parameters x, flag; the point waits until the `flag` file exists."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('x = 1\nflag = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import time\nfrom pathlib import Path\n"
        "while flag and not Path(flag).exists():\n    time.sleep(0.1)\nprint('ran', x)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def test_resume_after_sigkill_marks_the_orphaned_run_killed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`workbench sweep` killed with SIGKILL mid-point leaves that point's run RUNNING; the
    resumed sweep marks it KILLED, says so on stderr, and runs the value again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    nb = _waiting_notebook(tmp_path / "wait.ipynb")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    flag = tmp_path / "go"
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", str(nb), "-p", "x", "7",
           "--set", f"flag={flag}", "--tracking-uri", uri, "--experiment", "kill-test",
           "--out-dir", str(tmp_path / "out"), "--no-progress"]
    log = (tmp_path / "sweep.log").open("w")
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=log, stderr=log)
    try:  # papermill writes the output notebook when it starts executing the point
        deadline = time.monotonic() + 180
        while (not list((tmp_path / "out").rglob("*.ipynb")) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "sweep.log").read_text()
        time.sleep(1.0)  # the kernel is in the waiting cell
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its kernel, like `kill -9`
        proc.wait()
        log.close()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("kill-test")
    (orphan,) = [r for r in client.search_runs([exp.experiment_id])
                 if r.data.tags.get("kind") == "sweep-point"]
    assert orphan.info.status == "RUNNING"
    flag.write_text("go")
    rows = sweep(nb, "x", [7], fixed={"flag": str(flag)}, experiment="kill-test", uri=uri,
                 out_dir=tmp_path / "out", resume=True, progress=False)
    assert [r["status"] for r in rows] == ["FINISHED"] and rows[0]["run_id"] != orphan.info.run_id
    after = client.get_run(orphan.info.run_id)
    assert after.info.status == "KILLED"
    assert after.data.tags["error"].startswith("killed: the sweep process ended")
    err = capsys.readouterr().err
    assert (f"workbench sweep: point x=7 (run {orphan.info.run_id}) was left RUNNING by an "
            "interrupted sweep: marked KILLED; it runs again") in err


def test_mark_killed_leaves_a_point_whose_process_is_alive(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from workbench.sweeps.resume import mark_killed
    from workbench.tracking.mlflow_store import Store

    store = Store("mk", f"sqlite:///{tmp_path / 'm.db'}")
    parent = store.create_run("sweep", tags={"kind": "sweep"})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        ids = {name: store.create_run(name, parent_id=parent, tags={
            "sweep_param": "x", "sweep_value": name, "sweep_pid": str(pid), "sweep_host": host})
            for name, pid in (("alive", alive.pid), ("gone", gone.pid))}
        ids["untagged"] = store.create_run("untagged", parent_id=parent,
                                           tags={"sweep_param": "x", "sweep_value": "u"})
        done = store.create_run("done", parent_id=parent, tags={"sweep_value": "d"})
        store.finish(done)
        lines = mark_killed(store, parent)
    finally:
        alive.kill()
        alive.wait()
    status = {k: store.client.get_run(v).info.status for k, v in ids.items()}
    assert status == {"alive": "RUNNING", "gone": "KILLED", "untagged": "KILLED"}
    assert store.client.get_run(done).info.status == "FINISHED"
    assert len(lines) == 3 and sum("left as it is" in line for line in lines) == 1
