"""How the engine reaches its workers (vLLM's executor layer).

    tp_runner              create_model_runner: ModelRunner (one process), MultiprocModelRunner
                           (rank 0 fanning each step out) or ExternalLauncherModelRunner
    multiproc_executor     spawn the TP worker processes, send steps, collect errors, shut down
    ray_executor           the same with ranks 1..N-1 as Ray actors in one placement group
    main_module            can spawned workers re-run this program's main module?
"""
