"""The simulator (issue 33): the engine's own scheduler and KV cache manager on a virtual
clock, with the forward pass replaced by a step time predicted by a cost model.

Torch-free: nothing here imports torch or loads weights; a model is its config.

    batch.py        BatchComposition (what one engine step computes) and the CostModel
                    protocol every cost model implements
    composition.py  a step's BatchComposition from the scheduler's decision (or from
                    computed-token counts, in calibration)
    instance.py     SimInstance: one engine's Scheduler stepping on a virtual clock
    simulator.py    simulate(): arrivals, the router, the event loop -> RequestRecords
    target.py       a template's `target: {kind: simulated}` -> a harness RunResult
    model_shapes.py ModelShape: a model as its config (named shapes, HF config.json)
    hardware.py     named GPU profiles: datasheet peaks x stated efficiencies (analytic)
    cost_model.py   AnalyticCostModel: GEMMs, attention, TP/PP communication, LM head,
                    sampling, a fixed per-step overhead
    linear_fit.py   the calibrated model's terms and its fit (relative NNLS, held-out errors)
    calibrated.py   CalibratedCostModel: a fitted profile JSON (machine and model shape)
    calibrate.py    `workbench calibrate`: time this machine's engine on designed batches
"""
