"""One device's work for a step (vLLM's worker layer).

    model_runner   ModelRunner: a SchedulerOutput -> batch -> forward -> sample -> drafts
    cuda_graph     captured decode graphs and their replay
    cpu_malloc     the CPU allocator hint for the runner's buffers
    tp_worker      the spawned process that runs a ModelRunner for ranks 1..N-1
    ray_worker     the same loop in a Ray actor, over a TCP connection to rank 0

The engine reaches the worker only through `workbench.executor`.
"""
