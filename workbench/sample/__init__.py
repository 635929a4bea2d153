"""Sampling (vLLM v1's `v1/sample/`): logits + SamplingMetadata -> token ids.

    sampler.py            Sampler: greedy, temperature, top-k, top-p, min_tokens, per-request
                          seeded generators; `verify` for speculative drafts
    metadata.py           SamplingMetadata: the per-row tensors the sampler reads (never a
                          Request); the worker builds it (worker/sampling_metadata_builder.py)
    rejection_sampler.py  greedy_verify and exact rejection sampling of drafts

The proposers that make the drafts are `workbench.spec_decode` (one `Proposer` interface).
"""
