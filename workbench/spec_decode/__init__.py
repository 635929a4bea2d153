"""Speculative decoding's proposers (vLLM's v1/spec_decode): one `Proposer` interface
(proposer.py), the n-gram and the draft-model proposers. Their drafts are verified by
`workbench.sample` (Sampler.verify, the rejection sampler)."""
