"""Parsed trace records -> a harness `Workload`: the time window, the drops (counted), the
rate scale and the prompt token ids.

    window     records before first timestamp + start_s are skipped, those at or after
               start + duration_s end the read (a trace is sorted by time)
    drops      output_len 0 (BurstGPT's failed requests) -> "no_output"; input_len 0 ->
               "empty_prompt"; input + output > max_model_len -> "over_max_model_len";
               a format's own (sharegpt: "too_short", "too_long") come counted from its reader
    arrival_s  (timestamp - window start) / rate_scale; None for a format without time
    ids        the record's own tokens (sharegpt) or synthesized (`prompts.PromptIds`)

`Workload.params` records the format, file, sha256, every option and the counts
(`records_read`, `dropped`), so the workload's summary says what was left out and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from workbench.errors import UserError
from workbench.harness.traces.options import TraceOptions, TraceRow
from workbench.harness.traces.prompts import PromptIds
from workbench.harness.workload_base import BenchRequest, Workload


def select(rows: Iterable[TraceRow], opts: TraceOptions, dropped: Counter[str]
           ) -> tuple[list[TraceRow], float | None, int]:
    """(the kept records, the window start in trace seconds or None, records read)."""
    kept: list[TraceRow] = []
    start: float | None = None
    end: float | None = None
    read = 0
    for row in rows:
        read += 1
        t = row.timestamp_s
        if t is not None:
            if start is None:
                start = t + opts.start_s
                end = None if opts.duration_s is None else start + opts.duration_s
            if t < start:
                continue
            if end is not None and t >= end:
                break
        if row.output_len < 1:
            dropped["no_output"] += 1
        elif row.input_len < 1:
            dropped["empty_prompt"] += 1
        elif opts.max_model_len is not None and \
                row.input_len + row.output_len > opts.max_model_len:
            dropped["over_max_model_len"] += 1
        else:
            kept.append(row)
            if opts.max_requests is not None and len(kept) >= opts.max_requests:
                break
    return kept, start, read


def build_workload(fmt: str, rows: Iterable[TraceRow], opts: TraceOptions, *, name: str,
                   seed: int, tokenizer: Any | None, source: dict[str, Any],
                   dropped: Counter[str] | None = None) -> Workload:
    """The workload of `rows` under `opts`; `source` (path, file_sha256) goes into params."""
    dropped = Counter() if dropped is None else dropped  # the reader's drops, counted as read
    own: Counter[str] = Counter()
    kept, start, read = select(rows, opts, own)
    read += sum(dropped.values())
    dropped.update(own)
    counts = {k: dropped[k] for k in sorted(dropped) if dropped[k]}
    if not kept:
        raise UserError(f"{source['path']}: no request left to replay ({read} records read, "
                        f"dropped: {counts or 'none'}); widen the window (start_s, "
                        "duration_s) or raise max_model_len")
    ids = PromptIds(seed, tokenizer, opts.vocab_size, opts.block_size)
    reqs = []
    for i, row in enumerate(kept):
        if row.prompt_token_ids is not None:
            prompt_ids, text = list(row.prompt_token_ids), row.prompt
        else:
            prompt_ids = ids.prompt(row.index, row.input_len, row.hash_ids)
            text = ids.decode(prompt_ids)
        arrival = None if row.timestamp_s is None or start is None else \
            (row.timestamp_s - start) / opts.rate_scale
        reqs.append(BenchRequest(request_id=f"{name}-{i:05d}", prompt_token_ids=prompt_ids,
                                 max_tokens=row.output_len, prompt=text, arrival_s=arrival,
                                 group=row.group))
    params = {"source": "trace", "format": fmt, **source, **opts.to_dict(fmt),
              "records_read": read, "dropped": counts}
    return Workload(name=name, seed=seed, params=params, requests=tuple(reqs))
