"""RayReplicaPool: the router's replicas as Ray actors on the nodes of a Ray cluster.

    RayReplicaPool(serve_args, num_replicas=2, address="HEAD:6379")
      start(): ray.init(address)  (unless this process already is connected)
               one placement group, one bundle per replica, strategy SPREAD:
                 bundle = {CPU: num_cpus, GPU: num_gpus (cuda), **resources}
               replica i = ReplicaServer actor in bundle i (ray_replica.py), max_restarts=-1,
               running `workbench serve` as a process on its node; its URL
               http://<node IP>:<port> once its /health is 200
      stop():  stop each server (bounded), kill the actors (no restart), remove the group

Same interface as `pool.ReplicaPool` (replicas, live, with_role, mark_dead, failure,
recovered, start, stop), so the router, the disaggregated router (`roles`, `replica_args`)
and the metrics are unchanged.

Placement: SPREAD puts the bundles on different nodes while there are nodes with room, and
lets two share a node otherwise. One group for all replicas, not one per replica: separate
groups would each be packed onto the fullest node that fits (Ray's default), so nothing
would spread them. The bundle defaults to `threads x tensor_parallel_size` CPUs (the
replica's engine and its "mp" TP ranks, all in its process tree) and, on CUDA, as many GPUs;
with distributed_executor_backend "ray" the bundle holds rank 0 only (1 x threads CPUs, 1 GPU)
and the engine places its other ranks in a group of its own. `resources` adds custom
resources: {"workbench_node": 1} makes each replica hold a whole node (then a lost replica can
only come back on a node that is free, or a new one).

Failure and recovery: a replica is marked dead when a request to it fails (the router's
retry covers its requests and streams), when its liveness watch ends (`wait_stopped`: the
actor died with its process or node, or its server stopped), or when its /health refuses.
Marking a replica dead whose actor still runs has that actor stop its server and exit
(`ReplicaServer.restart`), so every dead replica comes back through the same path: Ray
restarts the actor (after a node
loss, once the group's bundle is rescheduled on a node with room: ~15-20 s for Ray to declare
the node dead, then the replica's start-up) and `recovered()`, polled by the router's health
loop, hands it back with its new URL and `restarts_total` + 1, its other counters kept.
"""

from __future__ import annotations

import logging
from typing import Any

from workbench.executor.ray_utils import import_ray, init_ray
from workbench.router.pool import ROLES, Replica, ReplicaPool

logger = logging.getLogger(__name__)
WHO = "--executor ray"
STOP_TIMEOUT_S = 10.0
STRATEGIES = ("SPREAD", "PACK")


