"""Model building blocks (vLLM names): linear layers with weight loaders, RoPE, norms, attention.

Everything here is written tensor-parallel style with tp_size = 1 for now, so that sharding can
be switched on later without touching the model files.
"""
