"""A trace CSV read row by row, each cell checked: the shared part of the BurstGPT and Azure
readers. Rows are numbered by their line in the file (the header is line 1)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from workbench.errors import UserError
from workbench.harness.traces.options import bad_input


def read_csv(path: Path, columns: tuple[str, ...], what: str
             ) -> Iterator[tuple[str, dict[str, str]]]:
    """("line N", {column: cell}) for every data row; the header must name `columns`."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise UserError(f"{path}: empty file; a {what} CSV starts with the header "
                            f"{','.join(columns)}")
        header = [h.strip() for h in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise UserError(f"{path}, line 1: the header ({','.join(header)}) lacks "
                            f"{', '.join(missing)}; a {what} CSV has the columns "
                            f"{','.join(columns)}")
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue
            where = f"line {reader.line_num}"
            if len(cells) != len(header):
                raise bad_input(path, where, "row", ",".join(cells),
                                f"has {len(cells)} cells; the header has {len(header)}")
            yield where, {h: c.strip() for h, c in zip(header, cells, strict=True)}


def count(path: Path, where: str, column: str, cell: str) -> int:
    """A token count cell: an integer >= 0 ("472", also "472.0")."""
    try:
        v = float(cell)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0 and v == int(v)):
        raise bad_input(path, where, column, cell, "must be a token count (an integer >= 0)")
    return int(v)


def seconds(path: Path, where: str, column: str, cell: str,
            origin: list[datetime]) -> float:
    """A time cell in seconds: a number (>= 0), or a date-time ("2023-11-16 18:15:46.6805900",
    UTC unless it names a zone) as seconds after the file's first date-time (`origin`, set by
    the first one read), exact to the microsecond."""
    try:
        v = float(cell)
    except ValueError:
        try:
            dt = datetime.fromisoformat(cell)
            dt = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
            if not origin:
                origin.append(dt)
            v = (dt - origin[0]).total_seconds()
        except ValueError:
            v = math.nan
    if not math.isfinite(v) or v < 0:
        raise bad_input(path, where, column, cell, "must be a time: seconds (a number >= 0) "
                        "or a date-time such as 2023-11-16 18:15:46.680590, not before the "
                        "file's first")
    return v


def in_order(path: Path, where: str, column: str, t: float, last: float | None) -> None:
    """A trace is sorted by time: refuse a row earlier than the one before it."""
    if last is not None and t < last:
        raise bad_input(path, where, column, t, f"is before the previous row's ({last}); sort "
                        f"the file by {column}")
