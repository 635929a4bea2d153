"""`sim.composition.compose`, the one-pass hot-path version, gives exactly the composition the
Chunk-by-Chunk reference (`compose_by_chunks` -> `from_chunks`) gives, on every step of runs
that chunk prefills, preempt, hit the prefix cache and verify speculative drafts."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.batch_composition import compose, compose_by_chunks
from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim import instance as instance_module
from workbench.sim.batch import BatchComposition
from workbench.sim.instance import SimInstance, SpecDecodeModel
from workbench.sim.simulator import simulate


class FixedCost:
    def step_time_s(self, batch: BatchComposition) -> float:
        return 1e-3 + 1e-5 * batch.num_tokens

    def describe(self) -> dict[str, Any]:
        return {"source": "test"}


@pytest.mark.parametrize(("num_blocks", "spec"), [
    (12, None),  # a small pool: preemptions and recomputes
    (64, SpecDecodeModel(3, 0.6, seed=1)),  # drafts verified, some rejected
])
def test_one_pass_compose_equals_the_chunk_reference_on_every_step(
        monkeypatch: pytest.MonkeyPatch, num_blocks: int, spec: SpecDecodeModel | None
) -> None:
    seen: list[BatchComposition] = []

    def checked(requests: dict[str, Request], out: SchedulerOutput) -> BatchComposition:
        fast = compose(requests, out)
        assert fast == compose_by_chunks(requests, out)
        seen.append(fast)
        return fast

    monkeypatch.setattr(instance_module, "compose", checked)
    shared = list(range(500, 532))  # two full blocks every request shares
    wl = Workload("mix", 0, {}, tuple(
        BenchRequest(f"r{i}", shared + list(range(1000 * i, 1000 * i + 8 + 9 * (i % 4))),
                     6 + i % 5) for i in range(12)))
    sc = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=128)
    inst = SimInstance("i0", sc, CacheConfig(block_size=16, enable_prefix_caching=True),
                       num_blocks, FixedCost(), spec)
    res = simulate(wl, ArrivalSpec(mode="poisson", rate=500.0, seed=2), [inst])
    assert all(r.success for r in res.records)
    assert len(seen) == inst.steps and inst.steps > 20
    assert any(b.prefill_tokens and b.decode_tokens for b in seen)  # mixed steps
    if spec is None:
        assert inst.counters["vllm:num_preemptions"] > 0
    else:
        assert sum(b.draft_tokens for b in seen) > 0
