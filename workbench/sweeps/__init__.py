"""`workbench sweep`: run one papermill notebook per parameter value, each logged to MLflow.

    driver.py        sweep(): checks, the parent run, the points, retries, the report
    notebook_run.py  one point: papermill in its own child run
    points.py        the points on an executor (local, or Ray tasks on a cluster)
    resume.py        --resume: the latest parent, finished points, killed points
    inputs.py        the notebook's declared parameters, names and values checked
    report.py        the summary table, sweep.png, the parent run's description
    cli.py           `workbench sweep ...`

    sweep("notebooks/03_chunked_prefill_sweep.ipynb", "num_requests", [8, 16])
    workbench sweep notebooks/X.ipynb -p NAME V1 V2 ... [--set k=v ...] [--resume]
                    [--tracking-uri URI] [--experiment NAME] [--results-dir ROOT]
                    [--kernel NAME] [--executor local|ray] [--address HOST:PORT]
                    [--max-other-cpu-share SHARE] [--retry-invalid N]

    before the first point: names and values checked against the notebook's declarations,
    the kernel resolved (`workbench.sweeps.inputs`), the machine's load watched (a warning)

    parent run  (tags: kind=sweep, notebook=<absolute path>, sweep_param, sweep_values, fixed,
                 sweep_step, sweep_metrics, invalid_points); at the end its description,
                 per-point metrics, summary.md and sweep.png (`workbench.sweeps.report`)
      child run per value, named by its label ("budget=64": experiments.labels)
                  (tags: sweep_param, sweep_value=<JSON>, output_path[, error])
        params    = the notebook's parameters: its declared defaults, then {param: value, **fixed},
                    knob names as on every path (tracking.param_keys: budgets ->
                    max_num_batched_tokens, rate -> request_rate)
        artifacts = the executed notebook (also when it failed) [+ error.txt]
        status    = FINISHED, or FAILED with the error; the sweep goes on past a failed point
        validity  = tags run_valid, validity; metrics valid, other_cpu_share (tracking.Store)

Each value runs `papermill.execute_notebook` with cwd = the notebook's folder (as JupyterLab
does) into the sweep's results folder, <results_dir>/<experiment>/<UTC time>/notebooks/
<i>_<param>=<value>.ipynb (default root: results/ at the checkout's root,
`workbench.experiments.results`); the folder also holds runs.csv, runs.json (one row per
point: status, validity, the metrics the notebook logged), summary.md (the table the
command prints) and sweep.png. The kernel talks to papermill over IPC sockets
(`IpcKernelManager`), not TCP: no "running over TCP without encryption" warning per point.
When the
notebook declares `mlflow_parent_run_id`, `mlflow_uri` or `mlflow_experiment` in its
`parameters` cell, they are injected (this point's child run, the store, the experiment) so the
notebook can log into the sweep; see `workbench.analysis.notebook.publish`.

`resume=True` reuses the latest sweep parent for (notebook, param) in the experiment and skips
the values that already have a FINISHED, valid child there (rows with status "SKIPPED" and the
earlier run's id; its executed notebook, found through the run's output_path tag, is copied
into the new folder); failed, disturbed and new values run again as new child runs. A child
still RUNNING whose sweep process is gone (killed with SIGKILL, say) is marked KILLED first
and a line on stderr says so (`resume.mark_killed`); its value runs again.

`executor=ExecutorConfig("ray", ...)` (`--executor ray [--address HOST:PORT]`) runs each
point as a Ray task holding one node of a cluster and logging to a tracking server
(`workbench.sweeps.points`, docs/cluster.md); every point's run is tagged with its node
(node, node_hostname, hardware_fingerprint) either way.

Each point is measured inside a `validity.CpuWatch` (the notebook's kernel is a child process,
so it counts as this run's own): when other processes took more than `max_other_cpu_share` of
the machine's CPUs meanwhile, the point is marked invalid (row `valid`: False, a line on
stderr, MLflow tag run_valid=false); its numbers should not be read.
"""
