"""The measuring library: fixed, seeded traffic in, vLLM's serving metrics out.

    workloads, lengths   prompts and output lengths (synthetic, ShareGPT-like, prefix-sharing)
    workload_base        BenchRequest, Workload (checksum), the synthetic text
    workload_jsonl       a workload as JSONL and back
    sessions             multi_turn_chat and long_doc_qa (session traffic for tiered KV)
    follow_ups           requests sent think_s after the one they follow has finished
    arrivals             seeded arrival times (Poisson, gamma, constant, bursts)
    targets              what traffic is sent to: our engine in-process or an HTTP server
    http_target, sse     OpenAI-compatible client and its server-sent-events reader
    http_stream          one streamed request read with aiohttp (bytes-level SSE)
    loop_lag             the client read loop's lag (the validity check's slow-read signal)
    server_process       start and stop our server (or a peer) as a child process
    runner               replay a workload against a target; RequestRecord per request
    metrics              TTFT / TPOT / ITL / E2E / throughput / goodput as vLLM computes them
    prom, join           Prometheus scrapes and their join with client records
    validity             CpuWatch: how much CPU other processes took during a run; lateness
                         and read-lag judgements
    cache_metrics        a run's KV-cache read-out from the engine counters' delta
    spec_points          a speculative-decoding point: its counters (engine or /metrics) and
                         derived figures; pd_capacity: one instance's prefill / decode figures
                         from a step trace; layer_timing: one linear layer's forward
    collectives          one TP all-reduce's latency (gloo processes), collectives per step
    offline_workload     the offline benchmark's seeded requests and bench checkpoint
    peer_metrics         ITL / TPOT as vLLM, GuideLLM, AIPerf and LLMPerf define them

Experiments, the router, benchmarks and notebooks import this package; it imports the engine
and nothing above it.
"""
