"""BurstGPT (github.com/HPMLL/BurstGPT, release v1.1: BurstGPT_1.csv ...): a CSV with the
columns Timestamp (seconds), Model ("ChatGPT" | "GPT-4"), Request tokens, Response tokens,
Total tokens and Log Type ("Conversation log" | "API log"). Rows whose Response tokens are 0
are the trace's failed requests (dropped as "no_output"). Options `model` and `log_type`
keep only the rows with that Model / Log Type (others are skipped, not counted as drops).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from workbench.harness.traces.csv_rows import count, in_order, read_csv, seconds
from workbench.harness.traces.options import TraceOptions, TraceRow

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
           "Log Type")


def rows(path: Path, opts: TraceOptions) -> list[TraceRow]:
    """Every row checked, in file order (`model` / `log_type` filters applied)."""
    return list(_rows(path, opts))


def _rows(path: Path, opts: TraceOptions) -> Iterator[TraceRow]:
    last: float | None = None
    origin: list[datetime] = []
    for i, (where, row) in enumerate(read_csv(path, COLUMNS, "BurstGPT")):
        t = seconds(path, where, "Timestamp", row["Timestamp"], origin)
        in_order(path, where, "Timestamp", t, last)
        last = t
        n_in = count(path, where, "Request tokens", row["Request tokens"])
        n_out = count(path, where, "Response tokens", row["Response tokens"])
        if (opts.model is None or row["Model"] == opts.model) and \
                (opts.log_type is None or row["Log Type"] == opts.log_type):
            yield TraceRow(index=i, where=where, timestamp_s=t, input_len=n_in,
                           output_len=n_out)
