"""Where an experiment's runs and a sweep's points execute (`--executor local|ray`).

    config.py        ExecutorConfig, the template's `cluster` block, the CLI flags, the
                     tracking-URI rule (a cluster needs an MLflow server)
    base.py          the Executor contract, LocalExecutor (one run after another, here)
    factory.py       make_executor(config): the one the config names
    ray_executor.py  RayExecutor: each run a Ray task holding one node (a custom resource)
    node.py          inside a task: which node this is (name, hostname, fingerprint), threads

Ray is an optional dependency (`pip install -e '.[cluster]'`): only ray_executor.py imports
it, and only when `--executor ray` is asked for.
"""
