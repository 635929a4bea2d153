"""A two-node Ray cluster and an MLflow tracking server on this machine: the cluster tests
(tests/cluster/) and the local-vs-cluster figure (scripts/cluster_figure.py) start it.

    with LocalCluster.start(tmp) as c:    # ray start --head, ray start --address, mlflow server
        c.address, c.tracking_uri         # "192.0.2.2:PORT", "http://127.0.0.1:PORT"
        c.kill("worker")                  # the worker node and every process under it, now
        c.restart_worker()                # a new "worker" node in its place

Each node is `ray start` with 1 CPU, no GPU and the resource {"workbench_node": 1}, named
"head" and "worker" (`--node-name`, what the runs' `node` tag says), its own temp folder, in
its own process group. Ray 2.60 rewrites a loopback node address to the machine's routable IP
(`services.resolve_ip_for_localhost`; only its single-node mode keeps 127.0.0.1, and that
mode refuses `ray start --address`), so the nodes address each other by this machine's IP;
nothing leaves the machine. The tracking server (sqlite backend, artifacts proxied from a
local folder) listens on 127.0.0.1 only (`tracking=False`: no tracking server). Token
authentication is off for the nodes and this driver (RAY_AUTH_MODE=disabled, restored at
close): Ray 2.60 turns it on when a `ray.init()` starts a new local Ray and writes
~/.ray/auth_token, after which `ray start --head` wants the token and `ray start --address`
does not send it, so the second node could not join. Every step has a timeout; `close`
kills each process group and every process started under it (Ray workers and notebook
kernels are children of a raylet, in groups of their own).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

log = logging.getLogger(__name__)

BIN = Path(sys.executable).parent
AUTH_MODE = "RAY_AUTH_MODE"
RESOURCES = json.dumps({"workbench_node": 1})
START_TIMEOUT_S = 240.0  # every try of every node of one start
START_ATTEMPTS = 3  # per node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_tree(pgid: int) -> list[psutil.Process]:
    """Every process in group `pgid` and every descendant of one (whatever its group)."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found[p.pid] = p
                found.update({c.pid: c for c in p.children(recursive=True)})
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return list(found.values())


def kill_tree(pgid: int) -> None:
    """SIGKILL group `pgid` and everything under it; wait (bounded) until they are gone."""
    procs = group_tree(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=15)


@dataclass
class LocalCluster:
    root: Path  # temp folders, logs, the tracking store
    address: str = ""
    tracking_uri: str = ""
    groups: dict[str, int] = field(default_factory=dict)  # name -> process group id
    tracking: bool = True  # start the MLflow tracking server too
    _auth_mode: str | None = None  # the driver's RAY_AUTH_MODE before start

    @classmethod
    def start(cls, root: Path | None = None, tracking: bool = True) -> LocalCluster:
        c = cls(Path(tempfile.mkdtemp(prefix="wbray", dir="/tmp")) if root is None else root,
                tracking=tracking)
        c._auth_mode = os.environ.get(AUTH_MODE)
        os.environ[AUTH_MODE] = "disabled"
        try:
            c._start()
        except BaseException:
            c.close()
            raise
        return c

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("wb")
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", AUTH_MODE: "disabled"}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=self.root)
        self.groups[name] = proc.pid  # its own session: group id = its pid
        return proc

    def _ray_start(self, name: str, *extra: str) -> list[str]:
        tmp = self.root / name[0]
        tmp.mkdir(exist_ok=True)
        return [str(BIN / "ray"), "start", *extra, "--num-cpus=1", "--num-gpus=0",
                f"--resources={RESOURCES}", f"--node-name={name}", f"--temp-dir={tmp}",
                "--disable-usage-stats"]

    def _start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        if self.tracking:  # first, so that no Ray service takes its port before it binds
            self._start_tracking(deadline)
        port = self._start_head(free_port(), deadline)
        ip = re.search(r"Local node IP: (\S+)", (self.root / "head.log").read_text())
        assert ip, (self.root / "head.log").read_text()
        self.address = f"{ip.group(1)}:{port}"
        self._start_worker(deadline)

    def _start_tracking(self, deadline: float) -> None:
        """The MLflow server, up and answering /health before anything else starts."""
        ui = free_port()
        store = self.root / "mlflow"
        store.mkdir(exist_ok=True)
        mlflow = self._spawn("mlflow", [
            str(BIN / "mlflow"), "server", "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination", str(store / "art"),
            "--host", "127.0.0.1", "--port", str(ui), "--workers", "1"])
        self.tracking_uri = f"http://127.0.0.1:{ui}"
        while True:
            try:
                urllib.request.urlopen(f"{self.tracking_uri}/health", timeout=2).read()
                break
            except (OSError, http.client.HTTPException):
                assert mlflow.poll() is None, (self.root / "mlflow.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server did not come up"
                time.sleep(0.5)

    def _start_head(self, port: int, deadline: float) -> int:
        """`ray start --head` on `port`, on a fresh port at each new try. Returns the port."""
        ports: list[int] = []

        def command() -> list[str]:
            ports.append(free_port() if ports else port)
            return self._ray_start("head", "--head", f"--port={ports[-1]}",
                                   "--include-dashboard=false")
        self._start_node("head", command, deadline)
        return ports[-1]

    def _start_worker(self, deadline: float) -> None:
        self._start_node("worker", lambda: self._ray_start(
            "worker", f"--address={self.address}"), deadline)

    def _start_node(self, name: str, command: Callable[[], list[str]], deadline: float) -> None:
        """`ray start` of one node (`command()` gives each try's command line), tried again
        (up to START_ATTEMPTS) when Ray's own start-up fails, after killing what the failed
        try left: on a loaded 2-core machine its GCS can miss an RPC deadline, or a raylet not
        register within Ray's fixed 30 s ("The current node timed out during startup"; both
        seen in CI while the main suite ran beside)."""
        for attempt in range(1, START_ATTEMPTS + 1):
            proc = self._spawn(name, command())
            try:
                self._wait(proc, name, deadline)
                return
            except AssertionError as e:
                if attempt == START_ATTEMPTS or time.monotonic() >= deadline:
                    raise
                log.warning("`ray start` (%s) failed, trying again: %s", name,
                            str(e).strip().splitlines()[-1:])
                self.kill(name)

    def _wait(self, proc: subprocess.Popen[bytes], name: str, deadline: float) -> None:
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`ray start` ({name}) did not finish in time") from None
        assert rc == 0, (self.root / f"{name}.log").read_text()[-3000:]

    def restart_worker(self) -> None:
        """A new "worker" node in place of a killed one (tests that kill it give it back)."""
        if "worker" in self.groups:
            return
        self._start_worker(time.monotonic() + START_TIMEOUT_S)

    def kill(self, name: str) -> None:
        """Kill one of the processes (a node, the tracking server) and all under it."""
        pgid = self.groups.pop(name, None)
        if pgid is not None:
            kill_tree(pgid)

    def close(self) -> None:
        for name in list(self.groups):
            self.kill(name)
        shutil.rmtree(self.root, ignore_errors=True)
        if self._auth_mode is None:
            os.environ.pop(AUTH_MODE, None)
        else:
            os.environ[AUTH_MODE] = self._auth_mode
