"""Issue 33's fidelity targets held on a small template with an injected clock: the real engine
(bundled checkpoint, real tokens, scheduler, prefix cache, chunked prefill) replayed on a
virtual clock priced by a fixed cost model (`sim/engine_replay.py`) against `simulate()` under
the same cost model, same workload and arrivals. Per value: the median over three arrival
seeds of median and p95 TTFT, median TPOT and output throughput within 10% (medians) / 20%
(p95), and the same verdict (the experiments' Welch interval on p95 TTFT). No wall clock."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from workbench.config import EngineConfig
from workbench.config.named_models import resolve_model
from workbench.engine.llm_engine import LLMEngine
from workbench.experiments.verdict_rule import classify, effect_interval
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import make_workload
from workbench.models.tokenizer import load_tokenizer
from workbench.sim.batch import BatchComposition
from workbench.sim.engine_replay import replay_engine
from workbench.sim.instance import SimInstance
from workbench.sim.linear_fit import predict
from workbench.sim.simulator import simulate

# seconds per unit (the magnitudes calibrated on a 2-core CPU for the demo model)
COEFFICIENTS = {"overhead": 3e-3, "token": 6e-5, "prefill_attn_pair": 8e-8,
                "decode_kv_token": 4e-7, "seq": 2e-5, "sampled_row": 1e-4, "token_low": 3e-5,
                "prefill_seq": 1e-3, "draft_token": 1e-4}
SEEDS = (0, 1, 2)
UNIFORM_8_24 = {"kind": "uniform", "low": 8, "high": 24}
UNIFORM_4_12 = {"kind": "uniform", "low": 4, "high": 12}
METRICS = {"median_ttft_ms": 0.10, "p95_ttft_ms": 0.20, "median_tpot_ms": 0.10,
           "output_throughput": 0.10}


class FixedCost:
    def step_time_s(self, batch: BatchComposition) -> float:
        return predict(COEFFICIENTS, batch)

    def describe(self) -> dict[str, Any]:
        return {"source": "test", "coefficients_s": COEFFICIENTS}


def _engine(knobs: dict[str, Any]) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs("bundled", device="cpu", dtype="float32", seed=0,
                                              max_num_seqs=32, **knobs))


def _pair(fixture: str, params: dict[str, Any], rate: float, knobs: dict[str, Any]
          ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Per arrival seed: the engine's metrics on the virtual clock, the simulator's."""
    tok = load_tokenizer(resolve_model("bundled"))
    workload = make_workload(fixture, 0, tok, **params)
    measured, simulated = [], []
    engine = _engine(knobs)
    for seed in SEEDS:
        arrival = ArrivalSpec(mode="poisson", rate=rate, seed=seed)
        engine.reset_prefix_cache()  # every seed starts cold, as the simulator's instance
        measured.append(replay_engine(engine, workload, arrival, FixedCost()).metrics())
        blocks = engine.scheduler.kv_cache_manager.block_pool.num_blocks
        inst = SimInstance("i0", engine.config.scheduler_config, engine.config.cache_config,
                           blocks, FixedCost())
        simulated.append(simulate(workload, arrival, [inst]).metrics())
    return measured, simulated


def _median(runs: list[dict[str, float]], metric: str) -> float:
    return statistics.median(r[metric] for r in runs)


def _decision(base: list[dict[str, float]], var: list[dict[str, float]]) -> str:
    metric = "p95_ttft_ms"
    interval = effect_interval([r[metric] for r in base], [r[metric] for r in var], 0.05)
    return classify(interval, 0.02)


def _check(base_knobs: dict[str, Any], var_knobs: dict[str, Any], fixture: str,
           params: dict[str, Any], rate: float) -> tuple[str, str]:
    mb, sb = _pair(fixture, params, rate, base_knobs)
    mv, sv = _pair(fixture, params, rate, var_knobs)
    for label, m, s in (("baseline", mb, sb), ("variant", mv, sv)):
        for metric, bound in METRICS.items():
            a, b = _median(m, metric), _median(s, metric)
            assert abs(b - a) / a <= bound, (label, metric, a, b)
    return _decision(mb, mv), _decision(sb, sv)


def test_prefix_caching_fidelity_on_a_virtual_clock() -> None:
    base = {"enable_prefix_caching": False, "max_num_batched_tokens": 512}
    var = {"enable_prefix_caching": True, "max_num_batched_tokens": 512}
    measured, simulated = _check(base, var, "shared-prefix",
                                 {"num_requests": 16, "output_len": UNIFORM_8_24}, rate=40.0)
    assert measured == simulated == "decrease"


@pytest.mark.parametrize("budget", [64])
def test_chunked_prefill_budget_fidelity_on_a_virtual_clock(budget: int) -> None:
    base = {"enable_prefix_caching": False, "max_num_batched_tokens": 512}
    var = {"enable_prefix_caching": False, "max_num_batched_tokens": budget}
    measured, simulated = _check(base, var, "long-prefill",
                                 {"num_requests": 12, "output_len": UNIFORM_4_12}, rate=30.0)
    assert measured == simulated
