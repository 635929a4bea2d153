"""Benchmarks: the engine against its peers (`transformers`, vLLM) on fixed, seeded workloads."""
