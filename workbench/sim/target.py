"""A template's `target: {kind: simulated, ...}`: the experiment's engine knobs on simulated
instances, one `RunResult` per run, as a measured run gives.

    target:
      kind: simulated
      model: bundled                # a folder or shipped name (its config.json), or a named
                                    # shape (Llama-3-8B, ...; workbench/sim/model_shapes.py)
      hardware: H100-SXM            # an analytic GPU profile (workbench/sim/hardware.py), or
      profile: path/to/profile.json # a calibrated one (`workbench calibrate`)
      num_instances: 1              # replicas behind the router
      router_policy: round_robin    # or least_outstanding
      num_gpu_blocks: 2048          # the KV pool per instance (default: the profile's, or
                                    # what the GPU's memory holds after the weights)
      max_model_len: 4096           # default: the model's max_position_embeddings
      acceptance_rate: 0.7          # speculative decoding: per-draft acceptance
      # the cluster (sim/cluster.py): prefix_blocks, num_prefill / num_decode with
      # kv_transfer: {link: 400gbe}, decode_policy, kv_offload: {num_cpu_blocks, link}

The baseline and variant knobs map to the real `SchedulerConfig` and `CacheConfig` (the
scheduler's own validation applies); `speculative_config` becomes the acceptance model
(`num_speculative_tokens` drafts, `acceptance_rate` from the target); `tensor_parallel_size`
and `pipeline_parallel_size` price the analytic model's communication. A knob the simulator
does not model is refused by name. Every run logs the cost model's `describe()` (source:
calibrated or analytic, which profile) in the result's `target`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.config import CacheConfig, SchedulerConfig
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.replay import CACHE_STATES, RunResult
from workbench.harness.validity import Validity
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.batch import CostModel
from workbench.sim.cluster import CLUSTER_KEYS, CLUSTER_KNOBS, cluster_problems, cluster_spec
from workbench.sim.connectors import SimConnector
from workbench.sim.deploy import SimCluster, build_cluster, kv_bytes_per_token
from workbench.sim.instance import SimInstance, SpecDecodeModel
from workbench.sim.simulator import SimResult

TARGET_KEYS = ("kind", "model", "tokenizer", "hardware", "profile", "num_gpu_blocks",
               "max_model_len", "acceptance_rate", "gpu_memory_utilization", "step_noise",
               *CLUSTER_KEYS)
ANALYTIC_STEP_NOISE = 0.02  # stated: an analytic profile has no measured spread
SCHEDULER_KNOBS = tuple(f.name for f in dataclasses.fields(SchedulerConfig)
                        if f.name != "max_model_len")
CACHE_KNOBS = ("block_size", "enable_prefix_caching", "num_gpu_blocks_override")
PRICED_KNOBS = ("max_model_len", "tensor_parallel_size", "pipeline_parallel_size",
                "speculative_config", "kv_cache_dtype", "dtype")
# knobs that change no scheduling decision and no modelled cost (a calibrated profile
# measured them as they were): accepted, recorded
NEUTRAL_KNOBS = ("seed", "enforce_eager", "attention_backend", "distributed_executor_backend")
KNOBS = (*SCHEDULER_KNOBS, *CACHE_KNOBS, *PRICED_KNOBS, *NEUTRAL_KNOBS, *CLUSTER_KNOBS)


def problems(target: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a simulated target and one engine config, each named."""
    return target_problems(target) + config_problems(target, config)


def target_problems(target: Mapping[str, Any]) -> list[str]:
    """What is wrong with the target block itself."""
    out = [f"target.{k} is not a simulated target's key (keys: {', '.join(TARGET_KEYS)})"
           for k in target if k not in TARGET_KEYS]
    if ("hardware" in target) == ("profile" in target):
        out.append("a simulated target needs exactly one of target.hardware (an analytic GPU "
                   "profile) or target.profile (a calibrated profile JSON)")
    return out + [f"target: {p}" for p in cluster_problems(target, {})]


def config_problems(target: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """What the simulator cannot run of one engine config (baseline or a variant)."""
    out = [f"engine knob {k!r} is not modelled by the simulator (modelled: "
            f"{', '.join(KNOBS)})" for k in config if k not in KNOBS]
    spec = config.get("speculative_config")
    if spec is not None and "acceptance_rate" not in target:
        out.append("speculative_config needs target.acceptance_rate (the per-draft "
                   "acceptance probability the simulator draws with)")
    if any(k in config for k in CLUSTER_KNOBS):
        gpus = config.get("tensor_parallel_size", 1), config.get("pipeline_parallel_size", 1)
        if all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in gpus):
            out += cluster_problems(target, config, gpus[0] * gpus[1])
    return out


