"""Benchmarks: the engine against its peers (`transformers`, vLLM) and micro-benchmarks.

    cli                  `workbench bench`: replay a workload against a target (vLLM's bench serve)
    offline, offline_workload, roofline, peers/, peer_metrics
                         offline throughput against transformers and vLLM; peers' metric definitions
    spec, quant          speculative decoding and quantization benchmarks
    sched_micro, kv_cache_bench, collective_bench
                         scheduler step, KV-cache bookkeeping and TP collective micro-benchmarks
    gpu_check, gpu_kernel_cases
                         the one-script GPU check

They are built on `workbench.harness` (the measuring library).
"""
