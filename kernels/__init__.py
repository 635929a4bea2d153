"""Triton kernels, each beside the plain-PyTorch twin that defines what it must compute.

The engine's attention backend switch (`workbench.attention.selector`) selects "torch" (the
reference, default on CPU) or "triton" (default on CUDA), which runs `kernels.triton`'s
reshape_and_cache, paged_decode (split-KV) and paged_prefill kernels; each module holds its
plain-PyTorch twin (`*_ref`), and `workbench/attention/torch_backend.py` is the engine's own
PyTorch path. `kernels.quant` holds the quantized weight formats' plain-PyTorch references.
Nothing here imports `workbench` (tests/test_layers.py checks it).
"""
