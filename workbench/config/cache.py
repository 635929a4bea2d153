"""CacheConfig: the paged KV cache (block size, prefix caching, KV dtype) and the memory
budget its pool is sized from (vLLM's `CacheConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.utils import knob

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "fp8" is e4m3, as in vLLM; "auto" = model dtype


@dataclass
class CacheConfig:
    """The paged KV cache and the memory budget it is sized from.

    Pool size, first match wins: `num_gpu_blocks_override` (blocks), `kv_cache_memory_bytes`
    (KV bytes), a whole-process budget (`cpu_memory_budget_bytes` on CPU,
    `gpu_memory_utilization` x device memory on CUDA: KV = budget - weights - measured
    activation peak - reserve, see `workbench.worker.kv_cache_sizing`), else a default (enough
    for max_num_seqs requests of max_model_len, at most 4 GiB). The budget knobs cannot be
    combined with the two direct ones.

    `kv_cache_dtype="fp8"` (alias "fp8_e4m3") stores K and V as float8_e4m3fn with one scale
    per layer for K and one for V (k_scale, v_scale; 1.0 by default, as vLLM): writes store
    clamp(x / scale, -448, 448) as e4m3, attention reads fp8 * scale. `calculate_kv_scales=True`
    sets each layer's scales from its first forward instead: scale = amax(|x|) / 448.
    """

    block_size: int = knob(16, "tokens per KV block")
    enable_prefix_caching: bool = knob(True, "reuse the KV of full blocks with the same "
                                             "prefix (hash chain)")
    num_gpu_blocks_override: int | None = knob(None, "force the KV pool size in blocks")
    kv_cache_memory_bytes: int | None = knob(None, "size the KV pool from a KV byte budget")
    kv_cache_dtype: str = knob("auto", "auto (the model dtype) | fp8 | fp8_e4m3")
    calculate_kv_scales: bool = knob(False, "fp8 KV: scales = amax / 448 from the first "
                                            "forward (else 1.0)")
    # Whole-process budgets (weights + KV + activation peak + reserve); KV gets the rest.
    cpu_memory_budget_bytes: int | None = knob(None, "device cpu: the whole process's budget "
                                                     "in bytes; KV gets what the weights, the "
                                                     "activation peak and the reserve leave")
    # vLLM's default is 0.9; None keeps the demand-sized default pool so tests and notebooks
    # sharing a GPU do not each claim 90% of it: pass 0.9 for vLLM's behaviour.
    gpu_memory_utilization: float | None = knob(None, "device cuda: the fraction of device "
                                                      "memory for this engine (vLLM: 0.9)")
    memory_reserve_bytes: int = knob(0, "headroom held back from a budget (fragmentation)")

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(
                f"block_size ({self.block_size}) must be one of 1, 2, 4, 8, 16, 32, 64, 128"
            )
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ValueError(
                f"num_gpu_blocks_override ({self.num_gpu_blocks_override}) must be >= 2 "
                "(block 0 is the reserved null block)"
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(
                f"kv_cache_memory_bytes ({self.kv_cache_memory_bytes}) must be a positive integer"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            hint = " (only e4m3 is implemented)" if self.kv_cache_dtype == "fp8_e5m2" else ""
            raise ValueError(
                f"kv_cache_dtype ({self.kv_cache_dtype!r}) must be one of "
                f"{', '.join(repr(d) for d in KV_CACHE_DTYPES)}{hint}"
            )
        if not isinstance(self.calculate_kv_scales, bool):
            raise ValueError(
                f"calculate_kv_scales ({self.calculate_kv_scales!r}) must be True or False"
            )
        if self.calculate_kv_scales and not self.is_fp8_kv:
            raise ValueError(
                f"calculate_kv_scales (True) only applies to an fp8 KV cache; kv_cache_dtype is "
                f"{self.kv_cache_dtype!r} (pass kv_cache_dtype='fp8' or leave it False)"
            )
        b = self.cpu_memory_budget_bytes
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b <= 0):
            raise ValueError(f"cpu_memory_budget_bytes ({b!r}) must be a positive integer")
        u = self.gpu_memory_utilization
        if u is not None and (
            isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1
        ):
            raise ValueError(f"gpu_memory_utilization ({u!r}) must be a number in (0, 1]")
        r = self.memory_reserve_bytes
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"memory_reserve_bytes ({r!r}) must be an integer >= 0")
        budget = [n for n in ("cpu_memory_budget_bytes", "gpu_memory_utilization")
                  if getattr(self, n) is not None]
        direct = [n for n in ("num_gpu_blocks_override", "kv_cache_memory_bytes")
                  if getattr(self, n) is not None]
        if len(budget) > 1 or (budget and direct):
            both = budget + direct
            raise ValueError(
                f"{both[0]} and {both[1]} both size the KV pool; pass only one of "
                "num_gpu_blocks_override, kv_cache_memory_bytes, cpu_memory_budget_bytes "
                "(device='cpu') or gpu_memory_utilization (device='cuda')"
            )
        if r and not budget:
            raise ValueError(
                f"memory_reserve_bytes ({r}) only applies with a budget "
                "(cpu_memory_budget_bytes or gpu_memory_utilization)"
            )

    @property
    def is_fp8_kv(self) -> bool:
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")