def tokenizer_name(target: Mapping[str, Any]) -> str:
    """What builds the workload's prompts: `target.tokenizer`, else the model when it is a
    folder or shipped model with tokenizer files, else the bundled tokenizer (a named shape
    has none; the simulator only needs token ids, and their sharing)."""
    if "tokenizer" in target:
        return str(target["tokenizer"])
    from workbench.config.named_models import NAMED_MODELS

    name = str(target.get("model", "bundled"))
    folder = Path(name)
    if name in NAMED_MODELS or (folder / "tokenizer.json").is_file() or \
            (folder / "tokenizer_config.json").is_file():
        return name
    return "bundled"


def build_cost_model(target: Mapping[str, Any], config: Mapping[str, Any]) -> CostModel:
    """The target's cost model: the calibrated profile, or the analytic one for its GPU."""
    if "profile" in target:  # a file, or auto: this machine's newest (profile_lookup.py)
        from workbench.sim.calibrated import CalibratedCostModel
        from workbench.sim.profile_lookup import resolve_profile

        return CalibratedCostModel.load(resolve_profile(target, config))
    from workbench.sim.cost_model import AnalyticCostModel
    from workbench.sim.model_shapes import model_shape

    weights = str(config.get("dtype", "auto"))
    weights = "bf16" if weights in ("auto", "bfloat16") else weights
    kv = str(config.get("kv_cache_dtype", "auto"))  # auto: the weights' dtype, as vLLM
    return AnalyticCostModel(
        model_shape(_shape_source(target)), str(target["hardware"]),
        tensor_parallel_size=int(config.get("tensor_parallel_size", 1)),
        pipeline_parallel_size=int(config.get("pipeline_parallel_size", 1)),
        weight_dtype=weights,
        kv_cache_dtype=weights if kv == "auto" else "fp8" if kv.startswith("fp8") else kv)


def _shape_source(target: Mapping[str, Any]) -> str | dict[str, Any]:
    """A named shape as is; a folder or shipped model name: its config.json."""
    from workbench.config.named_models import resolve_model

    name = str(target.get("model", "bundled"))
    folder = Path(resolve_model(name))
    if (folder / "config.json").is_file():
        loaded: dict[str, Any] = json.loads((folder / "config.json").read_text())
        return loaded
    return name


