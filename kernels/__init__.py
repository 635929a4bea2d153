"""Triton kernels, each beside the plain-PyTorch twin that defines what it must compute.

The engine's attention backend switch (`workbench.attention.backends`) selects "torch" (the
reference, default on CPU) or, once the kernels land here, "triton" (default on CUDA).
The PyTorch twin of paged attention lives in `workbench/attention/torch_backend.py`.
"""
