"""ParallelConfig: tensor parallelism and how its ranks are started (vLLM's
`tensor_parallel_size` and `distributed_executor_backend`).

`ray_installed()` and CLUSTER_EXTRA live here, beside the one knob that needs Ray: the config
refuses the "ray" backend without it, and `workbench.executor.ray_utils` (the lazy `import
ray`) names the same install line.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.config.utils import knob

if TYPE_CHECKING:
    from workbench.config.model import ModelConfig

DISTRIBUTED_EXECUTOR_BACKENDS = ("mp", "ray", "external_launcher")
CLUSTER_EXTRA = "pip install -e '.[cluster]'"  # Ray 2.60.0 (pyproject.toml)


def ray_installed() -> bool:
    """Whether `import ray` would work (without importing it)."""
    return importlib.util.find_spec("ray") is not None


@dataclass
class ParallelConfig:
    """Tensor parallelism (workbench.distributed): one request's weights and compute split over
    `tensor_parallel_size` processes, one per device (CPU: gloo, CUDA: NCCL).

    distributed_executor_backend: "mp" = the engine process is rank 0 and spawns the other
    ranks as worker processes (it schedules; they run the same batch); "ray" = the same, with
    ranks 1..N-1 Ray actors in one placement group, on any nodes of a Ray cluster (needs the
    `cluster` extra); "external_launcher" = every rank was started by torchrun and runs the
    same deterministic engine (vLLM's names).
    """

    tensor_parallel_size: int = knob(1, "processes (devices) one model is split over")
    distributed_executor_backend: str = knob("mp", "mp (this process spawns the ranks) | "
                                                   "ray (Ray actors, any nodes) | "
                                                   "external_launcher (torchrun started them)")

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size ({tp!r}) must be an integer >= 1")
        if self.distributed_executor_backend not in DISTRIBUTED_EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend ({self.distributed_executor_backend!r}) must be "
                f"one of {', '.join(repr(b) for b in DISTRIBUTED_EXECUTOR_BACKENDS)}"
            )
        if self.distributed_executor_backend == "ray" and not ray_installed():
            raise ValueError(
                "distributed_executor_backend ('ray') needs Ray, which is not installed: "
                f"{CLUSTER_EXTRA} (or use 'mp': the ranks as processes on this machine)"
            )

    def verify_with_model_config(self, mc: ModelConfig) -> None:
        """The model's heads must split evenly: attention heads by tp; KV heads by tp (shard)
        or tp by KV heads (replicate, tp > kv heads); intermediate_size by tp."""
        tp = self.tensor_parallel_size
        if tp == 1:
            return
        heads, kv = mc.num_attention_heads, mc.num_kv_heads
        kv_ok = tp % kv == 0 if tp > kv else kv % tp == 0
        if heads % tp or not kv_ok:
            raise ValueError(
                f"tensor_parallel_size ({tp}) does not fit the model's heads: "
                f"num_attention_heads ({heads}) must be divisible by it, and "
                f"num_key_value_heads ({kv}) must be divisible by it (sharded) or divide it "
                f"(replicated, when tp > num_key_value_heads); pick a tp that does"
            )
        inter = int(mc.hf_config.get("intermediate_size", 0))
        if inter % tp:
            raise ValueError(
                f"tensor_parallel_size ({tp}) must divide the model's intermediate_size "
                f"({inter})"
            )
