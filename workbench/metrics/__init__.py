"""Metrics (vLLM's `v1/metrics/`): one torch-free package the scheduler, the engine, the
server, the harness and the verdict all read.

    registry        every metric's name, unit, direction and source (one table)
    stats           SchedulerStats (the scheduler's report each step), EngineStats (vLLM's
                    counters and gauges), StepRecord (one step-trace row)
    step_account    a step's time split into phases; overhead_account over step-trace rows
    spec_decode     SpecDecodingStats and the accepted-length read-out of its counters
    loggers         vLLM's periodic engine log line and its preemption warning

It imports nothing from the rest of workbench (tests/test_layers.py: its own layer, above
the kernels only).
"""
