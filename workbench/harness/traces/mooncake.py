"""Mooncake-style JSONL traces (github.com/kvcache-ai/Mooncake, FAST25-release/traces; also
what NVIDIA's aiperf and Dynamo replay): one object per line,

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

timestamp in milliseconds, hash_ids the ids of the prompt's block_size-token prefix blocks
(512 in the released traces): two requests naming the same id share that block's tokens, and
the prompt is its blocks in order (the last one may be partial), then tokens of its own for
what the ids do not cover. hash_ids may not name more blocks than input_length needs.
Other keys on a line are ignored (aiperf's session_id, ...).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from workbench.errors import is_int, is_real
from workbench.harness.traces.options import TraceOptions, TraceRow, bad_input

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def rows(path: Path, opts: TraceOptions) -> list[TraceRow]:
    """Every line checked, in file order."""
    out: list[TraceRow] = []
    last: float | None = None
    text = path.read_text(encoding="utf-8")
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as e:
            raise bad_input(path, where, "line", line[:80], f"is not valid JSON ({e.msg})"
                            ) from None
        if not isinstance(obj, dict):
            raise bad_input(path, where, "line", obj, "must be a JSON object with "
                            f"{', '.join(FIELDS)}")
        out.append(_row(path, where, len(out), obj, opts.block_size, last))
        last = out[-1].timestamp_s
    return out


def _row(path: Path, where: str, index: int, obj: dict[str, Any], block_size: int,
         last: float | None) -> TraceRow:
    def field(key: str) -> Any:
        if key not in obj:
            raise bad_input(path, where, key, None, "is missing; a Mooncake line has "
                            "timestamp, input_length, output_length and hash_ids")
        return obj[key]

    ts = field("timestamp")
    if not is_real(ts) or not 0 <= ts < math.inf:
        raise bad_input(path, where, "timestamp", ts, "must be milliseconds (a number >= 0)")
    t = ts / 1000.0
    if last is not None and t < last:
        raise bad_input(path, where, "timestamp", ts, f"is before the previous line's "
                        f"({last * 1000:g}); sort the file by timestamp")
    n_in, n_out = field("input_length"), field("output_length")
    for key, v in (("input_length", n_in), ("output_length", n_out)):
        if not is_int(v) or v < 0:
            raise bad_input(path, where, key, v, "must be a token count (an integer >= 0)")
    hashes = obj.get("hash_ids", [])
    if not isinstance(hashes, list) or not all(is_int(h) and h >= 0 for h in hashes):
        raise bad_input(path, where, "hash_ids", hashes, "must be a list of block ids "
                        "(integers >= 0)")
    need = -(-n_in // block_size)
    if len(hashes) > need:
        raise bad_input(path, where, "hash_ids", f"{len(hashes)} ids", f"name more blocks "
                        f"than input_length {n_in} needs at block_size {block_size} ({need}); "
                        "set block_size to the trace's block size")
    return TraceRow(index=index, where=where, timestamp_s=t, input_len=n_in, output_len=n_out,
                    hash_ids=tuple(hashes),
                    group=f"prefix-{hashes[0]}" if hashes else None)