def _max_model_len(target: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """The engine knob, the target's, the model's max_position_embeddings, else 4096."""
    if config.get("max_model_len") is not None:
        return int(config["max_model_len"])
    if "max_model_len" in target:
        return int(target["max_model_len"])
    source = _shape_source(target)
    if isinstance(source, dict) and "max_position_embeddings" in source:
        return int(source["max_position_embeddings"])
    return 4096


def num_gpu_blocks(target: Mapping[str, Any], config: Mapping[str, Any], cost: CostModel,
                   block_size: int) -> int:
    """Blocks per instance: the knob, the target's, the calibrated profile's, or what the
    analytic GPU's memory holds after the weights at `gpu_memory_utilization` (0.9)."""
    for value in (config.get("num_gpu_blocks_override"), target.get("num_gpu_blocks")):
        if value is not None:
            return int(value)
    profile = getattr(cost, "profile", None)
    if isinstance(profile, Mapping):
        return _cpu_engine_blocks(profile, config, block_size, _max_model_len(target, config))
    shape, hw = getattr(cost, "shape", None), getattr(cost, "hardware", None)
    if shape is None or hw is None:
        raise ValueError("the cost model says nothing of memory: set target.num_gpu_blocks")
    tp = getattr(cost, "tp", 1) * getattr(cost, "pp", 1)
    params = shape.num_layers * shape.layer_matmul_params() + 2 * shape.vocab_size * \
        shape.hidden_size
    free = hw.memory_bytes * float(target.get("gpu_memory_utilization", 0.9)) - \
        params * getattr(cost, "weight_bytes", 2) / tp
    per_block = shape.kv_bytes_per_token(getattr(cost, "kv_bytes", 2)) * block_size / tp
    blocks = int(free // per_block)
    if blocks < 2:
        raise ValueError(f"{hw.name}: the weights leave no room for a KV pool "
                         f"({free / 2**30:.1f} GiB free at tensor/pipeline degree {tp})")
    return blocks


def step_noise(target: Mapping[str, Any], cost: CostModel) -> float:
    """`target.step_noise`, else the calibrated fit's held-out spread (its median absolute
    relative error / 0.6745, a normal's sigma), else ANALYTIC_STEP_NOISE."""
    if "step_noise" in target:
        return float(target["step_noise"])
    profile = getattr(cost, "profile", None)
    fit = profile.get("fit") if isinstance(profile, Mapping) else None
    if isinstance(fit, Mapping) and fit.get("heldout_median_rel_error") is not None:
        return min(0.5, float(fit["heldout_median_rel_error"]) / 0.6745)
    return ANALYTIC_STEP_NOISE


def _cpu_engine_blocks(profile: Mapping[str, Any], config: Mapping[str, Any],
                       block_size: int, max_model_len: int) -> int:
    """A profile calibrated on this machine's CPU engine: the pool that engine gives the
    same knobs (`core.kv_cache.sizing.default_num_blocks`, the model's KV bytes in the dtype
    the profile's engine ran)."""
    from workbench.core.kv_cache.sizing import default_num_blocks
    from workbench.sim.cost_model import dtype_bytes
    from workbench.sim.model_shapes import ModelShape

    model = profile.get("model")
    if not isinstance(model, Mapping) or not isinstance(model.get("shape"), Mapping):
        raise ValueError("the calibrated profile has no model shape: set target.num_gpu_blocks")
    shape = ModelShape(**model["shape"])
    dtype = str((profile.get("engine") or {}).get("dtype") or config.get("dtype") or "float32")
    per_block = shape.kv_bytes_per_token(dtype_bytes(dtype)) * block_size
    return default_num_blocks(int(config.get("max_num_seqs", 256)), max_model_len,
                              block_size, per_block)


def make_instances(target: Mapping[str, Any], config: Mapping[str, Any], repeat: int = 0
                   ) -> tuple[list[SimInstance], CostModel]:
    """The target's instances for one run (colocated, or prefill then decode ones);
    `repeat` seeds their step noise and acceptance."""
    cluster, cost = make_cluster(target, config, repeat)
    return cluster.all_instances, cost


def make_cluster(target: Mapping[str, Any], config: Mapping[str, Any], repeat: int = 0
                 ) -> tuple[SimCluster, CostModel]:
    """The target's cluster for one run (`sim/cluster.py`, `sim/deploy.py`)."""
    bad = problems(target, config)
    if bad:
        raise ValueError("; ".join(bad))
    cost = build_cost_model(target, config)
    sc = SchedulerConfig(**{k: config[k] for k in SCHEDULER_KNOBS if k in config},
                         max_model_len=_max_model_len(target, config))
    cc = CacheConfig(**{k: config[k] for k in CACHE_KNOBS if k in config})
    blocks = num_gpu_blocks(target, config, cost, cc.block_size)
    spec_cfg = config.get("speculative_config")
    noise = step_noise(target, cost)
    kvb = kv_bytes_per_token(cost)
    gpus = int(config.get("tensor_parallel_size", 1)) * int(
        config.get("pipeline_parallel_size", 1))
    layout = cluster_spec(target, config, gpus, (kvb or 1) * cc.block_size, cc.block_size)

    def make(name: str, i: int, connector: SimConnector | None) -> SimInstance:
        seed = 1000 * repeat + i
        spec = None
        if spec_cfg:
            spec = SpecDecodeModel(int(spec_cfg["num_speculative_tokens"]),
                                   float(target["acceptance_rate"]), seed=seed)
        return SimInstance(name, sc, cc, blocks, cost, spec, step_noise=noise,
                           noise_seed=seed, connector=connector)

    return build_cluster(layout, make, kvb, cc.block_size), cost


def run_simulated(target: Mapping[str, Any], config: Mapping[str, Any], workload: Workload,
                  arrival: ArrivalSpec, cache_state: str = "warm-model", repeat: int = 0
                  ) -> RunResult:
    """One simulated run, shaped as `harness.replay.run`'s result; `repeat` seeds it."""
    if cache_state not in CACHE_STATES:
        raise ValueError(f"cache_state ({cache_state!r}) must be one of {list(CACHE_STATES)}")
    cluster, cost = make_cluster(target, config, repeat)
    instances = cluster.all_instances
    if cache_state == "warm-prefix":  # every request once with max_tokens=1, unmeasured
        warm = Workload(workload.name, workload.seed, workload.params, tuple(
            BenchRequest(r.request_id, r.prompt_token_ids, 1) for r in workload.requests))
        cluster.simulate(warm, ArrivalSpec(mode="closed", concurrency=1))
        for inst in instances:
            inst.reset_stats()
    sim = cluster.simulate(workload, arrival)
    return to_run_result(sim, workload, arrival, cache_state, {
        "kind": "simulated", "model": target.get("model", "bundled"),
        "num_instances": len(instances), **cluster.spec.describe(),
        "num_gpu_blocks": instances[0].scheduler.kv_cache_manager.block_pool.num_blocks,
        "step_noise": instances[0].step_noise, "repeat": repeat,
        "routing_decisions": sim.decisions, "cost_model": cost.describe()})


def to_run_result(sim: SimResult, workload: Workload, arrival: ArrivalSpec, cache_state: str,
                  described: dict[str, Any]) -> RunResult:
    """The harness's RunResult of a simulation: valid by construction (no CPU to disturb),
    the step trace with `duration_s`, the counters as the server's delta."""
    trace = [{"step": i, **row, "duration_s": row["step_s"]}
             for i, row in enumerate(sim.step_trace)]
    validity = Validity()
    validity.reasons = []
    return RunResult(
        records=sim.records, duration_s=sim.duration_s, open_loop=arrival.is_open_loop,
        arrival=arrival.to_dict(), cache_state=cache_state,
        workload_checksum=workload.checksum, workload_name=workload.name, validity=validity,
        step_trace=trace, server_before={}, server_after=dict(sim.counters),
        target=described, server_delta=dict(sim.counters))
