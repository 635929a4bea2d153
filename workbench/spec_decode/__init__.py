"""Speculative decoding: proposers (n-gram, draft model), rejection sampler, counters."""
