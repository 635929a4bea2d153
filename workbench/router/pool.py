"""The replica pool: N independent `workbench serve` processes on 127.0.0.1, and their state.

    ReplicaPool(serve_args=["--model", DIR, ...], num_replicas=2)
      replica i = [python -m workbench.cli serve *serve_args --host 127.0.0.1 --port P_i]
                  in its own session / process group (`ServerProcess`), OMP_NUM_THREADS=1

Place in the flow: the router's lifespan starts the pool (all replicas launched at once,
then each waited for until its /health answers), routes with `replica.outstanding` and
`replica.alive`, and stops every process group on shutdown. A replica is marked dead once
(`mark_dead`), when a request's connection to it fails or its stream breaks, or when the
health check finds its process gone (`failure`); this pool never restarts it, so it is not
routed to again (`recovered()` is always empty). The pool can also wrap servers it did not
start (`urls=`), which it never stops. `ray_pool.RayReplicaPool` has the same interface with
replicas that are Ray actors: Ray restarts a lost one and `recovered()` hands it back.

Roles: every replica is "both" (prefill and decode, colocated) unless `roles` gives each one
"prefill" or "decode" (the disaggregated router, `disagg.py`); `replica_args` adds flags to
one replica's `workbench serve` (its `--kv-transfer-config` role).

Counters kept per replica (exported by `metrics.py`): attempts sent (`requests_total`,
retries included), attempts that failed and went to another replica (`retries_total`),
times marked dead (`failures_total`: 0 or 1 here), times brought back after a restart
(`restarts_total`: always 0 here) and the outstanding count.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from workbench.harness.server_process import ServerProcess

logger = logging.getLogger(__name__)
REPLICA_HOST = "127.0.0.1"
ROLES = ("both", "prefill", "decode")
STOP_TIMEOUT_S = 10.0  # SIGTERM to SIGKILL when a replica is stopped


@dataclass
class Replica:
    index: int
    base_url: str  # http://127.0.0.1:PORT (no /v1)
    process: ServerProcess | None = None  # None: a server the pool did not start
    role: str = "both"  # both (colocated) | prefill | decode
    alive: bool = True
    outstanding: int = 0
    requests_total: int = 0
    retries_total: int = 0
    failures_total: int = 0
    restarts_total: int = 0  # times it came back after a restart (a Ray pool's replicas)
    failure: str | None = None  # why it was marked dead
    node: str | None = None  # the node it runs on, when the pool places it (a Ray node id)
    remote_pid: int | None = None  # its process id there (no `process` handle here)
    last_metrics: str = field(default="", repr=False)  # last /metrics text scraped

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else self.remote_pid

    def describe(self) -> dict[str, object]:
        return {"replica": self.index, "role": self.role, "url": self.base_url, "pid": self.pid,
                "node": self.node, "alive": self.alive, "outstanding": self.outstanding,
                "requests_total": self.requests_total, "retries_total": self.retries_total,
                "restarts_total": self.restarts_total, "failure": self.failure,
                "log_path": str(self.process.log_path) if self.process is not None else None}


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((REPLICA_HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def replica_process(serve_args: list[str], host: str, port: int, threads: int,
                    ready_timeout_s: float, log_path: Path | None = None,
                    env: dict[str, str] | None = None) -> ServerProcess:
    """One replica: `python -m workbench.cli serve *serve_args --host HOST --port PORT` in its
    own process group, OMP_NUM_THREADS / MKL_NUM_THREADS = `threads` (inherited by its TP
    ranks) and `env` on top of this process's environment, not started yet. The local pool
    runs it here, a Ray replica on its node."""
    cmd = [sys.executable, "-m", "workbench.cli", "serve", *serve_args, "--host", host,
           "--port", str(port)]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(env or {})}
    return ServerProcess(cmd, f"http://{host}:{port}", ready_timeout_s=ready_timeout_s, env=env,
                         log_path=log_path, stop_timeout_s=STOP_TIMEOUT_S)


class ReplicaPool:
    """N replicas started from `serve_args`, or the servers at `urls`."""

    def __init__(
        self, serve_args: list[str] | None = None, num_replicas: int = 2,
        threads: int = 1, ready_timeout_s: float = 300.0, log_dir: str | Path | None = None,
        ports: list[int] | None = None, urls: list[str] | None = None,
        roles: list[str] | None = None, replica_args: list[list[str]] | None = None,
    ) -> None:
        count = len(urls) if urls is not None else num_replicas
        roles = roles or ["both"] * count
        if len(roles) != count or any(r not in ROLES for r in roles):
            raise ValueError(f"roles ({roles}) must give one of {', '.join(ROLES)} per replica "
                             f"({count})")
        if urls is not None:
            if not urls:
                raise ValueError("urls is empty; give at least one replica URL")
            self.replicas = [Replica(i, u.rstrip("/").removesuffix("/v1"), role=role)
                             for i, (u, role) in enumerate(zip(urls, roles, strict=True))]
            return
        if serve_args is None:
            raise ValueError("give serve_args (the replicas' `workbench serve` flags) or urls")
        if num_replicas < 1:
            raise ValueError(f"num_replicas ({num_replicas}) must be >= 1")
        if ports is not None and len(ports) != num_replicas:
            raise ValueError(f"ports ({ports}) must list one port per replica ({num_replicas})")
        if replica_args is not None and len(replica_args) != num_replicas:
            raise ValueError(f"replica_args must list one list of flags per replica "
                             f"({num_replicas}), not {len(replica_args)}")
        extra = replica_args or [[] for _ in range(num_replicas)]
        ports = ports or free_ports(num_replicas)
        self.replicas = []
        for i, port in enumerate(ports):
            log = Path(log_dir) / f"replica-{i}.log" if log_dir is not None else None
            proc = replica_process([*serve_args, *extra[i]], REPLICA_HOST, port, threads,
                                   ready_timeout_s, log)
            self.replicas.append(Replica(i, proc.base_url, proc, role=roles[i]))

    def __len__(self) -> int:
        return len(self.replicas)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Launch every replica at once and wait for all; on any failure stop them all and
        raise RuntimeError naming the replica (with its log tail)."""
        procs = [(r, r.process) for r in self.replicas if r.process is not None]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(procs))) as ex:
            futures = {ex.submit(p.start): r for r, p in procs}
            errors = []
            for fut, r in futures.items():
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 - reported together below
                    errors.append(f"replica {r.index}: {e}")
        if errors:
            self.stop()
            raise RuntimeError("; ".join(errors))
        for r, p in procs:
            logger.info("replica %d ready at %s (pid %s, %.1f s)", r.index, r.base_url, r.pid,
                        p.ready_s or 0.0)

    def stop(self) -> None:
        """Stop every replica's process group (idempotent; dead ones too)."""
        procs = [r.process for r in self.replicas if r.process is not None]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(procs))) as ex:
            list(ex.map(lambda p: p.stop(), procs))

    # ---------------------------------------------------------------- state
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def with_role(self, role: str) -> list[Replica]:
        """The replicas that serve `role` ("prefill" or "decode"): its own and the "both"."""
        return [r for r in self.replicas if r.role in (role, "both")]

    def exited(self, replica: Replica) -> int | None:
        """The exit code when the pool's process for `replica` has exited, else None."""
        proc = replica.process.proc if replica.process is not None else None
        return proc.poll() if proc is not None else None

    def watches(self, replica: Replica) -> bool:
        """Whether `failure` can tell that `replica` is gone (the pool started it); the router
        checks the others' /health instead."""
        return replica.process is not None

    def failure(self, replica: Replica) -> str | None:
        """Why `replica` is known to be gone (its process exited), else None."""
        code = self.exited(replica)
        return None if code is None else f"its process exited with code {code}"

    def recovered(self) -> list[Replica]:
        """Dead replicas alive again since the last call: none here (nothing is restarted).
        Called by the router's health loop off its event loop; may block briefly."""
        return []

    def mark_dead(self, replica: Replica, reason: str) -> bool:
        """Exclude `replica` from routing; True the first time (the failure is recorded)."""
        if not replica.alive:
            return False
        replica.alive = False
        replica.failure = reason
        replica.failures_total += 1
        logger.warning(
            "replica %d (%s, pid %s) failed: %s; marked dead, its %d in-flight request(s) "
            "are retried on the %d live replica(s)", replica.index, replica.base_url,
            replica.pid, reason, replica.outstanding, len(self.live()))
        return True
