"""`workbench calibrate --serving`: fit the cost model to steps timed on the serving path.

The offline design (`calibrate.py`) times `LLMEngine.step()` in a tight loop. A measured
template run does not: the engine steps in the AsyncEngine's thread while the load generator,
the token streams and the CPU watch run beside it, and on a 2-core CPU that costs every step
time (measured 2026-12-06 on an AMD EPYC, 2 cores: a batch-8 decode step 7.0-8.3 ms offline,
8.0-10.5 ms served; and the offline profile predicted the served runs' TTFT 40-70% low).
This design replays a few fixed, seeded workloads through the in-process target, the same
path templates measure, and fits on each step's row of the engine's step trace: its
BatchComposition (the engine records it, workbench/core/batch_composition.py) and its
**interval**: from its start to the next step's start when the engine went straight on (the
loop's own work between steps belongs to the step), else its duration plus the median of
those short gaps (the engine then idled, waiting for arrivals, which the simulator models
itself). Rows with a preemption are left out (counted).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.sim.batch import BatchComposition

# A gap from one step's end to the next one's start longer than this means the loop idled.
IDLE_GAP_S = 2e-3


@dataclass(frozen=True)
class ServingRun:
    """One replay of the serving design: a workload fixture, its arrivals, and the engine's
    per-step token budget and running-request cap (a fresh engine per run)."""

    fixture: str
    params: Mapping[str, Any]
    arrivals: Mapping[str, Any]
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    engine: Mapping[str, Any] = field(default_factory=dict)  # more knobs (speculation)

    def describe(self) -> dict[str, Any]:
        return {"fixture": self.fixture, "params": dict(self.params),
                "arrivals": dict(self.arrivals),
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_num_seqs": self.max_num_seqs, "engine": dict(self.engine)}


# The shipped templates' traffic shapes (other seeds than theirs), at budgets 64 to 2048:
# shared prefixes at 30 req/s, long prefills at 6-40 req/s (chunks of 64 to 2048 tokens
# beside decodes), chat in closed loops of 32 (4 and 32 running), long decodes at growing
# contexts. Every run gets a fresh engine, as a template's run does.
SERVING_DESIGN: tuple[ServingRun, ...] = (
    ServingRun("shared-prefix", {"num_requests": 24}, {"mode": "poisson", "rate": 30.0}),
    ServingRun("long-prefill", {"num_requests": 24}, {"mode": "poisson", "rate": 6.0}),
    ServingRun("long-prefill", {"num_requests": 32}, {"mode": "poisson", "rate": 40.0}),
    ServingRun("long-prefill", {"num_requests": 32}, {"mode": "poisson", "rate": 40.0}, 64),
    ServingRun("long-prefill", {"num_requests": 32}, {"mode": "poisson", "rate": 40.0}, 2048),
    ServingRun("balanced-chat", {"num_requests": 64}, {"mode": "closed", "concurrency": 32}),
    ServingRun("balanced-chat", {"num_requests": 32}, {"mode": "closed", "concurrency": 32},
               max_num_seqs=4),
    ServingRun("long-decode", {"num_requests": 24}, {"mode": "closed", "concurrency": 12}),
    ServingRun("repetitive", {"num_requests": 16}, {"mode": "closed", "concurrency": 1}, 2048,
               engine={"speculative_config": {"method": "ngram", "num_speculative_tokens": 5,
                                              "prompt_lookup_min": 2,
                                              "prompt_lookup_max": 5}}),
    ServingRun("repetitive", {"num_requests": 16}, {"mode": "closed", "concurrency": 4}, 2048,
               engine={"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                              "prompt_lookup_min": 2,
                                              "prompt_lookup_max": 4}}),
)
QUICK_SERVING_DESIGN: tuple[ServingRun, ...] = (
    ServingRun("long-prefill", {"num_requests": 6}, {"mode": "poisson", "rate": 20.0}),
    ServingRun("balanced-chat", {"num_requests": 8}, {"mode": "closed", "concurrency": 4}),
)


@dataclass
class ServingSteps:
    """What the serving runs kept and left out."""

    samples: list[tuple[BatchComposition, float]]
    skipped_preempted: int = 0
    skipped_empty: int = 0
    idle_gap_s: float = 0.0  # the median short gap added to a step the engine idled after


def composition_of(row: Mapping[str, Any]) -> BatchComposition:
    """A step trace row's BatchComposition (the engine's recorded fields)."""
    return BatchComposition(
        prefill_tokens=int(row["prefill_tokens"]),
        prefill_attn_pairs=int(row["prefill_attn_pairs"]),
        decode_tokens=int(row["decode_tokens"]),
        decode_context_tokens=int(row["decode_context_tokens"]),
        num_seqs=int(row["num_seqs"]), sampled_rows=int(row["sampled_rows"]),
        draft_tokens=int(row.get("spec_draft_tokens", 0)),
        prefill_seqs=int(row["prefill_seqs"]))


def step_samples(rows: Sequence[Mapping[str, Any]], idle_gap_s: float = IDLE_GAP_S
                 ) -> ServingSteps:
    """(composition, seconds) per step of one run's trace (rows in step order, times on one
    clock: `wall_time_s` the step's end, `duration_s` its length); see the module docstring
    for the interval rule. The run's last step, with no next one, counts as idled after."""
    starts = [float(r["wall_time_s"]) - float(r["duration_s"]) for r in rows]
    ends = [float(r["wall_time_s"]) for r in rows]
    gaps = [starts[i + 1] - ends[i] for i in range(len(rows) - 1)]
    short = [g for g in gaps if g <= idle_gap_s]
    typical = statistics.median(short) if short else 0.0
    out = ServingSteps(samples=[], idle_gap_s=typical)
    for i, row in enumerate(rows):
        batch = composition_of(row)
        if int(row["preemptions"]):
            out.skipped_preempted += 1
            continue
        if batch.num_tokens == 0:
            out.skipped_empty += 1
            continue
        if i < len(gaps) and gaps[i] <= idle_gap_s:
            seconds = starts[i + 1] - starts[i]
        else:
            seconds = float(row["duration_s"]) + typical
        out.samples.append((batch, seconds))
    return out


