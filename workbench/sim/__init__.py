"""The simulator (issue 33): the engine's own scheduler and KV cache manager on a virtual
clock, with the forward pass replaced by a step time predicted by a cost model.

Torch-free: nothing here imports torch or loads weights; a model is its config.

    batch.py        BatchComposition (what one engine step computes) and the CostModel
                    protocol every cost model implements
"""
