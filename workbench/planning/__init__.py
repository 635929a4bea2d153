"""The planning calculator: serving arithmetic for questions asked before a run (the seeds'
worked examples; `workbench calc ...` prints it). Pure Python, no torch, never the engine.

    memory.py     KV capacity in tokens, prefix-cache hits, weight bytes (plain, quantized),
                  the split of a device budget: weights + KV + activations + reserves
    passes.py     forward passes, the decode step's memory-bound floor, replica scaling,
                  speculative decoding (acceptance, expected tokens, forwards, speed-up)
    transfer.py   KV transfer against prefill recompute, link and GPU presets
    pd.py         the prefill:decode split of a disaggregated deployment (`pd_ratio`)
    roofline.py   the schedule-aware roofline of a whole workload (per engine step,
                  max(FLOPs / peak, bytes / bandwidth))
    cli.py        `workbench calc ...`: the parser; commands.py: what each subcommand prints
    checks.py     argument checks (a ValueError naming the argument and its value)

Units are in the names (`_bytes`, `_tokens`, `_s`). The engine's own shape and memory
arithmetic (KV bytes per token and block, blocks for a budget, KV heads per TP rank, the fp8
KV scale) lives beside the KV cache manager, in `workbench.core.kv_cache.utils`; this package
builds on it. The names below are the calculator's API (`from workbench import planning;
planning.pd_ratio(...)`).
"""

from workbench.planning.memory import (
    QUANT_SCALE_BYTES,
    GiB,
    kv_cache_bytes,
    kv_token_capacity,
    last_block_free_slots,
    memory_budget,
    prefix_cache_hit_tokens,
    quantized_weight_bytes,
    theoretical_concurrency,
    weight_bytes,
)
from workbench.planning.passes import (
    decode_step_lower_bound_s,
    forward_passes,
    scaling_efficiency,
    spec_acceptance_prob,
    spec_expected_tokens,
    spec_forward_passes,
    spec_predicted_speedup,
)
from workbench.planning.pd import PDRatio, PDSplit, pd_ratio
from workbench.planning.roofline import (
    DecoderShape,
    ScheduleRoofline,
    StepCost,
    request_flops,
    schedule_roofline,
)
from workbench.planning.transfer import (
    DEFAULT_EFFICIENCY,
    GPU_PEAK_FLOPS,
    LINKS,
    gpu_peak_flops,
    kv_transfer_break_even,
    kv_transfer_time_s,
    link_bandwidth,
    prefill_flops,
)

__all__ = [
    "DEFAULT_EFFICIENCY",
    "GPU_PEAK_FLOPS",
    "LINKS",
    "QUANT_SCALE_BYTES",
    "DecoderShape",
    "GiB",
    "PDRatio",
    "PDSplit",
    "ScheduleRoofline",
    "StepCost",
    "decode_step_lower_bound_s",
    "forward_passes",
    "gpu_peak_flops",
    "kv_cache_bytes",
    "kv_token_capacity",
    "kv_transfer_break_even",
    "kv_transfer_time_s",
    "last_block_free_slots",
    "link_bandwidth",
    "memory_budget",
    "pd_ratio",
    "prefill_flops",
    "prefix_cache_hit_tokens",
    "quantized_weight_bytes",
    "request_flops",
    "scaling_efficiency",
    "schedule_roofline",
    "spec_acceptance_prob",
    "spec_expected_tokens",
    "spec_forward_passes",
    "spec_predicted_speedup",
    "theoretical_concurrency",
    "weight_bytes",
]
