"""harness.watched: a micro-timing judged by the same CPU watch and threshold as a run, and
the study / loop tables that carry its verdict (exact shares from a FixedCpuWatch)."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from workbench.experiments.studies.quant_readout import QuantComparison
from workbench.harness.validity import FixedCpuWatch
from workbench.harness.watched import watched


def test_a_quiet_measurement_is_valid_and_keeps_its_value() -> None:
    value, v = watched(lambda: {1: 12.5}, "layer timing of full", FixedCpuWatch(0.1), 0.25)
    assert value == {1: 12.5}
    assert (v.valid, v.other_cpu_share, v.max_other_cpu_share, v.reasons) == (
        True, 0.1, 0.25, [])


def test_a_disturbed_measurement_is_kept_marked_invalid_and_named(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="workbench.harness.watched"):
        value, v = watched(lambda: 7, "all-reduce timing (world_size 2)", FixedCpuWatch(0.6),
                           0.25)
    assert value == 7 and not v.valid and v.other_cpu_share == 0.6
    assert v.reasons == ["other processes used 60% of the CPUs during the run (threshold 25%):"
                         " its timings are disturbed; rerun on a quieter machine"]
    assert caplog.messages == ["INVALID all-reduce timing (world_size 2): other processes "
                               "used 60% of the CPUs (threshold 25%); not used for any result"]


def test_no_threshold_records_the_share_without_judging() -> None:
    _, v = watched(lambda: None, "x", FixedCpuWatch(0.9), None)
    assert v.valid and v.other_cpu_share == 0.9 and v.max_other_cpu_share is None


def test_the_layer_table_carries_each_variants_cpu_verdict() -> None:
    layer = pd.DataFrame([
        {"variant": "full", "tokens": 1, "us_per_forward": 10.0, "other_cpu_share": 0.05,
         "valid": True},
        {"variant": "full", "tokens": 32, "us_per_forward": 40.0, "other_cpu_share": 0.05,
         "valid": True},
        {"variant": "int8", "tokens": 1, "us_per_forward": 30.0, "other_cpu_share": 0.5,
         "valid": False},
        {"variant": "int8", "tokens": 32, "us_per_forward": 60.0, "other_cpu_share": 0.5,
         "valid": False},
    ])
    empty = pd.DataFrame()
    table = QuantComparison(empty, empty, empty, layer).layer_table()
    assert list(table.index) == ["full", "int8"]
    assert list(table["us at 1 tokens"]) == [10.0, 30.0]
    assert list(table["x full at 32 tokens"]) == [1.0, 1.5]
    assert list(table["other_cpu_share"]) == [0.05, 0.5]
    assert list(table["valid"]) == [True, False]