class RayReplicaPool(ReplicaPool):
    """N replicas of `serve_args` as Ray actors (see the module docstring)."""

    def __init__(
        self, serve_args: list[str], num_replicas: int = 2, threads: int = 1,
        ready_timeout_s: float = 300.0, address: str | None = None,
        num_cpus: float | None = None, num_gpus: float = 0.0,
        resources: dict[str, float] | None = None, roles: list[str] | None = None,
        replica_args: list[list[str]] | None = None, strategy: str = "SPREAD",
    ) -> None:
        # Not ReplicaPool.__init__: no processes here; the state methods are shared.
        if num_replicas < 1:
            raise ValueError(f"num_replicas ({num_replicas}) must be >= 1")
        roles = roles or ["both"] * num_replicas
        if len(roles) != num_replicas or any(r not in ROLES for r in roles):
            raise ValueError(f"roles ({roles}) must give one of {', '.join(ROLES)} per replica "
                             f"({num_replicas})")
        if replica_args is not None and len(replica_args) != num_replicas:
            raise ValueError(f"replica_args must list one list of flags per replica "
                             f"({num_replicas}), not {len(replica_args)}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy ({strategy!r}) must be one of {', '.join(STRATEGIES)}")
        cpus = float(threads if num_cpus is None else num_cpus)
        if not cpus > 0 or num_gpus < 0:
            raise ValueError(f"num_cpus ({cpus}) must be > 0 and num_gpus ({num_gpus}) >= 0")
        self.serve_args, self.threads, self.address = serve_args, threads, address
        self.ready_timeout_s, self.strategy = ready_timeout_s, strategy
        self.bundle: dict[str, float] = {"CPU": cpus, **(resources or {})}
        if num_gpus:
            self.bundle["GPU"] = float(num_gpus)
        self.extra = replica_args or [[] for _ in range(num_replicas)]
        self.replicas = [Replica(i, "", role=role) for i, role in enumerate(roles)]
        self.actors: list[Any] = []
        self.incarnations: dict[int, str] = {}  # replica -> the incarnation it routes to
        self._watches: dict[int, Any] = {}  # replica -> wait_stopped() of that incarnation
        self._pending: dict[int, Any] = {}  # dead replica -> wait_ready() of the next one
        self._restarts: dict[int, Any] = {}  # dead replica -> its restart() (ends in an error)
        self._ray: Any = None
        self._group: Any = None
        self._owns_ray = False
        self._stopped = False

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Place the group, create every actor at once and wait for all to be ready; on any
        failure stop them all and raise RuntimeError naming the replicas."""
        ray = self._ray = import_ray(WHO)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from workbench.router.ray_replica import ReplicaServer

        self._owns_ray = init_ray(self.address, WHO)
        n = len(self.replicas)
        self._group = placement_group([dict(self.bundle) for _ in range(n)],
                                      strategy=self.strategy)
        ready, _ = ray.wait([self._group.ready()], timeout=self.ready_timeout_s)
        if not ready:
            have, free = ray.cluster_resources(), ray.available_resources()
            self.stop()
            raise RuntimeError(
                f"the Ray cluster found no room for {n} replica bundle(s) of {self.bundle} in "
                f"{self.ready_timeout_s:.0f} s; it has {have} in all, {free} free "
                "(lower --replica-num-cpus or --replica-resources, or add nodes)")
        remote = ray.remote(ReplicaServer)
        for i in range(n):
            opts = {"num_cpus": self.bundle["CPU"], "num_gpus": self.bundle.get("GPU", 0.0),
                    "resources": {k: v for k, v in self.bundle.items() if k not in ("CPU", "GPU")},
                    "max_restarts": -1, "max_concurrency": 4,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        self._group, placement_group_bundle_index=i)}
            self.actors.append(remote.options(**opts).remote(
                [*self.serve_args, *self.extra[i]], self.threads, self.ready_timeout_s))
        refs = [a.wait_ready.remote(self.ready_timeout_s) for a in self.actors]
        errors = []
        for r, ref in zip(self.replicas, refs, strict=True):
            try:
                self._adopt(r, ray.get(ref))
            except Exception as e:  # noqa: BLE001 - reported together below
                errors.append(f"replica {r.index}: {_reason(e)}")
        if errors:
            self.stop()
            raise RuntimeError("; ".join(errors))
        for r in self.replicas:
            logger.info("replica %d ready at %s (node %s, pid %s)", r.index, r.base_url, r.node,
                        r.pid)

    def stop(self) -> None:
        """Stop every server (bounded), kill the actors with no restart, remove the group,
        and leave Ray if `start` connected (idempotent)."""
        if self._stopped or self._ray is None:
            self._stopped = True
            return
        self._stopped = True
        ray = self._ray
        from ray.util.placement_group import remove_placement_group

        stops = [a.stop.remote() for a in self.actors]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_TIMEOUT_S)
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as e:  # noqa: BLE001 - gone already
                logger.debug("killing a replica actor: %s", e)
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception as e:  # noqa: BLE001 - the cluster may be gone
                logger.warning("removing the replicas' placement group failed: %s", e)
        if self._owns_ray:
            ray.shutdown()

    # ---------------------------------------------------------------- state
    def _adopt(self, replica: Replica, info: dict[str, Any]) -> None:
        """Route to the incarnation `info` describes from now on."""
        replica.base_url = info["url"]
        replica.node, replica.remote_pid = info["node_id"], info["pid"]
        self.incarnations[replica.index] = info["incarnation"]
        self._watches[replica.index] = self.actors[replica.index].wait_stopped.remote()

    def watches(self, replica: Replica) -> bool:
        return True

    def failure(self, replica: Replica) -> str | None:
        """Why the replica's actor is gone (its liveness watch ended), else None."""
        watch = self._watches.get(replica.index)
        if watch is None or self._stopped:
            return None
        ready, _ = self._ray.wait([watch], timeout=0)
        if not ready:
            return None
        try:
            return str(self._ray.get(watch))
        except Exception as e:  # noqa: BLE001 - the actor died: its process or its node
            return f"its Ray actor died ({_reason(e)})"

    def exited(self, replica: Replica) -> int | None:
        return None if self.failure(replica) is None else 1

    def mark_dead(self, replica: Replica, reason: str) -> bool:
        """As ReplicaPool's; then, if the replica's actor still runs, have it stop its server
        and exit, so that Ray restarts it (never blocks): a dead replica comes back only as a
        new incarnation (`recovered`)."""
        if not super().mark_dead(replica, reason):
            return False
        if not self._stopped and self.failure(replica) is None and replica.index < len(
                self.actors):
            self._restarts[replica.index] = self.actors[replica.index].restart.remote()
        return True

    def recovered(self) -> list[Replica]:
        """Dead replicas whose actor Ray restarted and whose new server is ready: alive
        again at their new URL, `restarts_total` + 1. Never blocks (polls)."""
        if self._stopped or not self.actors:
            return []
        back = []
        for r in self.replicas:
            if r.alive:
                continue
            ref = self._pending.get(r.index)
            if ref is None:  # ask the next incarnation; answered once it is ready
                self._pending[r.index] = \
                    self.actors[r.index].wait_ready.remote(self.ready_timeout_s)
                continue
            ready, _ = self._ray.wait([ref], timeout=0)
            if not ready:
                continue
            del self._pending[r.index]
            try:
                info = self._ray.get(ref)
            except Exception as e:  # noqa: BLE001 - still restarting, or its start-up failed
                logger.debug("replica %d not back yet: %s", r.index, _reason(e))
                continue
            if info["incarnation"] == self.incarnations.get(r.index):
                continue  # the old one answered before its restart
            self._restarts.pop(r.index, None)  # its actor process exited: an error, expected
            self._adopt(r, info)
            r.restarts_total += 1
            r.failure = None
            r.alive = True
            back.append(r)
        return back


def _reason(e: BaseException) -> str:
    """A Ray error's first line (its cause's, for a task that raised)."""
    cause = getattr(e, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else \
        f"{type(e).__name__}: {e}"
    return text.strip().splitlines()[0][:300]
