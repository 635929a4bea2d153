"""`load_trace`: a trace file in one of the four formats -> a harness `Workload`.

    load_trace("mooncake", "trace.jsonl", tokenizer=None, seed=0, rate_scale=2.0,
               max_requests=100)

The whole file is checked first (a bad record raises one `UserError` naming the file, the
line, the field, the value and what is allowed), then the window, drops and prompts are
built (`build.py`). Same (format, file, seed, params, tokenizer) -> same checksum.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench.errors import UserError, did_you_mean, is_int
from workbench.harness.traces import azure, burstgpt, mooncake, sharegpt
from workbench.harness.traces.build import build_workload
from workbench.harness.traces.options import COMMON, EXTRA, TraceOptions, TraceRow
from workbench.harness.workload_base import Workload

FORMATS = ("sharegpt", "burstgpt", "azure", "mooncake")


def trace_params(fmt: str) -> tuple[str, ...]:
    """The params format `fmt` accepts, sorted (what template validation checks)."""
    check_format(fmt)
    return tuple(sorted(COMMON + EXTRA[fmt]))


def check_format(fmt: Any) -> str:
    if fmt not in FORMATS:
        raise UserError(f"trace format ({fmt!r}) must be one of {', '.join(FORMATS)}"
                        f"{did_you_mean(fmt, FORMATS)}")
    return str(fmt)


def load_trace(fmt: str, path: str | Path, tokenizer: Any | None = None, seed: int = 0,
               name: str | None = None, **params: Any) -> Workload:
    """The workload of trace file `path` in format `fmt` (FORMATS) with options `params`
    (`options.TraceOptions`). A tokenizer makes the synthesized prompts readable text and
    is required for sharegpt."""
    fmt = check_format(fmt)
    if not is_int(seed):
        raise UserError(f"seed ({seed!r}) must be an integer")
    opts = TraceOptions.from_params(fmt, params)
    path = Path(path)
    if not path.is_file():
        raise UserError(f"trace file ({str(path)!r}) is not a file")
    dropped: Counter[str] = Counter()
    rows: Iterable[TraceRow]
    if fmt == "sharegpt":
        rows = sharegpt.rows(path, opts, tokenizer, seed, dropped)
    else:
        rows = {"burstgpt": burstgpt.rows, "azure": azure.rows,
                "mooncake": mooncake.rows}[fmt](path, opts)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return build_workload(fmt, rows, opts, name=name or path.stem, seed=seed,
                          tokenizer=tokenizer, dropped=dropped,
                          source={"path": str(path), "file_sha256": digest})



def trace_spec_problems(spec: dict[str, Any]) -> list[str]:
    """What is wrong with a template's trace workload (`{trace: PATH, format: NAME, seed,
    name, params: {...}}`) before it is read; [] when nothing is."""
    out: list[str] = []
    fmt, params = spec.get("format"), spec.get("params") or {}
    if fmt not in FORMATS:
        out.append(f"workload.format ({fmt!r}) must be one of {', '.join(FORMATS)}"
                   f"{did_you_mean(fmt, FORMATS)} (the trace file's format)")
    if not Path(str(spec.get("trace"))).is_file():
        out.append(f"workload.trace ({str(spec.get('trace'))!r}) is not a file")
    if not isinstance(params, dict):
        out.append(f"workload.params must be a mapping of trace options, not {params!r}")
    elif fmt in FORMATS:
        try:
            TraceOptions.from_params(str(fmt), params)
        except UserError as e:
            out.append(f"workload.params: {e}")
    return out


def load_trace_spec(spec: dict[str, Any], tokenizer: Any | None) -> Workload:
    """The workload of a template's trace spec (see `trace_spec_problems`)."""
    return load_trace(spec["format"], spec["trace"], tokenizer=tokenizer,
                      seed=spec.get("seed", 0), name=spec.get("name"),
                      **(spec.get("params") or {}))
