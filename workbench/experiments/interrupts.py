"""Interrupting `workbench run`: Ctrl-C (SIGINT) and SIGTERM leave the runs in flight KILLED.

Place in the flow: `runner.run_experiment` runs inside `sigterm_raises()`, so SIGTERM raises
`Terminated` (a KeyboardInterrupt) exactly where Ctrl-C raises KeyboardInterrupt. Then

    child_run.run_one       the child in flight: status KILLED, tag error (`killed_reason`)
    run_experiment          `end_killed`: the parent this process drives (tag driver_pid)
                            and any child of it still RUNNING (a cluster's) -> KILLED, and
                            one `Interrupted` line: what was killed, how to finish it
    cli.guarded             prints that line, exits 128 + the signal (130 SIGINT, 143 SIGTERM)

`workbench run --resume` then measures every KILLED run again (`experiments.resume`): an
interrupted run never stands FINISHED with no metrics, and never enters a verdict.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

KILLED = "KILLED"
PARENT_TAG = "mlflow.parentRunId"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was (as Python raises KeyboardInterrupt on SIGINT)."""

    signum = int(signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """An interrupted experiment: its one line (str) and the signal that ended it."""

    def __init__(self, line: str, signum: int) -> None:
        super().__init__(line)
        self.signum = signum


def signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: its `signum` (SIGTERM), else SIGINT."""
    return int(getattr(exc, "signum", signal.SIGINT))


def signal_name(exc: BaseException) -> str:
    return signal.Signals(signal_of(exc)).name


def killed_reason(exc: BaseException) -> str:
    """The `error` tag of a run ended by an interrupt."""
    return (f"killed: interrupted ({signal_name(exc)}) before the run finished; "
            "`workbench run TEMPLATE --resume` measures it again")


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises `Terminated` (only in the main thread, and only when
    nobody else handles SIGTERM: a notebook kernel's handler is left alone); restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    if old not in (signal.SIG_DFL, None):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def end_killed(store: Any, exc: BaseException) -> tuple[list[str], list[str]]:
    """Mark KILLED the experiment parents this process drives that are still RUNNING (tags
    driver_pid, driver_host: `resume.driver_tags`) and their children still RUNNING (a
    cluster's); ([parent ids], [ids of their children this interrupt killed], `run_one`'s
    own included)."""
    client = store.client
    me = (f"tags.driver_pid = '{os.getpid()}' and tags.driver_host = "
          f"'{socket.gethostname()}' and attributes.status = 'RUNNING'")
    parents = client.search_runs([store.experiment_id], filter_string=me, max_results=100)
    reason = killed_reason(exc)
    children: list[str] = []
    for parent in parents:
        pid = parent.info.run_id
        kids = client.search_runs([store.experiment_id], max_results=5000,
                                  filter_string=f"tags.`{PARENT_TAG}` = '{pid}'")
        for kid in kids:
            if kid.info.status == "RUNNING":
                client.set_tag(kid.info.run_id, "error", reason)
                client.set_terminated(kid.info.run_id, status=KILLED)
            elif kid.info.status != KILLED or kid.data.tags.get("error") != reason:
                continue
            children.append(kid.info.run_id)
        client.set_tag(pid, "error", reason)
        client.set_terminated(pid, status=KILLED)
    return [p.info.run_id for p in parents], children


def interrupted_line(exc: BaseException, parents: list[str], children: list[str]) -> str:
    """The one line an interrupted `workbench run` ends with."""
    name = signal_name(exc)
    if not parents:
        return f"interrupted ({name}) before the experiment's parent run was created"
    what = f"experiment run {', '.join(parents)}" + (
        f" and {len(children)} run(s) in flight" if children else "")
    return (f"interrupted ({name}): {what} marked KILLED in MLflow; rerun the same command "
            "with --resume to measure what is missing")
