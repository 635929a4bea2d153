"""`workbench run TEMPLATE --resume`: finish an experiment an interrupted run left behind.

Place in the flow: the resume stage (`stages.resume`) asks `find_parent` for the newest
parent run of the same template (its `template_sha` tag: the canonical JSON of the template)
and workload (`workload_checksum`) in the template's MLflow experiment. `kept_runs` then reads that
parent's children:

    FINISHED with its objective     kept: its record rebuilt from MLflow (metrics from its
                                    summary.json artifact, validity, node, fingerprint)
    FINISHED without its objective  tagged `superseded`, measured again (an interrupted run
                                    an older version closed FINISHED with no metrics)
    RUNNING, its driver gone        marked KILLED (tag error), measured again
    FAILED / KILLED                 measured again (an interrupted run is KILLED:
                                    `experiments.interrupts`)
    tagged `superseded`             skipped (a disturbed run retried: `--retry-invalid`)
    (value, repeat) with no child   measured

`require_objective` keeps a run without its objective metric out of every verdict: it counts
as failed, whatever path its record came by.

`run_jobs.run_plan` measures only the missing (value, repeat) pairs, on either executor, and
the verdict reads the kept and the new records in the interleaved order, as if one run had
made them all. A parent whose driver process is still alive on this host is refused (two
drivers must not write one experiment). Rate sweeps (`rate_sweep`) are refused: a point is a
(value, repeat, rate) there.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.experiments.run_record import RunRecord
from workbench.experiments.template import Template

PARENT_TAG = "mlflow.parentRunId"
DRIVER_TAGS = ("driver_pid", "driver_host")  # the process that runs the experiment
KILLED_ERROR = ("killed: the experiment's driver ended before this run did (found RUNNING "
                "on --resume)")
SUPERSEDED_TAG = "superseded"  # a child another run replaces: never kept, never judged


def template_sha(template: Template) -> str:
    """The template's identity across runs: sha256 of its canonical JSON."""
    text = json.dumps(template.raw, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def driver_tags() -> dict[str, str]:
    return {"driver_pid": str(os.getpid()), "driver_host": socket.gethostname()}


def find_parent(store: Any, template: Template, checksum: str) -> Any | None:
    """The newest parent run of this template and workload, or None."""
    sha = template_sha(template)
    runs = store.client.search_runs(
        [store.experiment_id],
        filter_string=f"tags.kind = 'experiment' and tags.template_sha = '{sha}'",
        order_by=["attributes.start_time DESC"], max_results=50)
    for run in runs:
        if run.data.tags.get("workload_checksum") == checksum:
            alive = _live_driver(run.data.tags)
            if alive is not None:
                raise UserError(f"experiment run {run.info.run_id} of {template.name!r} is "
                                f"still running in process {alive} on this host; wait for it "
                                "or stop it before --resume")
            return run
    return None


def _live_driver(tags: dict[str, str]) -> int | None:
    pid = tags.get("driver_pid", "")
    if tags.get("driver_host") != socket.gethostname() or not pid.isdigit():
        return None
    if int(pid) == os.getpid():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return int(pid)
    return int(pid)


def kept_runs(store: Any, parent: str, plan: list[tuple[str, Any]], repeats: int,
              objective: str | None = None
              ) -> tuple[dict[tuple[str, int], RunRecord], list[str]]:
    """(label, repeat) -> the record of its FINISHED child that measured `objective` (None:
    any FINISHED child), and one line per child marked KILLED, measured again or kept.
    Children RUNNING are marked KILLED (their driver is gone: `find_parent` refused a live
    one); children tagged SUPERSEDED_TAG are skipped."""
    values = dict(plan)
    runs = store.client.search_runs([store.experiment_id],
                                    filter_string=f"tags.`{PARENT_TAG}` = '{parent}'",
                                    order_by=["attributes.start_time ASC"], max_results=5000)
    kept: dict[tuple[str, int], RunRecord] = {}
    lines: list[str] = []
    for run in runs:
        tags, run_id = run.data.tags, run.info.run_id
        label, repeat = tags.get("value"), tags.get("repeat", "")
        if label not in values or not repeat.isdigit() or int(repeat) >= repeats:
            continue  # not a run of this plan (a note, a rerun)
        key = (label, int(repeat))
        what = f"{run.info.run_name} repeat {int(repeat) + 1}/{repeats} (run {run_id})"
        if SUPERSEDED_TAG in tags:
            continue
        if run.info.status == "RUNNING":
            store.set_tags(run_id, {"error": KILLED_ERROR})
            store.client.set_terminated(run_id, status="KILLED")
            lines.append(f"{what} was left RUNNING: marked KILLED; it runs again")
        elif run.info.status == "FINISHED" and key not in kept:
            record = record_of(store, run, values[label])
            if objective is not None and objective not in record.metrics:
                store.set_tags(run_id, {SUPERSEDED_TAG: f"FINISHED without {objective}: "
                                                        "measured again on --resume"})
                lines.append(f"{what} FINISHED without {objective}: it runs again")
                continue
            kept[key] = record
            lines.append(f"{what} FINISHED: kept")
    return kept, lines


def require_objective(runs: list[RunRecord], objective: str) -> list[RunRecord]:
    """`runs`, each one that succeeded without measuring `objective` now failed (error
    "objective ... not measured"): the verdict counts it, never compares it."""
    for r in runs:
        if r.error is None and objective not in r.metrics:
            r.error = f"objective {objective} not measured"
    return runs


def record_of(store: Any, run: Any, value: Any) -> RunRecord:
    """A FINISHED child as the runner's `RunRecord`: the metrics it computed (its
    summary.json), its validity (metric `valid`, `other_cpu_share` against the tag
    `max_other_cpu_share`), its node and hardware fingerprint."""
    tags, logged = run.data.tags, run.data.metrics
    metrics = _summary_metrics(store, run.info.run_id)
    share = logged.get("other_cpu_share")
    limit = tags.get("max_other_cpu_share")
    disturbed = share is not None and limit is not None and share > float(limit)
    return RunRecord(tags["value"], value, int(tags["repeat"]), run.info.run_id,
                     metrics=metrics, valid=logged.get("valid", 1.0) == 1.0,
                     other_cpu_share=share, disturbed=disturbed, node=tags.get("node"),
                     fingerprint=tags.get("hardware_fingerprint"))


def _summary_metrics(store: Any, run_id: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = store.client.download_artifacts(run_id, "summary.json", tmp)
        except Exception:  # noqa: BLE001 - a run without it: the metrics MLflow has
            metrics = dict(store.client.get_run(run_id).data.metrics)
            return {k: v for k, v in metrics.items() if k not in ("valid", "other_cpu_share")}
        return {k: float(v) for k, v in json.loads(Path(path).read_text())["metrics"].items()}
