"""A tensor-parallel worker as a Ray actor (ranks 1..N-1 with distributed_executor_backend="ray").

    RayExecutor (rank 0, executor/ray_executor.py)        RayTPWorker.run (rank r, any node)
      Listener((rank 0's node IP, port), authkey)  <----  Client((ip, port), authkey)
                                                   <----  ("rank", r)
      then the "mp" protocol over this connection  <--->  run_worker(...): "hello", "ready",
                                                          steps, calls, "shutdown"

The connection is a `multiprocessing.connection` socket authenticated with a per-engine random
key, so it crosses nodes the way the "mp" backend's pipe cannot. The worker loop is the "mp"
one (`tp_worker.run_worker`); the device is `cuda:0` of what Ray made visible to this actor
(its bundle's GPU), so `local_rank` is 0.

Watchdog: a parent pid means nothing across nodes. A thread peeks at the connection every
PEEK_S (without reading it): end of stream (rank 0's process is gone and its socket closed)
or a socket error (TCP keepalive probes unanswered: rank 0's node is gone) ends this process
within DONE_GRACE_S, unless the loop finished by itself. That also covers a worker blocked in
a collective, which never reads the connection (NCCL does not notice a dead peer). Ray kills
the actor too when its owner (rank 0's process) dies; the watchdog does not depend on it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from multiprocessing.connection import Client, Connection

from workbench.config import EngineConfig
from workbench.worker.tp_worker import run_worker

PEEK_S = 0.5
DONE_GRACE_S = 2.0  # after EOF: time for the loop to finish on its own ("shutdown" read)
KEEPALIVE = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3}  # ~11 s to a dead host


def enable_keepalive(sock: socket.socket) -> None:
    """TCP keepalive with short probes, where the OS has the options (Linux does)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def rank0_gone(sock: socket.socket) -> bool:
    """Whether the peer closed the connection or it failed; pending data is left unread."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # nothing to read: the peer is there
    except OSError:
        return True  # reset, or keepalive timed out


def watch_connection(conn: Connection, done: threading.Event) -> None:
    """Exit this process once rank 0 is gone, unless the loop ends by itself (`done`)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        enable_keepalive(sock)
        while not done.is_set():
            if rank0_gone(sock) and not done.wait(DONE_GRACE_S):
                os._exit(1)  # nobody will shut us down
            time.sleep(PEEK_S)
    finally:
        sock.close()


class RayTPWorker:
    """The actor class (`ray.remote(RayTPWorker)` in the executor): one TP rank."""

    def run(self, config: EngineConfig, rank: int, world_size: int,
            distributed_init_method: str, address: tuple[str, int], authkey: bytes,
            num_threads: int) -> int:
        """Connect to rank 0, then serve it until "shutdown"; the exit code (0: shut down)."""
        conn = Client(address, authkey=authkey)
        conn.send(("rank", rank))
        done = threading.Event()
        threading.Thread(target=watch_connection, args=(conn, done), daemon=True,
                         name=f"TPWorker-{rank}-watchdog").start()
        try:
            return run_worker(config, rank, world_size, distributed_init_method, conn,
                              num_threads, local_rank=0)
        finally:
            done.set()
            conn.close()
