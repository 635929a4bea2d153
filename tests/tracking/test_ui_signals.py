"""`workbench ui` never leaves MLflow behind: SIGTERM or SIGINT to its process group stops
the MLflow child's group, and a `workbench ui` killed outright takes the child with it
(PR_SET_PDEATHSIG). MLflow is stood in for by a sleeping child (the stop path is the same);
a busy port is one clean error before anything starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from workbench.tracking import ui

DEADLINE_S = 60.0  # generous: only a bound on waiting, never a measured duration
SCRIPT = """
import sys
import workbench.tracking.ui as ui
ui.ui_command = lambda uri, host, port: [sys.executable, "-c", "import time; time.sleep(600)"]
sys.exit(ui.main(["--port", sys.argv[1], "--tracking-uri", sys.argv[2]]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gone(pid: int) -> bool:
    """Wait until `pid` has exited (a zombie nobody reaped counts as exited)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@contextmanager
def workbench_ui(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`workbench ui` in its own process group (as a terminal runs it) and its child's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(_free_port()), f"sqlite:///{tmp_path / 'm.db'}"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
        cwd=Path(__file__).parents[2])
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("workbench ui: http://127.0.0.1:")
        deadline = time.monotonic() + DEADLINE_S
        kids: list[psutil.Process] = []
        while not kids and time.monotonic() < deadline:
            kids = psutil.Process(proc.pid).children()
            time.sleep(0.05)
        assert len(kids) == 1, kids
        yield proc, kids[0].pid
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for p in psutil.Process().children(recursive=True):
            if p.pid != proc.pid and p.ppid() in (1, proc.pid):
                p.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_group_stops_mlflow_too(tmp_path: Path, sig: signal.Signals) -> None:
    with workbench_ui(tmp_path) as (proc, child):
        os.killpg(proc.pid, sig)
        out, _ = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 0 and out == "workbench ui: stopped\n"
        assert _gone(child)


def test_killing_workbench_ui_takes_mlflow_with_it(tmp_path: Path) -> None:
    with workbench_ui(tmp_path) as (proc, child):
        proc.kill()  # SIGKILL: no handler runs
        proc.wait()
        assert _gone(child)


def test_a_busy_port_is_one_clean_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError) as e:
            ui.main(["--port", str(port), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert str(e.value) == (
        f"port {port} on 127.0.0.1 is already in use (another server is listening there): "
        "stop it, or start workbench ui on another port with --port N")
