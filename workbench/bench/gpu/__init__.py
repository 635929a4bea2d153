"""The device check (`check`; `python -m workbench.bench.gpu_check`, `workbench bench gpu-check`)
and its kernel-vs-twin cases (`kernel_cases`)."""
