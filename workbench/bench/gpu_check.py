"""`python -m workbench.bench.gpu_check OUTDIR [--quick]`: the device check (`gpu/check.py`),
runnable at the path the project guide and docs/gpu.md name."""

from workbench.bench.gpu.check import main

if __name__ == "__main__":
    raise SystemExit(main())
