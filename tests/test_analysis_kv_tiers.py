"""workbench.analysis.kv_tiers's tables and figure from fixture frames (no engine; notebook
11's test in test_notebooks_variants.py measures for real): medians over repeats, configs in
the order measured, turns in order, flat metric names, unit labels, no figure from nothing;
the study's host-tier config."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from workbench.analysis import by_turn, tier_table, turn_table
from workbench.analysis.kv_tiers import TIER_COLUMNS, tier_metrics
from workbench.experiments.studies.kv_tiers import host_tier

# A plotting warning fails the test; a ResourceWarning is another test's socket or file being
# collected meanwhile (seen in the suite: a client socket of an earlier test in the worker).
pytestmark = [pytest.mark.filterwarnings("error"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


def runs_frame() -> pd.DataFrame:
    rows = []
    for repeat, (off_p95, on_p95) in enumerate([(500.0, 300.0), (700.0, 200.0), (600.0, 400.0)]):
        for config, p95, ext in (("off", off_p95, 0.0), ("host tier", on_p95, 0.4 + repeat / 10)):
            rows.append({"config": config, "repeat": repeat, "valid": repeat != 1,
                         **dict.fromkeys(TIER_COLUMNS, 1.0), "p95_ttft_ms": p95,
                         "external_prefix_cache_hit_rate": ext})
    return pd.DataFrame(rows)


def requests_frame() -> pd.DataFrame:
    rows = []
    for config in ("off", "host tier"):
        for turn in (1, 0):  # a later turn first: the table sorts turns
            for i, ttft in enumerate((10.0, 20.0, 90.0)):
                ext = 0 if config == "off" or turn == 0 else 16 * (i + 1)
                rows.append({"config": config, "repeat": 0, "turn": turn,
                             "success": not (config == "off" and turn == 1 and i == 2),
                             "prompt_tokens": 100 + 50 * turn, "ttft_ms": ttft + turn,
                             "cached_tokens": 32 + ext, "kv_loaded": ext > 16})
    return pd.DataFrame(rows)


def test_host_tier_config() -> None:
    assert host_tier(1 << 28) == {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 268435456}}


def test_tier_table_takes_medians_over_repeats_in_measured_order() -> None:
    table = tier_table(runs_frame())
    assert list(table["config"]) == ["off", "host tier"]
    assert list(table["repeats"]) == [3, 3] and list(table["valid_repeats"]) == [2, 2]
    assert list(table["p95_ttft_ms"]) == [600.0, 300.0]
    assert table.loc[1, "external_prefix_cache_hit_rate"] == pytest.approx(0.5)
    assert list(table.columns) == ["config", "repeats", "valid_repeats", *TIER_COLUMNS]


def test_turn_table_counts_successful_requests_per_turn() -> None:
    turns = turn_table(requests_frame())
    assert list(zip(turns["config"], turns["turn"], strict=True)) == [
        ("off", 0), ("off", 1), ("host tier", 0), ("host tier", 1)]
    assert list(turns["requests"]) == [3, 2, 3, 3]  # off's failed turn-1 request left out
    assert list(turns["median_ttft_ms"]) == [20.0, 16.0, 20.0, 21.0]
    assert list(turns["loaded_share"]) == [0.0, 0.0, 0.0, 2 / 3]
    assert list(turns["cached_tokens"]) == [32.0, 32.0, 32.0, 64.0]


def test_tier_metrics_are_flat_names_per_config() -> None:
    metrics = tier_metrics(tier_table(runs_frame()), turn_table(requests_frame()))
    assert metrics["host_tier.p95_ttft_ms"] == 300.0
    assert metrics["off.turn1.median_ttft_ms"] == 16.0
    assert len(metrics) == 2 * len(TIER_COLUMNS) + 4


def test_by_turn_draws_one_bar_per_config_and_turn(tmp_path: Path) -> None:
    from workbench.analysis import save

    fig = by_turn(requests_frame(), "ttft_ms", title="median TTFT by turn")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "turn" and ax.get_ylabel() == "ttft_ms (ms)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["off", "host tier"]
    assert sorted(p.get_height() for p in ax.patches if p.get_height() > 0) == [
        16.0, 20.0, 20.0, 21.0]
    assert save(fig, tmp_path / "ttft.png").stat().st_size > 1000
    reuse = by_turn(requests_frame(), "cached_tokens")
    assert reuse.axes[0].get_ylabel() == "reused prompt (tokens)"
    nothing = requests_frame().assign(success=False)
    assert by_turn(nothing) is None
