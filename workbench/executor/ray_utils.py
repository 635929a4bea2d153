"""Ray, the optional dependency of the serving paths that span nodes: one import, one connect.

    import_ray("--executor ray")         the `ray` module, or a UserError naming what needs it
    init_ray(address, "--executor ray")  connect (or start a local Ray); True when this call did

Place in the flow: the executor layer (vLLM's `executor/ray_utils.py`). `workbench router
--executor ray` (router/ray_pool.py) and `distributed_executor_backend="ray"`
(executor/ray_executor.py) import Ray through here, lazily, so the default (local) paths never
import it and a machine without it gets one line: what asked for Ray and how to install it.
`ray_installed` and CLUSTER_EXTRA live in `workbench.config.parallel` (the config refuses the
"ray" backend without Ray).

`address`: "HOST:PORT" of a running cluster (`ray start --head`), "auto" (RAY_ADDRESS, else
the cluster `ray start` last started on this machine), "local" (a new one-node Ray in this
process), or None: Ray's default (as "auto", else a new local one, as vLLM does).
"""

from __future__ import annotations

import logging
from typing import Any

from workbench.config.parallel import CLUSTER_EXTRA
from workbench.errors import UserError


def import_ray(who: str) -> Any:
    """The `ray` module; UserError "`who` needs Ray, which is not installed: ..." without it."""
    try:
        import ray
    except ImportError as e:
        raise UserError(f"{who} needs Ray, which is not installed: {CLUSTER_EXTRA}") from e
    return ray


def init_ray(address: str | None, who: str) -> bool:
    """Connect this process to Ray at `address` unless it already is (a Ray worker, or a
    caller that ran `ray.init` itself); True when this call connected (the caller then owns the
    connection and calls `ray.shutdown()`). A cluster that cannot be reached is a UserError."""
    ray = import_ray(who)
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False,
                          "configure_logging": True}
    try:
        if address == "local":
            ray.init(include_dashboard=False, **kw)
        else:
            ray.init(address=address, **kw)
    except ConnectionError as e:
        raise UserError(
            f"address ({address}): no Ray cluster reached ({e}); start one with "
            "`ray start --head` (docs/cluster_serving.md) and give its HOST:PORT, or "
            "'local' for a one-node Ray in this process") from None
    return True
