"""The serving calibration's step rule (workbench/sim/calibrate_serving.py): a step's time is
its start-to-next-start interval when the engine went straight on, else its duration plus
the median short gap; preempted and empty rows are left out. Exact numbers, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.sim.batch import BatchComposition
from workbench.sim.calibrate_serving import composition_of, step_samples


def row(end: float, dur: float, prefill: int = 0, decode: int = 1, preempt: int = 0
        ) -> dict[str, Any]:
    return {"wall_time_s": end, "duration_s": dur, "prefill_tokens": prefill,
            "prefill_attn_pairs": prefill * (prefill + 1) // 2, "decode_tokens": decode,
            "decode_context_tokens": 10 * decode, "num_seqs": decode + (1 if prefill else 0),
            "sampled_rows": decode + (1 if prefill else 0), "preemptions": preempt,
            "prefill_seqs": 1 if prefill else 0,
            "spec_draft_tokens": 0}


def test_composition_of_a_trace_row() -> None:
    assert composition_of(row(1.0, 0.1, prefill=4, decode=2)) == BatchComposition(
        prefill_tokens=4, prefill_attn_pairs=10, decode_tokens=2, decode_context_tokens=20,
        num_seqs=3, sampled_rows=3, draft_tokens=0, prefill_seqs=1)


def test_intervals_gaps_and_idle_steps() -> None:
    # steps start at 0, 0.0105, 0.0215 (gaps 0.5 ms, 1.0 ms: back to back), then the engine
    # idles 50 ms; a preempted step, 1.0 ms, an empty one, idle, the last step (no next one)
    rows = [row(0.010, 0.010), row(0.0205, 0.010), row(0.0315, 0.010),
            row(0.0915, 0.010, preempt=1), row(0.1025, 0.010, decode=0), row(0.2, 0.004)]
    out = step_samples(rows)
    assert out.idle_gap_s == pytest.approx(0.001)  # median of 0.5, 1.0, 1.0 ms (<= 2 ms)
    assert out.skipped_preempted == 1 and out.skipped_empty == 1
    seconds = [s for _, s in out.samples]
    assert seconds == pytest.approx([0.0105, 0.0110, 0.010 + 0.001, 0.004 + 0.001])


def test_no_short_gap_adds_nothing() -> None:
    out = step_samples([row(0.01, 0.01), row(0.5, 0.01)])
    assert out.idle_gap_s == 0.0
    assert [s for _, s in out.samples] == pytest.approx([0.01, 0.01])
