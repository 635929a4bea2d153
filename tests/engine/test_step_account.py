"""The step's overhead account: StepRecord phase fields, the worker's phase times, the
`workbench:step_*` counters and `overhead_account`. Measured times are only checked for
relations (non-negative, parts within the step); exact numbers come from injected rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.core.outputs import ModelRunnerOutput, WorkerPhaseTimes
from workbench.metrics import registry as metric_registry
from workbench.metrics.stats import EngineStats, StepRecord
from workbench.metrics.step_account import (
    OVERHEAD_SHARE,
    STEP_PHASES,
    STEP_TIME,
    overhead_account,
    phase_counter,
)
from workbench.metrics.step_account import step_account as _step_account
from workbench.worker import phase_clock
from workbench.worker.phase_clock import PhaseClock

FIELDS = [p + "_s" for p in STEP_PHASES]
PROMPTS = [[11, 12, 13, 14, 15, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34, 35, 30, 31]]
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


def _generate(path: Path, **kwargs: Any) -> LLM:
    llm = LLM(path, dtype="float32", max_model_len=64, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=4, **kwargs)  # chunked prefill
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                 SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    return llm


@pytest.fixture(scope="module")
def plain(checkpoints: dict[str, Path]) -> LLM:
    return _generate(checkpoints["llama"])


@pytest.fixture(scope="module")
def speculative(checkpoints: dict[str, Path]) -> LLM:
    return _generate(checkpoints["llama"], speculative_config=NGRAM)


def _check_rows(rows: list[dict[str, Any]]) -> None:
    assert rows
    for r in rows:
        assert all(isinstance(r[f], float) and r[f] >= 0.0 for f in FIELDS), r
        parts = sum(r[f] for f in FIELDS if f != "other_s")
        assert parts <= r["duration_s"] + 1e-12  # float rounding of disjoint intervals
        assert sum(r[f] for f in FIELDS) == pytest.approx(r["duration_s"], rel=1e-9)
        if r["prefill_tokens"] + r["decode_tokens"]:
            assert r["forward_s"] > 0.0


def test_every_step_row_carries_the_account(plain: LLM) -> None:
    rows = plain.step_trace()
    _check_rows(rows)
    assert all(r["spec_propose_s"] == 0.0 for r in rows)


def test_spec_proposal_is_timed_only_with_speculation(speculative: LLM) -> None:
    rows = speculative.step_trace()
    _check_rows(rows)
    assert all(r["spec_propose_s"] > 0.0 for r in rows
               if r["prefill_tokens"] + r["decode_tokens"])
    assert speculative.stats()[phase_counter("spec_propose")] > 0.0


def test_stats_sum_the_phases(plain: LLM) -> None:
    stats, rows = plain.stats(), plain.step_trace()
    names = [STEP_TIME, OVERHEAD_SHARE] + [phase_counter(p) for p in STEP_PHASES]
    assert all(n in stats and metric_registry.get(n).source == "engine" for n in names)
    assert stats[STEP_TIME] == pytest.approx(sum(r["duration_s"] for r in rows), rel=1e-9)
    for p in STEP_PHASES:
        assert stats[phase_counter(p)] == pytest.approx(sum(r[p + "_s"] for r in rows),
                                                        rel=1e-9)
    assert stats[OVERHEAD_SHARE] == pytest.approx(overhead_account(rows)["overhead_share"])
    assert 0.0 < stats[OVERHEAD_SHARE] < 1.0


def _row(i: int, duration: float, phases: tuple[float, ...]) -> StepRecord:
    """A row whose phase fields are `phases`, in STEP_PHASES order."""
    row = StepRecord(step=i, wall_time_s=float(i), duration_s=duration, prefill_tokens=0,
                     decode_tokens=4, running=4, waiting=0, kv_cache_usage_perc=0.5,
                     preemptions=0)
    for field, seconds in zip(FIELDS, phases, strict=True):
        setattr(row, field, seconds)
    return row


# schedule, prepare_inputs, forward, sample, update, spec_propose, other
ROWS = [
    _row(0, 0.5, (0.0625, 0.03125, 0.25, 0.0625, 0.0625, 0.0, 0.03125)),
    _row(1, 1.5, (0.125, 0.125, 0.75, 0.25, 0.125, 0.0625, 0.0625)),
]


def test_overhead_account_of_hand_made_rows() -> None:
    acc = overhead_account([r.as_dict() for r in ROWS] + [{"duration_s": 9.0}])  # no account
    assert acc == {
        "num_steps": 2, "step_ms": 1000.0,
        "schedule_ms": 93.75, "prepare_inputs_ms": 78.125, "forward_ms": 500.0,
        "sample_ms": 156.25, "update_ms": 93.75, "spec_propose_ms": 31.25, "other_ms": 46.875,
        "schedule_share": 0.09375, "prepare_inputs_share": 0.078125, "forward_share": 0.5,
        "sample_share": 0.15625, "update_share": 0.09375, "spec_propose_share": 0.03125,
        "other_share": 0.046875, "overhead_share": 0.5,
    }
    assert overhead_account(ROWS) == acc  # StepRecords too
    empty = overhead_account([])
    assert empty["num_steps"] == 0 and empty["overhead_share"] == 0.0 == empty["step_ms"]


def test_engine_stats_counters_and_share_from_injected_rows() -> None:
    s = EngineStats()
    s.record_step(ROWS[0])
    assert s.gauges[OVERHEAD_SHARE] == 0.5  # (0.5 - 0.25) / 0.5
    s.record_step(ROWS[1])
    c = s.counters
    assert c[STEP_TIME] == 2.0 and c[phase_counter("forward")] == 1.0
    assert c[phase_counter("schedule")] == 0.1875 and c[phase_counter("other")] == 0.09375
    assert c[phase_counter("spec_propose")] == 0.0625
    assert s.snapshot()[OVERHEAD_SHARE] == 0.5


def test_step_account_from_boundaries_and_worker_times() -> None:
    out = ModelRunnerOutput(phase_times=WorkerPhaseTimes(
        prepare_inputs_s=0.125, forward_s=0.5, sample_s=0.25, spec_propose_s=0.0625))
    acc = _step_account(10.0, 10.0625, 11.0, 11.125, out)
    assert acc == {"schedule_s": 0.0625, "prepare_inputs_s": 0.125, "forward_s": 0.5,
                   "sample_s": 0.25, "update_s": 0.125, "spec_propose_s": 0.0625,
                   "other_s": 0.0}
    # a failed forward with nobody to blame: everything past schedule is "other"
    acc = _step_account(0.0, 0.25, 0.75, 1.0, None)
    assert (acc["schedule_s"], acc["forward_s"], acc["update_s"], acc["other_s"]) == (
        0.25, 0.0, 0.25, 0.5)


def test_merged_outputs_add_their_phase_times() -> None:
    a = ModelRunnerOutput(phase_times=WorkerPhaseTimes(0.25, 0.5, 0.125, 0.0))
    a.merge(ModelRunnerOutput(phase_times=WorkerPhaseTimes(0.25, 0.25, 0.125, 0.5)))
    assert a.phase_times == WorkerPhaseTimes(0.5, 0.75, 0.25, 0.5)


def test_phase_clock_synchronizes_only_cuda_and_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(phase_clock.SYNC_ENV, "1")
    assert phase_clock.sync_step_timing()
    assert not PhaseClock(torch.device("cpu")).sync  # nothing to wait for on CPU
    monkeypatch.setenv(phase_clock.SYNC_ENV, "0")
    assert not phase_clock.sync_step_timing()
    clock = PhaseClock(torch.device("cpu"))
    first, second = clock.lap(), clock.lap()
    assert first >= 0.0 and second >= 0.0
