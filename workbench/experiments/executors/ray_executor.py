"""The Ray executor: each job a Ray task holding its share of one node (docs/cluster.md).

    ray start --head --port 6379 --num-gpus 8 --resources '{"workbench_node": 1}'   # head
    ray start --address HEAD:6379 --num-gpus 8 --resources '{"workbench_node": 1}'  # workers
    workbench run X.yaml --executor ray --address HEAD:6379 --tracking-uri http://HEAD:5000

Each job is `ray.remote(fn)` with num_cpus, num_gpus and 1/runs_per_node of the node
resource, `max_retries=0` (this loop retries, so that the lost try is marked first) and
`max_calls=1` (each job in a fresh worker process). At most
as many jobs are in flight as the alive nodes have room for, so jobs start in the order given
(the experiment's interleaved A B C A B C) and a rerun goes first. A job whose task fails for
a system reason (its node or worker died: NodeDiedError, WorkerCrashedError, ...) is reported
through `lost` (its MLflow run is marked KILLED) and submitted again; an exception raised by
the job function itself is a bug and is raised here. On the way out (Ctrl-C, an error) the
tasks still in flight are cancelled and reported as lost.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from workbench.errors import UserError
from workbench.experiments.executors.base import (
    Done,
    Executor,
    GiveUpFn,
    LostFn,
    P,
    R,
    new_attempt,
)
from workbench.experiments.executors.config import CLUSTER_EXTRA, ExecutorConfig

POLL_S = 2.0  # how often the loop looks at the cluster while it waits
NO_NODE_TIMEOUT_S = 120.0  # jobs waiting and no node offers the resource: give up
PROBE_TIMEOUT_S = 300.0  # each node's preflight before the first run


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise UserError(f"--executor ray needs Ray, which is not installed: {CLUSTER_EXTRA}"
                        ) from e
    return ray


class RayExecutor(Executor):
    kind = "ray"

    def __init__(self, config: ExecutorConfig) -> None:
        super().__init__(config)
        self.ray = ray = import_ray()
        self._owns = not ray.is_initialized()
        if self._owns:
            self._connect()
        if self.capacity() == 0:
            res = config.node_resource
            self.close()
            raise UserError(
                f"no node of the Ray cluster at {config.address or 'auto'} offers the resource "
                f"{res!r}: start every node that may run measurements with "
                f"`ray start ... --resources '{{\"{res}\": 1}}'` (docs/cluster.md)")

    def _connect(self) -> None:
        cfg, ray = self.config, self.ray
        kw: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False,
                              "configure_logging": True}
        try:
            if cfg.address == "local":  # a one-node Ray on this machine, one run at a time
                ray.init(resources={cfg.node_resource: 1.0}, include_dashboard=False, **kw)
            else:
                ray.init(address=cfg.address or "auto", **kw)
        except ConnectionError as e:
            raise UserError(
                f"address ({cfg.address or 'auto'}): no Ray cluster reached ({e}); start one "
                "with `ray start --head` (docs/cluster.md), give its HOST:PORT with --address, "
                "or use --address local for a one-node Ray on this machine") from None

    # ---------------------------------------------------------------- the cluster
    def nodes(self) -> list[dict[str, Any]]:
        """The alive nodes that offer the node resource (`ray.nodes()` entries)."""
        res = self.config.node_resource
        return [n for n in self.ray.nodes()
                if n.get("Alive") and (n.get("Resources") or {}).get(res, 0) > 0]

    def capacity(self) -> int:
        """How many runs the alive nodes can hold at once."""
        total = self.ray.cluster_resources().get(self.config.node_resource, 0.0)
        return int(total * self.config.runs_per_node + 1e-9)

    def node_preflights(self) -> list[dict[str, Any]]:
        """`node.probe_node()` on every alive node that offers the resource (a 0-CPU task
        pinned to each), before any run: names and fingerprints. A node that dies meanwhile
        (Ray still listed it) is left out; `UserError` when none answers."""
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from workbench.experiments.executors.node import probe_node

        probe = self.ray.remote(probe_node)
        refs = [probe.options(num_cpus=0, name="workbench preflight",
                              scheduling_strategy=NodeAffinitySchedulingStrategy(
                                  n["NodeID"], soft=False)).remote() for n in self.nodes()]
        out: list[dict[str, Any]] = []
        for ref in refs:
            try:
                out.append(self.ray.get(ref, timeout=PROBE_TIMEOUT_S))
            except RayTaskError as e:  # the probe itself raised: a bug
                raise e.as_instanceof_cause() from None
            except (RayError, GetTimeoutError):  # the node went away meanwhile
                continue
        if not out:
            raise UserError(f"no node offering {self.config.node_resource!r} answered its "
                            f"preflight within {PROBE_TIMEOUT_S:.0f} s (`ray status` lists "
                            "the nodes)")
        return out

    # ---------------------------------------------------------------- the jobs
    def run(self, fn: Callable[[P, str], R], payloads: Sequence[P], *,
            what: Callable[[int], str] = str, lost: LostFn | None = None,
            give_up: GiveUpFn | None = None,
            started: Callable[[int], None] | None = None) -> Iterator[Done[R]]:
        ray, cfg = self.ray, self.config
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        # max_calls 1: every job in a fresh worker process (nothing of an earlier run's
        # imports, threads or notebook kernels left in it: runs isolated from each other)
        remote = ray.remote(max_calls=1)(fn)
        opts = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "max_retries": 0,
                "resources": {cfg.node_resource: cfg.node_share}}
        queue = deque(range(len(payloads)))
        tries: Counter[int] = Counter()
        inflight: dict[Any, tuple[int, str, float]] = {}
        idle_since: float | None = None
        try:
            while queue or inflight:
                room = self.capacity() if queue else 0
                while queue and len(inflight) < max(1, room):
                    i = queue.popleft()
                    attempt = new_attempt()
                    tries[i] += 1
                    ref = remote.options(name=f"workbench {what(i)}", **opts).remote(
                        payloads[i], attempt)
                    inflight[ref] = (i, attempt, time.perf_counter())
                    if started is not None:
                        started(i)
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=POLL_S)
                if not ready:
                    idle_since = self._check_nodes(idle_since)
                    continue
                idle_since = None
                i, attempt, t0 = inflight.pop(ready[0])
                try:
                    value = ray.get(ready[0])
                except RayTaskError as e:  # the job function raised: a bug, not a lost node
                    raise e.as_instanceof_cause() from None
                except TaskCancelledError:
                    raise
                except RayError as e:  # its node or worker died: mark the try, run it again
                    reason = lost_reason(e)
                    if lost is not None:
                        lost(i, attempt, reason)
                    if tries[i] < cfg.max_attempts:
                        queue.appendleft(i)
                        continue
                    if give_up is None:
                        raise RuntimeError(f"{what(i)} was lost {tries[i]} times: {reason}"
                                           ) from None
                    value = give_up(i, f"lost {tries[i]} times, last: {reason}")
                yield Done(i, value, time.perf_counter() - t0)
        finally:
            for ref, (i, attempt, _) in inflight.items():
                ray.cancel(ref, force=True)
                if lost is not None:
                    lost(i, attempt, "the driver stopped before the run ended (cancelled)")

    def _check_nodes(self, idle_since: float | None) -> float | None:
        """Jobs are waiting: give up when no node has offered the resource for a while."""
        if self.nodes():
            return None
        now = time.perf_counter()
        if idle_since is not None and now - idle_since > NO_NODE_TIMEOUT_S:
            raise UserError(f"no alive node of the Ray cluster has offered the resource "
                            f"{self.config.node_resource!r} for {NO_NODE_TIMEOUT_S:.0f} s, so "
                            "the remaining runs cannot start; start a node with it "
                            "(docs/cluster.md) and resume")
        return now if idle_since is None else idle_since

    def close(self) -> None:
        if self._owns and self.ray.is_initialized():
            self.ray.shutdown()


def lost_reason(e: BaseException) -> str:
    """One line: why a task ended without a result (its node died, its worker crashed)."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:500]
