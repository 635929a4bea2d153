"""The Azure LLM inference traces (github.com/Azure/AzurePublicDataset: 2023's
AzureLLMInferenceTrace_code.csv / _conv.csv, 2024's *_1week.csv): a CSV with the columns
TIMESTAMP (a date-time such as "2023-11-16 18:15:46.6805900"), ContextTokens and
GeneratedTokens. Timestamps become seconds; only their differences matter.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from workbench.harness.traces.csv_rows import count, in_order, read_csv, seconds
from workbench.harness.traces.options import TraceOptions, TraceRow

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def rows(path: Path, opts: TraceOptions) -> list[TraceRow]:
    """Every row checked, in file order."""
    out: list[TraceRow] = []
    last: float | None = None
    origin: list[datetime] = []
    for i, (where, row) in enumerate(read_csv(path, COLUMNS, "Azure LLM inference")):
        t = seconds(path, where, "TIMESTAMP", row["TIMESTAMP"], origin)
        in_order(path, where, "TIMESTAMP", t, last)
        last = t
        out.append(TraceRow(index=i, where=where, timestamp_s=t,
                            input_len=count(path, where, "ContextTokens", row["ContextTokens"]),
                            output_len=count(path, where, "GeneratedTokens",
                                             row["GeneratedTokens"])))
    return out