def _replay(target: Any, run: ServingRun, tokenizer: Any, seed: int) -> list[dict[str, Any]]:
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.replay import run_benchmark
    from workbench.harness.workloads import make_workload

    workload = make_workload(run.fixture, seed, tokenizer, **dict(run.params))
    arrival = ArrivalSpec(**{**dict(run.arrivals), **(
        {"seed": seed} if run.arrivals.get("mode") != "closed" else {})})
    result = asyncio.run(run_benchmark(target, workload, arrival, warmup_requests=2,
                                       cache_state="warm-model", max_other_cpu_share=None,
                                       warn_invalid=False))
    if result.error is not None:
        raise RuntimeError(f"calibration run {run.describe()} failed: {result.error}")
    return list(result.step_trace)


def collect_serving_steps(model: str, engine_kwargs: Mapping[str, Any],
                          design: Sequence[ServingRun] = SERVING_DESIGN, repeats: int = 1,
                          seed: int = 0) -> tuple[ServingSteps, Any]:
    """Replay `design` `repeats` times, each run on a fresh in-process engine (as a template's
    runs are); the kept samples and the first engine's config (for the profile). Seeds are
    offset by 1000 from the templates' (seed 0) so no run replays a template's traffic."""
    from workbench.config.named_models import resolve_model
    from workbench.harness.targets import InProcessTarget
    from workbench.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(model))
    total = ServingSteps(samples=[])
    gaps: list[float] = []
    config = None
    for r in range(repeats):
        for i, run in enumerate(design):
            target = InProcessTarget(model, {**dict(engine_kwargs),
                                             "max_num_batched_tokens": run.max_num_batched_tokens,
                                             "max_num_seqs": run.max_num_seqs,
                                             **dict(run.engine)})
            try:
                rows = _replay(target, run, tokenizer, seed + 1000 + 100 * r + i)
                assert target.engine is not None
                config = config or target.engine.config
            finally:
                asyncio.run(target.stop())
            steps = step_samples(rows)
            total.samples += steps.samples
            total.skipped_preempted += steps.skipped_preempted
            total.skipped_empty += steps.skipped_empty
            gaps.append(steps.idle_gap_s)
    total.idle_gap_s = statistics.median(gaps) if gaps else 0.0
    return total, config
