"""Measurement loops the notebooks run: one call per grid of conditions, one table back.

Place in the flow: the experiments layer is the only driver of a measurement; templates go
through `runner.run_experiment` (notebooks 03, 06 and the studies), and these loops measure
what is not a baseline-vs-variant question (a quickstart run, a grid of cache conditions or
concurrencies, the KV pool per block size, an all-reduce). Each replay goes through the
harness (`harness.replay.run`: its validity check, its metrics). `workbench.analysis` only
reads results back (frames, plots, tables).

Each function starts what it measures (an in-process engine, fresh engines per block size,
the gloo processes of an all-reduce) and stops it again, so a notebook cell is one call and
a table:

    measure_in_process(model, engine_kwargs, workload, arrival)  one run, target stopped after
    prefix_workloads(tokenizer, seed, ...)        shared vs unique prefixes, same lengths (04)
    workload_table(workloads)                     one row per workload: its summary (04, 11)
    cache_conditions(model, kwargs, workloads, ...)   caching x traffic x cache state (04)
    concurrency_levels(model, kwargs, workload, ...)  closed loop at each concurrency (05)
    engine_capacity(model, block_sizes, ...)      the engine's own KV pool sizing (02)
    allreduce_table(hidden_size, tokens, ...)     one all-reduce's latency and the per-step floor
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import LLM
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.collectives import allreduce_latency, collectives_per_step
from workbench.harness.metrics import records_frame
from workbench.harness.replay import RunResult, run, run_sync
from workbench.harness.targets import InProcessTarget
from workbench.harness.validity import CpuWatch
from workbench.harness.watched import watched
from workbench.harness.workloads import Workload, make_workload


def measure_in_process(model: str | Path, engine_kwargs: Mapping[str, Any], workload: Workload,
                       arrival: ArrivalSpec, **run_kw: Any) -> RunResult:
    """One measured run of `workload` on a fresh in-process engine, stopped afterwards."""
    target = InProcessTarget(str(model), dict(engine_kwargs))
    try:
        return run(target, workload, arrival, **run_kw)
    finally:
        run_sync(target.stop)


def prefix_workloads(tokenizer: Any, seed: int, num_requests: int, prefix_len: int,
                     num_prefix_groups: int) -> dict[str, Workload]:
    """Two shared-prefix workloads with the same lengths: "shared" (request i uses prefix
    i % num_prefix_groups) and "unique" (one prefix per request)."""
    common = {"num_requests": num_requests, "prefix_len": prefix_len}
    return {
        "shared": make_workload("shared-prefix", seed, tokenizer,
                                num_prefix_groups=num_prefix_groups, **common),
        "unique": make_workload("shared-prefix", seed, tokenizer,
                                num_prefix_groups=num_requests, **common),
    }


def workload_table(workloads: Mapping[str, Workload]) -> pd.DataFrame:
    """One row per workload: its summary without the raw params."""
    return pd.DataFrame([{"traffic": name, **{k: v for k, v in wl.summary().items()
                                              if k != "params"}}
                         for name, wl in workloads.items()])


def cache_conditions(model: str | Path, engine_kwargs: Mapping[str, Any],
                     workloads: Mapping[str, Workload], cache_states: Sequence[str],
                     caching: Sequence[bool], concurrency: int
                     ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Every (enable_prefix_caching, workload, cache state) on one engine per caching value,
    closed loop: a table of TTFT and prefix-cache hit rate (tokens, from the engine's counter
    delta), and the per-request frames keyed "<traffic>, <state>, caching on|off"."""
    rows, requests = [], {}
    arrival = ArrivalSpec(mode="closed", concurrency=concurrency)
    for caching_on in caching:
        target = InProcessTarget(str(model),
                                 {**engine_kwargs, "enable_prefix_caching": caching_on})
        try:
            for traffic, wl in workloads.items():
                for state in cache_states:
                    res = run(target, wl, arrival, cache_state=state)
                    rows.append(_cache_row(res, traffic, state, caching_on))
                    label = f"{traffic}, {state}, caching {'on' if caching_on else 'off'}"
                    requests[label] = records_frame(res.records)
        finally:
            run_sync(target.stop)
    return pd.DataFrame(rows), requests


def _cache_row(res: RunResult, traffic: str, state: str, caching_on: bool) -> dict[str, Any]:
    m, d = res.metrics(), res.server_delta
    hits = d.get("vllm:prefix_cache_hits", 0)
    queries = d.get("vllm:prefix_cache_queries", 0)
    return {"traffic": traffic, "cache_state": state, "prefix_caching": caching_on,
            "median_ttft_ms": m["median_ttft_ms"], "p95_ttft_ms": m["p95_ttft_ms"],
            "hit_rate": hits / queries if queries else 0.0,
            "hit_tokens": hits, "query_tokens": queries, "valid": res.validity.valid}


def concurrency_levels(model: str | Path, engine_kwargs: Mapping[str, Any], workload: Workload,
                       concurrencies: Iterable[int], repeats: int = 1
                       ) -> tuple[pd.DataFrame, dict[int, list[dict[str, Any]]]]:
    """The workload closed-loop at each concurrency (`repeats` runs each) on one engine: one
    row of metrics per run, and the step trace of each level's last run."""
    rows, traces = [], {}
    target = InProcessTarget(str(model), dict(engine_kwargs))
    try:
        for c in concurrencies:
            for r in range(repeats):
                res = run(target, workload, ArrivalSpec(mode="closed", concurrency=c))
                rows.append({"concurrency": c, "repeat": r, "valid": res.validity.valid,
                             **res.metrics()})
                traces[c] = res.step_trace
    finally:
        run_sync(target.stop)
    return pd.DataFrame(rows), traces


def engine_capacity(model: str | Path, block_sizes: Iterable[int], max_model_len: int,
                    kv_cache_bytes: int, dtype: str = "float32") -> pd.DataFrame:
    """The engine's own KV pool at each block size from the same KV bytes: blocks, token
    capacity and max concurrency, one row per block size (one engine built per row)."""
    rows = []
    for bs in block_sizes:
        r = LLM(str(model), dtype=dtype, block_size=bs, max_model_len=max_model_len,
                kv_cache_memory_bytes=kv_cache_bytes).memory_readout()
        rows.append({"block_size": bs, "engine_num_blocks": r["num_blocks"],
                     "engine_kv_token_capacity": r["kv_token_capacity"],
                     "engine_max_concurrency": r["max_concurrency"]})
    return pd.DataFrame(rows)


def allreduce_table(hidden_size: int, tokens: Sequence[int], num_hidden_layers: int,
                    iters: int = 200, world_size: int = 2, watch: CpuWatch | None = None
                    ) -> pd.DataFrame:
    """gloo all-reduce latency of `tokens[i] x hidden_size` fp32 values (median / p90 us),
    the collectives a TP forward pass makes (2L + 2) and the floor they add per step (ms);
    watched and judged as a run is (`harness.watched`: `other_cpu_share`, `valid`)."""
    numels = tuple(hidden_size * t for t in tokens)
    rows, validity = watched(lambda: allreduce_latency(world_size, numels, iters=iters),
                             f"all-reduce timing (world_size {world_size})", watch)
    comm = pd.DataFrame(rows)
    comm.insert(0, "tokens", list(tokens))
    per_step = collectives_per_step(num_hidden_layers)
    comm["collectives_per_step"] = per_step
    comm["floor_ms_per_step"] = comm["median_us"] * per_step / 1000
    comm["other_cpu_share"], comm["valid"] = validity.other_cpu_share, validity.valid
    return comm
