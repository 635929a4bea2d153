"""Offline engine benchmarks: `throughput` (`workbench bench offline`, `python -m
workbench.bench.offline`), `spec` (`workbench bench spec`), `compile_ab` (eager vs compiled),
and `results` (the offline bench's tables and judgement)."""
