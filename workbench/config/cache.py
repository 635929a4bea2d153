"""CacheConfig: the paged KV cache (block size, prefix caching, KV dtype) and the memory
budget its pool is sized from (vLLM's `CacheConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.config.kv_compression import KVCompressionConfig
from workbench.config.utils import knob

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "int8", "int4", "int2")
# "fp8" is e4m3, as in vLLM; "auto" = model dtype; int8 / int4 / int2 = KIVI (see below)
KIVI_KV_DTYPES = ("int8", "int4", "int2")
DEFAULT_KV_QUANT_RESIDUAL_TOKENS = 32


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

    `kv_compression_config` (a dict or a `KVCompressionConfig`, parsed here): a KV eviction
    policy and its budget (docs/kv_compression.md); what it cannot run with is refused by
    `EngineConfig`.
    """

    block_size: int = knob(16, "tokens per KV block")
    enable_prefix_caching: bool = knob(True, "reuse the KV of full blocks with the same "
                                             "prefix (hash chain)")
    num_gpu_blocks_override: int | None = knob(None, "force the KV pool size in blocks")
    kv_cache_memory_bytes: int | None = knob(None, "size the KV pool from a KV byte budget")
    kv_cache_dtype: str = knob("auto", "auto (the model dtype) | fp8 | fp8_e4m3 | int8 | int4 "
                                       "| int2 (KIVI)")
    kv_quant_residual_tokens: int | None = knob(
        None, f"int8/int4/int2 KV: the most recent tokens kept full precision (KIVI's R; "
              f"default {DEFAULT_KV_QUANT_RESIDUAL_TOKENS})")
    kv_quant_group_size: int | None = knob(
        None, "int8/int4/int2 KV: value channels per scale and zero point (default head_dim)")
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
    kv_compression_config: KVCompressionConfig | None = knob(
        None, 'KV eviction, JSON: {"method": "streaming_llm" | "h2o" | "snapkv" | "pyramidkv", '
              '"budget_tokens": N | "budget_ratio": r, ...} (docs/kv_compression.md)',
        accepts=KVCompressionConfig | dict[str, Any] | None)

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
        self._check_kivi_knobs()
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
        kc = KVCompressionConfig.from_value(self.kv_compression_config)
        self.kv_compression_config = kc
        if kc is not None:
            self._check_kv_compression(kc)

    def _check_kv_compression(self, kc: KVCompressionConfig) -> None:
        """Budgets, sinks and windows round up to whole blocks: the budget must leave the
        recent window at least one block beyond the sink blocks."""
        bs = self.block_size
        if kc.method == "streaming_llm" and kc.budget_tokens is not None:
            sink_blocks = -(-kc.sink_tokens // bs)
            budget_blocks = -(-kc.budget_tokens // bs)
            if budget_blocks <= sink_blocks:
                raise ValueError(
                    f"kv_compression_config.budget_tokens ({kc.budget_tokens}) leaves no "
                    f"recent window: it rounds up to {budget_blocks} block(s) of block_size "
                    f"{bs}, and sink_tokens ({kc.sink_tokens}) take {sink_blocks}; pass "
                    f"budget_tokens > {sink_blocks * bs} or fewer sink_tokens")

    def _check_kivi_knobs(self) -> None:
        for name in ("kv_quant_residual_tokens", "kv_quant_group_size"):
            value = getattr(self, name)
            if value is None:
                continue
            least = 0 if name == "kv_quant_residual_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} ({value!r}) must be an integer >= {least}")
            if not self.is_kivi_kv:
                raise ValueError(
                    f"{name} ({value}) only applies to a low-bit KV cache; kv_cache_dtype is "
                    f"{self.kv_cache_dtype!r} (pass one of {', '.join(KIVI_KV_DTYPES)})"
                )

    @property
    def is_fp8_kv(self) -> bool:
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")

    @property
    def is_kivi_kv(self) -> bool:
        """int8 / int4 / int2: KIVI's quantized KV (workbench.attention.kivi_cache)."""
        return self.kv_cache_dtype in KIVI_KV_DTYPES

    @property
    def kivi_residual_tokens(self) -> int:
        """KIVI's R: kv_quant_residual_tokens, else the default."""
        r = self.kv_quant_residual_tokens
        return DEFAULT_KV_QUANT_RESIDUAL_TOKENS if r is None else r
