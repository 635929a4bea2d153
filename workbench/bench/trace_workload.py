"""`workbench bench --workload trace:FORMAT:PATH`: a trace file from the field as the bench's
workload, replayed as a template replays `workload: {trace: PATH, format: FORMAT, params}`.

    workbench bench --target inprocess --model bundled \\
        --workload trace:mooncake:workbench/assets/traces/mooncake_sample.jsonl \\
        --num-requests 16 --param rate_scale=4 --param max_model_len=1024 [--arrivals trace]

    FORMAT        sharegpt | burstgpt | azure | mooncake (`harness.traces.FORMATS`)
    PATH          the file (everything after the second colon, so it may hold colons)
    --param K=V   the trace options (`harness.traces.options`: rate_scale, start_s,
                  duration_s, max_model_len, ...; each format's own), checked by name
    --num-requests N   the trace option max_requests
    --seed S      the synthesized prompt tokens (sharegpt: its shuffle)
    --arrivals    `trace` replays the recorded timestamps (divided by rate_scale); poisson:R,
                  gamma:R:S, constant:R or closed:C re-sample the arrivals over the trace's
                  lengths and prefixes. Default: `trace` for a trace that records times,
                  closed:4 for one that does not (sharegpt) and for fixtures and JSONL files.

Bad input is one `UserError` line naming the flag, its value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import UserError, did_you_mean
from workbench.harness.traces import FORMATS, load_trace
from workbench.harness.traces.options import TraceOptions
from workbench.harness.workload_base import Workload

PREFIX = "trace:"
SPELLING = f"trace:FORMAT:PATH with FORMAT one of {', '.join(FORMATS)}"
DEFAULT_ARRIVALS = "closed:4"  # a workload without recorded times


def is_trace(text: str) -> bool:
    """Whether a --workload value names a trace (`trace:...`)."""
    return text.startswith(PREFIX)


def parse_trace_ref(text: str) -> tuple[str, str]:
    """`trace:FORMAT:PATH` -> (format, path); a bad spelling or format is a UserError."""
    fmt, sep, path = text[len(PREFIX):].partition(":")
    if not sep or not fmt or not path:
        raise UserError(f"--workload ({text!r}) must be {SPELLING}")
    if fmt not in FORMATS:
        raise UserError(f"--workload ({text!r}): the trace format ({fmt!r}) must be one of "
                        f"{', '.join(FORMATS)}{did_you_mean(fmt, FORMATS)}")
    return fmt, path


def trace_workload(text: str, tokenizer: Any | None, seed: int, params: dict[str, Any],
                   num_requests: int | None = None) -> Workload:
    """The workload of `--workload trace:FORMAT:PATH` with the `--param` options `params`
    (`--num-requests` as max_requests). The file's own errors keep their one line (file,
    line, field, value, what is allowed)."""
    fmt, path = parse_trace_ref(text)
    if not Path(path).is_file():
        raise UserError(f"--workload ({text!r}): the trace file ({path!r}) is not a file")
    opts = dict(params)
    if num_requests is not None:
        if num_requests < 1:
            raise UserError(f"--num-requests ({num_requests}) must be an integer >= 1 (a "
                            "trace's max_requests)")
        opts["max_requests"] = num_requests
    try:
        TraceOptions.from_params(fmt, opts)
    except UserError as e:
        raise UserError(f"--param: {e}") from None
    return load_trace(fmt, path, tokenizer=tokenizer, seed=seed, **opts)


def timeless(workload: Workload) -> int:
    """How many requests have no recorded time (a follow-up turn needs none)."""
    return sum(1 for r in workload.requests if r.arrival_s is None and r.follows is None)


def default_arrivals(workload: Workload) -> str:
    """`trace` when every request records its time, else DEFAULT_ARRIVALS."""
    if workload.requests and not timeless(workload):
        return "trace"
    return DEFAULT_ARRIVALS


def check_trace_arrivals(arrivals: str, workload: Workload) -> None:
    """`--arrivals trace` needs every request that follows none to have arrival_s."""
    if arrivals != "trace":
        return
    n = timeless(workload)
    if n:
        what = ("a ShareGPT trace records no times" if workload.params.get("format") ==
                "sharegpt" else "only traces and JSONL files with arrival_s record times")
        raise UserError(f"--arrivals ('trace') replays the workload's recorded times, but {n} "
                        f"of its {len(workload.requests)} requests have none ({what}); choose "
                        "poisson:RATE, gamma:RATE:SHAPE, constant:RATE or closed:C")
