"""What the machine is (vLLM's `platforms`): `cpu_info` reads the CPU's model, ISA flags and
cache sizes and builds the fingerprint that measured choices (the linear backends' autotune,
the compiled-forward default) are keyed by. Torch-free at import."""
