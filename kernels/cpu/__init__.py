"""C++ CPU kernels, compiled at first use with torch.utils.cpp_extension.load_inline.

Each loader returns None (with the reason logged once) when the kernel cannot be built, so the
caller falls back to its plain-PyTorch twin. Set WORKBENCH_CPU_KERNELS=0 to never build them.
"""
