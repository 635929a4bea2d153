"""The simulator (issue 33): the engine's own scheduler and KV cache manager on a virtual
clock, with the forward pass replaced by a step time predicted by a cost model.

Torch-free: nothing here imports torch or loads weights; a model is its config.

    batch.py        BatchComposition (what one engine step computes) and the CostModel
                    protocol every cost model implements
    composition.py  a step's BatchComposition from the scheduler's decision (or from
                    computed-token counts, in calibration)
    instance.py     SimInstance: one engine's Scheduler stepping on a virtual clock
    simulator.py    simulate(): arrivals, the router, the event loop -> RequestRecords
    router.py       SimRouter: the real routing policies (core/routing.py) over instances
    cluster.py      ClusterSpec: replicas, router policy, the P:D split, the host tier
    deploy.py       a ClusterSpec built into instances with their KV connectors
    connectors.py   the scheduler-side KV connector the simulator drives; Load
    pd.py           prefill/decode: the producer's held blocks, the consumer's KV read
    tiers.py        a host-memory KV tier (the OffloadingConnector's scheduler side)
    transfer.py     KVLink / LinkQueue: KV priced by bytes over a link (calc's presets)
    target.py       a template's `target: {kind: simulated}` -> a harness RunResult
    model_shapes.py ModelShape: a model as its config (named shapes, HF config.json)
    hardware.py     named GPU profiles: datasheet peaks x stated efficiencies (analytic)
    cost_model.py   AnalyticCostModel: GEMMs, attention, TP/PP communication, LM head,
                    sampling, a fixed per-step overhead
    linear_fit.py   the calibrated model's terms and its fit (relative NNLS, held-out errors)
    calibrated.py   CalibratedCostModel: a fitted profile JSON (machine and model shape)
    calibrate.py    `workbench calibrate`: time this machine's engine on designed batches
"""
