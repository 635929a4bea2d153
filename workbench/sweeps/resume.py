"""`--resume`: the latest sweep parent of (notebook, param), its points already measured, and
the points a killed sweep left RUNNING (marked KILLED unless their process is alive).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

PARENT_TAG = "mlflow.parentRunId"


def copy_notebook(output: str | None, run_dir: Path) -> str | None:
    """A resumed point's executed notebook, copied from its earlier folder into this one."""
    import shutil

    if not output or not Path(output).is_file():
        return output
    dst = run_dir / Path(output).name
    if not dst.exists():
        shutil.copyfile(output, dst)
    return str(dst)


def latest_parent(store: Any, nb: Path, param: str) -> str | None:
    runs = store.client.search_runs([store.experiment_id], filter_string="tags.kind = 'sweep'",
                                    order_by=["attributes.start_time DESC"], max_results=1000)
    for r in runs:
        tags = r.data.tags
        if tags.get("notebook") == str(nb) and tags.get("sweep_param") == param:
            return str(r.info.run_id)
    return None


def mark_killed(store: Any, parent: str) -> list[str]:
    """Mark KILLED the children of `parent` still RUNNING although the sweep process that ran
    them is gone (SIGKILL, a crash, a closed laptop): MLflow never heard of their end. A
    point whose process (tags sweep_pid, sweep_host) is alive on this host is left alone.
    Returns one line per run marked (or left)."""
    runs = store.client.search_runs([store.experiment_id],
                                    filter_string=f"tags.`{PARENT_TAG}` = '{parent}'",
                                    max_results=5000)
    lines: list[str] = []
    for r in runs:
        if r.info.status != "RUNNING":
            continue
        tags, run_id = r.data.tags, r.info.run_id
        what = f"{tags.get('sweep_param', '?')}={tags.get('sweep_value', '?')} (run {run_id})"
        pid = tags.get("sweep_pid", "")
        if (tags.get("sweep_host") == socket.gethostname() and pid.isdigit()
                and int(pid) != os.getpid() and _alive(int(pid))):
            lines.append(f"point {what} is still RUNNING in process {pid}; left as it is")
            continue
        store.set_tags(run_id, {"error": "killed: the sweep process ended before this point "
                                         "did (found RUNNING on --resume)"})
        store.client.set_terminated(run_id, status="KILLED")
        lines.append(f"point {what} was left RUNNING by an interrupted sweep: marked KILLED; "
                     "it runs again")
    return lines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def finished_points(store: Any, parent: str) -> dict[str, tuple[str, str | None]]:
    """{value key: (run id, output path)} of the FINISHED children of `parent` that were not
    marked invalid (tag run_valid=false: disturbed points run again)."""
    runs = store.client.search_runs([store.experiment_id],
                                    filter_string=f"tags.`{PARENT_TAG}` = '{parent}'",
                                    max_results=5000)
    return {r.data.tags["sweep_value"]: (r.info.run_id, r.data.tags.get("output_path"))
            for r in runs if r.info.status == "FINISHED" and "sweep_value" in r.data.tags
            and r.data.tags.get("run_valid") != "false"}
