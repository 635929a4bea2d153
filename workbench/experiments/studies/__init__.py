"""Studies: a notebook's question measured through the one runner.

A study turns a notebook's parameters into experiment templates (a shipped
experiments/*.yaml scaled down, or one derived from it: another variable, traffic or
target), runs each through `workbench.experiments.runner.run_experiment` (`measure`) and
hands the ExperimentResults back; the frames and plots over them are `workbench.analysis`'s.
So every notebook's numbers pass the same validity checks and land in the same MLflow layout
and results folders as `workbench run`'s.

    measure        parse a raw template, make its MLflow experiment, run it
    targets        template targets run with this interpreter: a router's, a `workbench serve`
    speculation    07: speculation off vs on at k, per concurrency (HTTP: the server's counters)
    quantization   08: weight formats and an FP8 KV cache side by side: speed, memory, quality
    layouts        09, 10: router layouts against one worker; one replica against N
    kv_tiers       11: the host KV tier off vs on, on multi-turn chat
    pd_disaggregation  12: colocated vs prefill/decode rate sweeps per traffic shape, and one
                   instance's prefill and decode capacity
"""
