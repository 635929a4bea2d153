"""The KV compression frontier from the command line (`workbench.experiments.kv_frontier`):
memory, capacity at a fixed KV budget, throughput / TPOT and needle accuracy per (method,
budget) and KV dtype, one table (docs/kv_compression.md, Frontier).

    .venv/bin/python scripts/kv_compression_frontier.py [--model needle] \
        [--methods streaming_llm h2o snapkv pyramidkv] [--budgets 64 128 256] \
        [--kv-dtypes fp8 int8 int4 int2] [--kv-cache-memory-bytes 16777216] \
        [--input-len 384] [--output-len 128] [--num-requests 32] [--concurrency 16] \
        [--needle-lengths 128 256 512 1024] [--needle-depths 0 0.25 0.5 0.75 1] \
        [--cases-per-cell 2] [--engine JSON] [--out-dir .bench/kv_frontier/<UTC time>]

Writes frontier.csv, needle.csv, frontier.md and frontier.json into --out-dir and prints the
Markdown. Measure on a quiet machine: a point whose run the CPU watch flagged is marked
"disturbed" in the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.config.kv_compression import KV_COMPRESSION_METHODS
from workbench.experiments.kv_frontier import DEFAULT_ENGINE, KV_DTYPES, FrontierSpec, run_frontier

ROOT = Path(__file__).resolve().parents[1]


def parse(argv: Sequence[str] | None = None) -> tuple[FrontierSpec, Path]:
    d = FrontierSpec.__dataclass_fields__
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=d["model"].default)
    ap.add_argument("--methods", nargs="*", default=list(KV_COMPRESSION_METHODS),
                    choices=KV_COMPRESSION_METHODS)
    ap.add_argument("--budgets", nargs="*", type=int, default=[64, 128, 256], metavar="TOKENS",
                    help="budget_tokens per eviction method")
    ap.add_argument("--kv-dtypes", nargs="*", default=list(KV_DTYPES), choices=KV_DTYPES)
    ap.add_argument("--kv-cache-memory-bytes", type=int,
                    default=d["kv_cache_memory_bytes"].default,
                    help="the fixed KV budget for max concurrency and the throughput runs")
    for name in ("input_len", "output_len", "num_requests", "concurrency",
                 "footprint_requests", "seed"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=d[name].default)
    ap.add_argument("--needle-lengths", nargs="+", type=int, default=None, metavar="N",
                    help="needle prompt lengths (default 128 256 512 1024)")
    ap.add_argument("--needle-depths", nargs="+", type=float, default=None, metavar="D")
    ap.add_argument("--cases-per-cell", type=int, default=d["needle_cases_per_cell"].default)
    ap.add_argument("--engine", default=None, metavar="JSON",
                    help=f"engine knobs for every point (default {json.dumps(DEFAULT_ENGINE)})")
    ap.add_argument("--out-dir", default=None, help="default .bench/kv_frontier/<UTC time>")
    a = ap.parse_args(argv)
    engine = json.loads(a.engine) if a.engine else dict(DEFAULT_ENGINE)
    if not isinstance(engine, dict):
        ap.error(f"--engine must be a JSON object of engine knobs; got {a.engine!r}")
    extra: dict[str, Any] = {}
    if a.needle_lengths:
        extra["needle_lengths"] = tuple(a.needle_lengths)
    if a.needle_depths:
        extra["needle_depths"] = tuple(a.needle_depths)
    spec = FrontierSpec(
        model=a.model, methods=tuple(a.methods), budgets=tuple(a.budgets),
        kv_dtypes=tuple(a.kv_dtypes), engine=engine,
        kv_cache_memory_bytes=a.kv_cache_memory_bytes, input_len=a.input_len,
        output_len=a.output_len, num_requests=a.num_requests, concurrency=a.concurrency,
        footprint_requests=a.footprint_requests, needle_cases_per_cell=a.cases_per_cell,
        seed=a.seed, **extra)
    out = Path(a.out_dir) if a.out_dir else (
        ROOT / ".bench" / "kv_frontier" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    return spec, out


def main(argv: Sequence[str] | None = None) -> int:
    spec, out = parse(argv)
    res = run_frontier(spec, progress=lambda line: print(line, file=sys.stderr, flush=True))
    folder = res.write(out)
    print(res.markdown())
    print(f"\nwrote {folder}/frontier.csv, needle.csv, frontier.md, frontier.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
