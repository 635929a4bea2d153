"""How the engine reaches its workers (vLLM's executor layer).

One meaning per word: an *executor* starts the TP worker processes and reaches them; a *model
runner* runs one device's forward (`workbench.worker.model_runner.ModelRunner`). The TP model
runners here are rank 0's ModelRunner plus the fan-out through an executor.

    tp_model_runner        create_model_runner: ModelRunner (one process), MultiprocModelRunner
                           (rank 0 fanning each step out through an executor) or
                           ExternalLauncherModelRunner (torchrun started every rank)
    multiproc_executor     spawn the TP worker processes, send steps, collect errors, shut down
    ray_executor           the same with ranks 1..N-1 as Ray actors in one placement group
    ray_utils              the optional Ray import and connect (also the router's)
    main_module            can spawned workers re-run this program's main module?
"""
