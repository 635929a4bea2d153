"""Micro-benchmarks: `sched` (`workbench bench sched`), `kv_cache` (`bench kv-cache`),
`decode_kernel` (the C++ paged-decode kernel vs its torch twin) and `roofline` (the machine's
fp32 GFLOP/s and memory bandwidth the offline benches divide by)."""
