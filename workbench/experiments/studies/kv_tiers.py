"""Notebook 11's tiered KV cache through the runner: the same session traffic with the host
tier off and on, repeats interleaved, a fresh engine per run.

    host_tier(cpu_bytes_to_use)      the OffloadingConnector's kv_transfer_config
    tiers_template(model, engine_kwargs, workload_params, concurrency, configs, ...)
                                     experiments/kv_offload_multi_turn.yaml asked with these
                                     numbers: multi_turn_chat traffic, a closed loop of
                                     `concurrency` sessions, the baseline the config labelled
                                     None, the variable kv_transfer_config, `repeats` runs each
    measure_tiers(...)               -> (one row per run, one row per request), read back by
                                     `analysis.kv_tiers.run_rows` / `request_rows`

The template's quality gate stays: the variant's greedy output must equal the baseline's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench.experiments.studies.measure import measure

TEMPLATE = "kv_offload_multi_turn.yaml"
FIXTURE = "multi_turn_chat"


def host_tier(cpu_bytes_to_use: int) -> dict[str, Any]:
    """kv_transfer_config for a host-memory tier of `cpu_bytes_to_use` bytes (vLLM 0.32's
    OffloadingConnector, CPUOffloadingSpec; docs/kv_offload.md)."""
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": int(cpu_bytes_to_use)}}


def _split(configs: Mapping[str, Mapping[str, Any] | None]) -> tuple[str, dict[str, Any]]:
    """(the baseline's label, {label: kv_transfer_config} of the variants)."""
    off = [k for k, v in configs.items() if v is None]
    if len(off) != 1 or len(configs) < 2:
        raise ValueError(f"configs ({list(configs)}) must name one baseline (None: no "
                         "connector) and at least one kv_transfer_config")
    return off[0], {k: dict(v) for k, v in configs.items() if v is not None}


def tiers_template(model: str, engine_kwargs: Mapping[str, Any],
                   workload_params: Mapping[str, Any], concurrency: int,
                   configs: Mapping[str, Mapping[str, Any] | None], *, repeats: int = 1,
                   seed: int = 0) -> dict[str, Any]:
    """The raw template (see the module docstring)."""
    from workbench.analysis.notebook import raw_template

    if repeats < 1:
        raise ValueError(f"repeats ({repeats}) must be >= 1")
    _, variants = _split(configs)
    out = copy.deepcopy(raw_template("", TEMPLATE))
    out.pop("max_repeats", None)
    out["workload"] = {"fixture": FIXTURE, "seed": seed, "params": copy.deepcopy(
        dict(workload_params))}
    out["arrivals"] = {"mode": "closed", "concurrency": concurrency}
    out["target"] = {"kind": "in-process", "model": model}
    out["baseline"] = {**copy.deepcopy(dict(engine_kwargs)), "kv_transfer_config": None}
    out["variable"] = {"name": "kv_transfer_config", "values": list(variants.values())}
    out["repeats"] = repeats
    return out


def measure_tiers(model: str, engine_kwargs: Mapping[str, Any],
                  workload_params: Mapping[str, Any], concurrency: int,
                  configs: Mapping[str, Mapping[str, Any] | None], *, repeats: int = 1,
                  seed: int = 0, uri: str, progress: bool = True
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`tiers_template(...)` through the runner into `uri`; (one row per run, one row per
    request), each labelled with its config's name in `configs`."""
    from workbench.analysis.kv_tiers import request_rows, run_rows
    from workbench.config.named_models import resolve_model
    from workbench.harness.workloads import make_workload
    from workbench.models.tokenizer import load_tokenizer

    raw = tiers_template(model, engine_kwargs, workload_params, concurrency, configs,
                         repeats=repeats, seed=seed)
    result = measure(raw, uri, progress=progress)
    failed = [f"{r.label} repeat {r.repeat}: {r.error}" for r in result.runs if r.error]
    if failed:
        raise RuntimeError(f"{result.name}: runs failed: {'; '.join(failed)}")
    workload = make_workload(FIXTURE, seed, load_tokenizer(resolve_model(model)),
                             **dict(workload_params))
    if workload.checksum != result.workload_checksum:
        raise RuntimeError(f"{result.name} replayed other traffic than {FIXTURE} seed {seed}")
    return run_rows(result, configs), request_rows(result, configs, workload, uri)
