"""RayExecutor: rank 0's handle on TP workers that are Ray actors (vLLM's "ray" backend).

    engine process (rank 0, any node of the cluster)      ranks 1..N-1: Ray actors
    RayExecutor(config)
      ray.init (unless already connected)
      placement group: N-1 bundles {CPU: threads, GPU: 1 on cuda}, strategy PACK
      listen on (node IP, free port); authkey = random
      actor r in bundle r-1: RayTPWorker.run(...)  ---->  Client((ip, port), authkey)
      accept N-1 connections, ordered by rank      <----  ("rank", r), then "hello"
      init_distributed_environment(rank 0)         <===>  tcp://<rank 0's node IP>:PORT
      then exactly as MultiprocExecutor: steps and calls over the connections

Everything after start-up is MultiprocExecutor's: the per-step message, replies, errors, the
shutdown. A worker actor stands where a process stood (`RayWorkerHandle`: alive while its
`run` call has not returned, killed by `ray.kill`). PACK puts the bundles on as few nodes as
they fit on (one node when it can hold them all, else spread over several: tensor
parallelism across nodes). gloo on CPU, NCCL on CUDA; across nodes they need the interface
to use when the host has several (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; docs/cluster_serving.md).

Rank 0's device is `cuda:0` of its own process: run it where Ray does not also give that GPU
to an actor (in a Ray actor holding one GPU, as `workbench router --executor ray` replicas do,
or on a node whose GPU Ray does not manage). The model folder must exist at the same path on
every node the ranks run on. The address comes from RAY_ADDRESS when this process is not yet
connected (else Ray's default: the cluster `ray start` last started here, or a new local one).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from workbench.config import EngineConfig
from workbench.executor.multiproc_executor import STARTUP_TIMEOUT_S, MultiprocExecutor
from workbench.executor.ray_utils import import_ray, init_ray

logger = logging.getLogger(__name__)
WHO = "distributed_executor_backend='ray'"
PLACEMENT_TIMEOUT_S = 120.0  # the cluster must find room for every bundle by then
ACCEPT_POLL_S = 0.1


class RayWorkerHandle:
    """A worker actor seen as a `multiprocessing` process: is_alive, exitcode, join, kill."""

    def __init__(self, ray: Any, actor: Any, ref: Any, rank: int) -> None:
        self.ray, self.actor, self.ref, self.rank = ray, actor, ref, rank

    def is_alive(self) -> bool:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        return not ready

    @property
    def exitcode(self) -> int | None:
        """None while running; `run`'s result, or 1 when the actor died (killed, node lost)."""
        if self.is_alive():
            return None
        try:
            return int(self.ray.get(self.ref))
        except self.ray.exceptions.RayError:
            return 1

    def join(self, timeout: float | None = None) -> None:
        self.ray.wait([self.ref], timeout=timeout)

    def terminate(self) -> None:
        self.ray.kill(self.actor, no_restart=True)

    kill = terminate


def node_ip() -> str:
    """This process's node address as Ray sees it (what the other nodes reach it by)."""
    import ray.util

    return str(ray.util.get_node_ip_address())


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RayExecutor(MultiprocExecutor):
    backend = "ray"

    def _check(self, config: EngineConfig) -> None:
        import_ray(WHO)  # one clear line without Ray (the config refuses it first)

    def _start_workers(self, config: EngineConfig) -> str:
        ray = import_ray(WHO)
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from workbench.worker.ray_worker import RayTPWorker

        self._owns_ray = init_ray(os.environ.get("RAY_ADDRESS"), WHO)
        self._ray = ray
        n, threads = self.world_size, self.num_threads
        bundle: dict[str, float] = {"CPU": float(threads)}
        if config.device == "cuda":
            bundle["GPU"] = 1.0
        self.placement_group = pg = placement_group([dict(bundle) for _ in range(n - 1)],
                                                    strategy="PACK")
        self._release = lambda: remove_placement_group(pg)
        ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RuntimeError(
                f"tensor_parallel_size ({n}) with {WHO}: the Ray cluster found no room for "
                f"{n - 1} bundle(s) of {bundle} in {PLACEMENT_TIMEOUT_S:.0f} s (ranks 1..{n - 1}"
                f"; rank 0 is this process); it has {ray.cluster_resources()} in all, "
                f"{ray.available_resources()} free")
        ip = node_ip()
        authkey = secrets.token_bytes(32)
        server = socket.create_server((ip, 0))
        server.settimeout(ACCEPT_POLL_S)
        init_method = f"tcp://{ip}:{free_port(ip)}"
        remote = ray.remote(RayTPWorker)
        handles: list[RayWorkerHandle] = []
        try:
            for rank in range(1, n):
                actor = remote.options(
                    num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=rank - 1)).remote()
                ref = actor.run.remote(config, rank, n, init_method, server.getsockname()[:2],
                                       authkey, threads)
                handles.append(RayWorkerHandle(ray, actor, ref, rank))
                self.procs.append(handles[-1])  # killed by shutdown() from here on
            self.conns.extend(_accept(server, authkey, handles, STARTUP_TIMEOUT_S))
        finally:
            server.close()
        return init_method

    def _startup_advice(self) -> str:
        return ("(its traceback is in the Ray worker log of its node: "
                "<ray temp dir>/session_latest/logs/worker-*.err). The model folder must exist "
                "at the same path on every node the ranks run on.")

    def shutdown(self, graceful: bool = True) -> None:
        """MultiprocExecutor's shutdown, then the placement group and (when this executor
        connected it) the Ray connection go."""
        closed = self._closed
        super().shutdown(graceful)
        if closed:
            return
        for handle in self.procs:  # the ones that returned by themselves too
            try:
                handle.terminate()
            except Exception as e:  # noqa: BLE001 - gone already
                logger.debug("killing TP worker rank %d: %s", handle.rank, e)
        release = getattr(self, "_release", None)
        if release is not None:
            try:
                release()
            except Exception as e:  # noqa: BLE001 - the cluster may be gone already
                logger.warning("removing the TP placement group failed: %s", e)
        if getattr(self, "_owns_ray", False):
            self._ray.shutdown()


def _accept(server: socket.socket, authkey: bytes, handles: list[RayWorkerHandle],
            timeout_s: float) -> list[Connection]:
    """One authenticated connection per worker (`multiprocessing.connection`'s challenge both
    ways, as its Listener does), in rank order: each announces its rank first. A
    RuntimeError when a worker ends before it connected or `timeout_s` passes."""
    got: dict[int, Connection] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < len(handles):
            try:
                sock, _ = server.accept()
            except TimeoutError:
                ended = [h for h in handles if h.rank not in got and not h.is_alive()]
                if ended:
                    raise RuntimeError(
                        f"tensor-parallel worker rank {ended[0].rank} ended before it "
                        f"connected (exit code {ended[0].exitcode})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the tensor-parallel workers did not all connect in {timeout_s:.0f} s "
                        f"(ranks {sorted(got)} did)") from None
                continue
            sock.setblocking(True)
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                kind, rank = conn.recv()
            except (AuthenticationError, OSError, EOFError, ValueError) as e:
                conn.close()
                logger.warning("a connection to the TP rendezvous was refused: %s", e)
                continue
            if kind != "rank" or rank not in range(1, len(handles) + 1) or rank in got:
                conn.close()
                raise RuntimeError(f"a worker announced {(kind, rank)!r}, not a free rank")
            got[rank] = conn
    except BaseException:
        for conn in got.values():
            conn.close()
        raise
    return [got[rank] for rank in range(1, len(handles) + 1)]
