"""The runner's stages, in order (`experiments.runner` composes them):

    plan      template, executor, replay  -> Plan       (what is measured, on what; refusals)
    resume    Plan, --resume              -> Parent     (the parent run: resumed or new, kept runs)
    execute   RunContext, Plan, Parent    -> Executed   (every run, retries, adaptive rounds)
    judge     Plan, Executed              -> Judgement  (quality gate, verdicts, the table)
    publish   ... Judgement               -> ExperimentResult (MLflow, results folder, plots)

Each stage is one function over dataclasses, so a stage can be read, tested and replaced on
its own; only `execute` runs the engine (through the `run_point` the runner hands it,
`child_run.run_one` by default).
"""
