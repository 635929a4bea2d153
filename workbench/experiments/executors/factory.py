"""Pick the executor a config names (kept apart from base.py: Ray's module imports base)."""

from __future__ import annotations

from workbench.experiments.executors.base import Executor, LocalExecutor
from workbench.experiments.executors.config import ExecutorConfig


def make_executor(config: ExecutorConfig | None = None) -> Executor:
    """The executor `config` names (default: local). Ray: connects to the cluster and checks
    that it offers the node resource (`UserError` naming the fix otherwise)."""
    config = config or ExecutorConfig()
    if config.kind == "local":
        return LocalExecutor(config)
    from workbench.experiments.executors.ray_executor import RayExecutor

    return RayExecutor(config)
