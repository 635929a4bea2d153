"""The KV compression frontier (issue 34, "What a researcher sees"): per (method, budget), the
KV memory a request holds, the capacity and speed at one fixed KV budget, and the needle
accuracy by depth and length; one tidy table.

    from workbench.experiments.kv_frontier import FrontierSpec, run_frontier
    res = run_frontier(FrontierSpec(model="needle", budgets=(64, 128, 256)))
    res.table                      # one row per point (columns below)
    res.needle                     # long: point, context_tokens, depth, cases, accuracy
    print(res.markdown())
    res.write(".bench/kv_frontier")   # frontier.csv, needle.csv, frontier.md, frontier.json

    python scripts/kv_compression_frontier.py --model needle --budgets 64 128 256

Points (`frontier_points`): "none" (full KV), every eviction method x `budget_tokens`
(`kv_compression_config`, "streaming_llm/64"), every KV dtype at full length
(`kv_cache_dtype` fp8 / int8 / int4 / int2, "int4"). Each point runs on two engines with the
same knobs (`spec.engine` + the point's):

1. an `LLM` with the default, demand-sized KV pool (prefix caching off, so no case reuses
   another's KV): the first `footprint_requests` workload prompts, greedy with ignore_eos,
   give the engine's per-request KV footprint at the end (`RequestMetrics.num_kept_kv_tokens`,
   `num_evicted_blocks`), then the needle grid (`experiments.needle.run_needle`) runs on it;
2. the in-process harness target with `kv_cache_memory_bytes` fixed: the workload closed-loop
   at `concurrency` (`loops.measure_in_process`: the harness's CPU-disturbance watch, its
   metrics), and that engine's memory readout (block bytes and the blocks the budget buys).

Columns (derived ones by `derive_row`, exactly):

    kv_bytes_per_token       the readout's pool bytes per token slot, all layers (codes, scales
                             and zero points for int8/4/2; KIVI's full-precision residual pool
                             is a fixed cost, not in it: see kv_residual_bytes)
    bytes_per_block          the readout's bytes per KV block, all layers
    context_tokens           tokens a workload request has seen when it finishes
                             (prompt + output - 1: the last sampled token is never written)
    kept_kv_tokens           the KV tokens it still holds then (the engine's num_kept_kv_tokens,
                             the most over the footprint requests; = context_tokens without
                             an eviction policy)
    evicted_blocks           blocks it evicted (the engine's num_evicted_blocks, the most)
    blocks_per_request       ceil(kept_kv_tokens / block_size): the blocks it holds at the end
                             (PyramidKV: the union of the layers' blocks, what the pool holds)
    kv_bytes_per_request     blocks_per_request x bytes_per_block
    effective_tokens_per_gb  context_tokens x 1e9 / kv_bytes_per_request: context served per
                             GB (10^9 bytes) of KV blocks
    num_blocks               usable blocks in the fixed budget (the readout; KIVI's residual
                             pool, max_num_seqs x (ceil(R / bs) + 2) blocks, taken off first)
    max_concurrency          num_blocks // blocks_per_request: requests of the workload's
                             length that fit in the budget once decoding (a prefill holds its
                             whole prompt until its next step, so admissions peak higher)
    mean_running             requests running per measured step, mean (the step trace)
    preemptions              the engine's vllm:num_preemptions over the measured run
    output_throughput        output tok/s of the measured run; median_tpot_ms its median TPOT
    other_cpu_share, valid   the harness's CPU watch: valid False = disturbed (other processes
                             held more than the threshold of the CPUs), timings unreliable
    needle_accuracy          passkey accuracy over the whole depth x length grid
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.config.kv_compression import KV_COMPRESSION_METHODS
from workbench.experiments.needle import NeedleReport, needle_cases, run_needle
from workbench.sampling_params import SamplingParams
from workbench.testing.needle_cases import DEFAULT_DEPTHS, DEFAULT_LENGTHS, NeedleCase

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from workbench.engine.llm import LLM
    from workbench.harness.replay import RunResult
    from workbench.harness.workloads import BenchRequest, Workload

KV_DTYPES = ("fp8", "int8", "int4", "int2")
GB = 10**9
DEFAULT_ENGINE: dict[str, Any] = {"dtype": "float32", "block_size": 16, "max_num_seqs": 16,
                                  "max_num_batched_tokens": 2048}
# knobs each point sets itself (or that would size the pool another way)
POINT_KNOBS = ("kv_compression_config", "kv_cache_dtype", "kv_cache_memory_bytes",
               "num_gpu_blocks_override", "cpu_memory_budget_bytes", "gpu_memory_utilization")
COLUMNS = (
    "point", "method", "budget_tokens", "kv_cache_dtype", "kv_bytes_per_token",
    "bytes_per_block", "block_size", "context_tokens", "kept_kv_tokens", "evicted_blocks",
    "blocks_per_request", "kv_bytes_per_request", "effective_tokens_per_gb",
    "kv_cache_memory_bytes", "num_blocks", "kv_residual_bytes", "max_concurrency",
    "mean_running", "preemptions", "output_throughput", "median_tpot_ms", "other_cpu_share",
    "valid", "needle_accuracy", "needle_cases",
)


@dataclass(frozen=True)
class FrontierPoint:
    """One point: the full KV ("none"), an eviction method at `budget_tokens`, or a KV dtype."""

    method: str = "none"  # "none" or one of KV_COMPRESSION_METHODS
    budget_tokens: int | None = None
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.method != "none" and self.method not in KV_COMPRESSION_METHODS:
            raise ValueError(f"FrontierPoint.method ({self.method!r}) must be 'none' or one of "
                             f"{', '.join(repr(m) for m in KV_COMPRESSION_METHODS)}")
        if (self.method == "none") != (self.budget_tokens is None):
            raise ValueError(f"FrontierPoint.budget_tokens ({self.budget_tokens!r}) must be set "
                             f"exactly when method is an eviction method (method "
                             f"{self.method!r})")
        if self.kv_cache_dtype not in ("auto", *KV_DTYPES):
            raise ValueError(f"FrontierPoint.kv_cache_dtype ({self.kv_cache_dtype!r}) must be "
                             f"'auto' or one of {', '.join(repr(d) for d in KV_DTYPES)}")

    @property
    def label(self) -> str:
        if self.method != "none":
            return f"{self.method}/{self.budget_tokens}"
        return "none" if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    def engine_kwargs(self) -> dict[str, Any]:
        """The knobs this point adds to the frontier's engine."""
        out: dict[str, Any] = {}
        if self.method != "none":
            out["kv_compression_config"] = {"method": self.method,
                                            "budget_tokens": self.budget_tokens}
        if self.kv_cache_dtype != "auto":
            out["kv_cache_dtype"] = self.kv_cache_dtype
        return out


def frontier_points(methods: Sequence[str] = KV_COMPRESSION_METHODS,
                    budgets: Sequence[int] = (64, 128, 256),
                    kv_dtypes: Sequence[str] = KV_DTYPES) -> list[FrontierPoint]:
    """"none", then each method at each budget (ascending), then each KV dtype."""
    return ([FrontierPoint()]
            + [FrontierPoint(m, b) for m in methods for b in sorted(budgets)]
            + [FrontierPoint(kv_cache_dtype=d) for d in kv_dtypes])


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"FrontierSpec.{name} ({value!r}) must be an integer >= 1")


@dataclass(frozen=True)
class FrontierSpec:
    """What one frontier measures: the model, the points, the fixed KV budget, the workload
    (fixed lengths, closed loop) and the needle grid. See the module docstring."""

    model: str = "needle"
    methods: tuple[str, ...] = KV_COMPRESSION_METHODS
    budgets: tuple[int, ...] = (64, 128, 256)
    kv_dtypes: tuple[str, ...] = KV_DTYPES
    engine: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_ENGINE))
    kv_cache_memory_bytes: int = 16 * 2**20  # the fixed KV budget (throughput, concurrency)
    input_len: int = 384
    output_len: int = 128
    num_requests: int = 32
    concurrency: int = 16
    footprint_requests: int = 2
    needle_lengths: tuple[int, ...] = DEFAULT_LENGTHS
    needle_depths: tuple[float, ...] = DEFAULT_DEPTHS
    needle_cases_per_cell: int = 2
    seed: int = 0
    cache_state: str = "warm-model"

    def __post_init__(self) -> None:
        for m in self.methods:
            if m not in KV_COMPRESSION_METHODS:
                raise ValueError(f"FrontierSpec.methods: {m!r} is not one of "
                                 f"{', '.join(repr(x) for x in KV_COMPRESSION_METHODS)}")
        for d in self.kv_dtypes:
            if d not in KV_DTYPES:
                raise ValueError(f"FrontierSpec.kv_dtypes: {d!r} is not one of "
                                 f"{', '.join(repr(x) for x in KV_DTYPES)}")
        if self.methods and not self.budgets:
            raise ValueError("FrontierSpec.budgets is empty; eviction methods need at least "
                             "one budget_tokens")
        for b in self.budgets:
            _positive("budgets", b)
        for name in ("kv_cache_memory_bytes", "input_len", "output_len", "num_requests",
                     "concurrency", "footprint_requests", "needle_cases_per_cell"):
            _positive(name, getattr(self, name))
        if self.footprint_requests > self.num_requests:
            raise ValueError(f"FrontierSpec.footprint_requests ({self.footprint_requests}) must "
                             f"be <= num_requests ({self.num_requests})")
        for n in self.needle_lengths:
            _positive("needle_lengths", n)
        for depth in self.needle_depths:
            if not 0 <= depth <= 1:
                raise ValueError(f"FrontierSpec.needle_depths: {depth!r} is not in [0, 1]")
        taken = sorted(set(self.engine) & set(POINT_KNOBS))
        if taken:
            raise ValueError(f"FrontierSpec.engine sets {taken[0]!r}, which the frontier sets "
                             "per point (or sizes the pool another way); leave it out")

    def points(self) -> list[FrontierPoint]:
        return frontier_points(self.methods, self.budgets, self.kv_dtypes)

    def max_model_len(self) -> int:
        """The engine's max_model_len: the engine knob, else what the longest input needs."""
        given = self.engine.get("max_model_len")
        if given is not None:
            return int(given)
        return max(self.input_len + self.output_len, *(n + 16 for n in self.needle_lengths))


# ------------------------------------------------------------------------------ derived columns


def derive_row(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A frontier row from one point's raw measurements (`COLUMNS` order; module docstring).

    `raw` needs block_size, bytes_per_block, context_tokens, kept_kv_tokens and num_blocks;
    every other column is copied when present (None otherwise)."""
    bs, bpb = int(raw["block_size"]), int(raw["bytes_per_block"])
    context, kept = int(raw["context_tokens"]), int(raw["kept_kv_tokens"])
    if kept < 1 or kept > context:
        raise ValueError(f"kept_kv_tokens ({kept}) must be in [1, context_tokens ({context})]")
    blocks = -(-kept // bs)
    per_request = blocks * bpb
    row = {c: raw.get(c) for c in COLUMNS}
    row.update(blocks_per_request=blocks, kv_bytes_per_request=per_request,
               effective_tokens_per_gb=context * GB / per_request,
               max_concurrency=int(raw["num_blocks"]) // blocks)
    return row


def frontier_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per point from raw measurements (`derive_row` each), columns in `COLUMNS`."""
    return pd.DataFrame([derive_row(r) for r in rows], columns=list(COLUMNS))


def needle_frame(reports: Mapping[str, NeedleReport]) -> pd.DataFrame:
    """Long: point, context_tokens, depth, cases, correct, accuracy (one row per grid cell)."""
    rows = []
    for point, rep in reports.items():
        cells: dict[tuple[int, float], list[bool]] = {}
        for r in rep.results:
            cells.setdefault((r.context_tokens, r.depth), []).append(r.correct)
        rows += [{"point": point, "context_tokens": n, "depth": d, "cases": len(v),
                  "correct": sum(v), "accuracy": sum(v) / len(v)}
                 for (n, d), v in sorted(cells.items())]
    return pd.DataFrame(rows, columns=["point", "context_tokens", "depth", "cases", "correct",
                                       "accuracy"])


# ------------------------------------------------------------------------------ measuring


def footprint(llm: LLM, requests: Sequence[BenchRequest]) -> dict[str, int]:
    """The KV a request of the workload holds when it finishes, from the engine's own
    per-request metrics (greedy, ignore_eos, the workload's max_tokens): the most over
    `requests` of context_tokens, kept_kv_tokens, evicted_blocks and preemptions."""
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
              for r in requests]
    outs = llm.generate([{"prompt_token_ids": list(r.prompt_token_ids or [])} for r in requests],
                        params)
    has_policy = llm.config.cache_config.kv_compression_config is not None
    rows = []
    for o in outs:
        m = o.metrics
        if m is None or not o.outputs or o.outputs[0].error:
            raise RuntimeError(f"footprint request {o.request_id} failed: "
                               f"{o.outputs[0].error if o.outputs else 'no output'}")
        context = len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1
        rows.append({"context_tokens": context,
                     "kept_kv_tokens": m.num_kept_kv_tokens if has_policy else context,
                     "evicted_blocks": m.num_evicted_blocks,
                     "preemptions": m.num_preemptions})
    return {k: max(r[k] for r in rows) for k in rows[0]}


def _run_row(res: RunResult) -> dict[str, Any]:
    """Speed, validity and the memory readout of one measured harness run."""
    m = res.metrics()
    mem = res.target.get("memory", {})
    trace = [s.get("running", 0) for s in res.step_trace]
    return {
        "bytes_per_block": mem.get("bytes_per_block"),
        "kv_bytes_per_token": mem.get("kv_bytes_per_token"),
        "block_size": mem.get("block_size"),
        "num_blocks": mem.get("num_blocks"),
        "kv_residual_bytes": mem.get("kv_residual_bytes", 0),
        "mean_running": sum(trace) / len(trace) if trace else 0.0,
        "preemptions": int(res.server_delta.get("vllm:num_preemptions", 0)),
        "output_throughput": m.get("output_throughput"),
        "median_tpot_ms": m.get("median_tpot_ms"),
        "failed": m.get("failed", 0),
        "other_cpu_share": res.validity.other_cpu_share,
        "valid": res.validity.valid and res.error is None,
        "reasons": "; ".join(res.validity.reasons + ([res.error] if res.error else [])),
    }


def make_frontier_workload(spec: FrontierSpec) -> Workload:
    """`num_requests` prompts of exactly `input_len` tokens, `output_len` each (the model's
    tokenizer, `spec.seed`)."""
    from workbench.config.named_models import resolve_model
    from workbench.harness.workloads import make_workload
    from workbench.models.tokenizer import load_tokenizer

    return make_workload(
        "balanced-chat", spec.seed, load_tokenizer(resolve_model(spec.model)),
        num_requests=spec.num_requests, max_model_len=spec.max_model_len(),
        max_input_len=spec.input_len,
        input_len={"kind": "fixed", "value": spec.input_len},
        output_len={"kind": "fixed", "value": spec.output_len})


def measure_point(spec: FrontierSpec, point: FrontierPoint, workload: Workload,
                  cases: Sequence[NeedleCase]) -> tuple[dict[str, Any], NeedleReport]:
    """One point's raw row (what `derive_row` reads) and its needle report."""
    from workbench import LLM
    from workbench.experiments.loops import measure_in_process
    from workbench.harness.arrivals import ArrivalSpec

    knobs = {**spec.engine, "max_model_len": spec.max_model_len(), **point.engine_kwargs()}
    llm = LLM(spec.model, **{**knobs, "enable_prefix_caching": False})
    try:
        fp = footprint(llm, workload.requests[:spec.footprint_requests])
        rep = run_needle(spec.model, llm, lengths=spec.needle_lengths,
                         depths=spec.needle_depths, cases_per_cell=spec.needle_cases_per_cell,
                         seed=spec.seed, cases=cases)
    finally:
        llm.close()
    rep.engine = point.engine_kwargs()
    res = measure_in_process(spec.model, {**knobs, "kv_cache_memory_bytes":
                                          spec.kv_cache_memory_bytes}, workload,
                             ArrivalSpec(mode="closed", concurrency=spec.concurrency),
                             cache_state=spec.cache_state, warn_invalid=False)
    run_row = _run_row(res)
    raw = {"point": point.label, "method": point.method, "budget_tokens": point.budget_tokens,
           "kv_cache_dtype": point.kv_cache_dtype,
           "kv_cache_memory_bytes": spec.kv_cache_memory_bytes, **run_row,
           "context_tokens": fp["context_tokens"], "kept_kv_tokens": fp["kept_kv_tokens"],
           "evicted_blocks": fp["evicted_blocks"],
           "footprint_preemptions": fp["preemptions"],
           "needle_accuracy": rep.accuracy, "needle_cases": len(rep.results)}
    return raw, rep


def machine() -> dict[str, Any]:
    """The CPU named: model name, cores this process may use, ISA (torch's capability)."""
    from workbench.platforms.cpu_info import cpu_model_name, isa

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model_name(), "cores": cores, "isa": isa()}


@dataclass
class FrontierResult:
    """The frontier's table, its needle grid (long) and what it ran on."""

    spec: FrontierSpec
    table: pd.DataFrame
    needle: pd.DataFrame
    raw: list[dict[str, Any]]
    machine: dict[str, Any]
    started_utc: str
    seconds: float
    reports: dict[str, NeedleReport] = field(default_factory=dict)

    @property
    def disturbed(self) -> list[str]:
        """The points whose measured run was flagged (timings unreliable)."""
        return [str(p) for p, v in zip(self.table["point"], self.table["valid"], strict=True)
                if not v]

    def header(self) -> str:
        s, m = self.spec, self.machine
        flag = (f"DISTURBED: {len(self.disturbed)} of {len(self.table)} points flagged "
                f"({', '.join(self.disturbed)}); rerun on a quiet machine before quoting speed"
                if self.disturbed else "no point flagged by the CPU watch")
        return (f"Model `{s.model}` on {m['cpu']} ({m['cores']} cores, {m['isa']}), "
                f"{self.started_utc}, {self.seconds:.0f} s. KV budget "
                f"{s.kv_cache_memory_bytes:,} bytes; workload {s.num_requests} requests x "
                f"{s.input_len} prompt + {s.output_len} output tokens, closed loop of "
                f"{s.concurrency}; engine {json.dumps(dict(s.engine), sort_keys=True)}; needle "
                f"lengths {list(s.needle_lengths)}, depths {list(s.needle_depths)}, "
                f"{s.needle_cases_per_cell} case(s) per cell. {flag}.")

    def markdown(self) -> str:
        return frontier_markdown(self.table, self.needle, self.header())

    def write(self, folder: str | Path) -> Path:
        """frontier.csv, needle.csv, frontier.md and frontier.json (spec, machine, raw rows)
        into `folder` (created)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        self.table.to_csv(out / "frontier.csv", index=False)
        self.needle.to_csv(out / "needle.csv", index=False)
        (out / "frontier.md").write_text(self.markdown() + "\n")
        meta = {"spec": {**asdict(self.spec), "engine": dict(self.spec.engine)},
                "machine": self.machine, "started_utc": self.started_utc,
                "seconds": self.seconds, "disturbed": self.disturbed, "raw": self.raw}
        (out / "frontier.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        return out


def run_frontier(spec: FrontierSpec,
                 progress: Callable[[str], None] | None = None) -> FrontierResult:
    """Every point of `spec`, in order (`progress` gets one line per point)."""
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    workload = make_frontier_workload(spec)
    cases = needle_cases(spec.model, spec.needle_lengths, spec.needle_depths,
                         spec.needle_cases_per_cell, spec.seed)
    raws, reports = [], {}
    for point in spec.points():
        raw, rep = measure_point(spec, point, workload, cases)
        raws.append(raw)
        reports[point.label] = rep
        if progress is not None:
            progress(f"{point.label}: needle {rep.accuracy:.3f}, "
                     f"{raw['output_throughput'] or 0:.1f} tok/s, kept "
                     f"{raw['kept_kv_tokens']}/{raw['context_tokens']} tokens"
                     + ("" if raw["valid"] else " (disturbed)"))
    return FrontierResult(spec, frontier_table(raws), needle_frame(reports), raws, machine(),
                          started, time.perf_counter() - t0, reports)


# ------------------------------------------------------------------------------ presenting

_MD_COLUMNS = {  # table column -> Markdown header
    "point": "point", "kv_bytes_per_token": "KV B/token", "kept_kv_tokens": "kept / context",
    "blocks_per_request": "blocks/req", "effective_tokens_per_gb": "eff. tokens/GB",
    "max_concurrency": "max conc.", "mean_running": "running", "preemptions": "preempt",
    "output_throughput": "out tok/s", "median_tpot_ms": "TPOT p50 ms",
    "valid": "CPU watch", "needle_accuracy": "needle",
}


def _fmt(col: str, row: Mapping[str, Any]) -> str:
    v = row[col]
    if col == "kept_kv_tokens":
        return f"{v} / {row['context_tokens']}"
    if col == "valid":
        share = row["other_cpu_share"]
        mark = "ok" if v else "disturbed"
        return mark if share is None or (isinstance(share, float) and math.isnan(share)) \
            else f"{mark} ({share:.0%})"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if col in ("kv_bytes_per_token", "blocks_per_request", "max_concurrency", "preemptions") \
            and isinstance(v, float) and v.is_integer():
        v = int(v)  # an int column holding a missing value comes back as floats
    if col == "effective_tokens_per_gb":
        return f"{v / 1e6:,.2f}M"
    if col in ("mean_running", "output_throughput", "median_tpot_ms"):
        return f"{v:,.1f}"
    if col == "needle_accuracy":
        return f"{v:.2f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def frontier_markdown(table: pd.DataFrame, needle: pd.DataFrame, header: str = "") -> str:
    """The frontier as Markdown: the header line, the main table, needle accuracy by length
    and by depth (one row per point)."""
    rows = table.to_dict("records")
    cols = list(_MD_COLUMNS)
    lines = [header, ""] if header else []
    lines += ["| " + " | ".join(_MD_COLUMNS[c] for c in cols) + " |",
              "|" + "|".join("---" if c == "point" else "---:" for c in cols) + "|"]
    lines += ["| " + " | ".join(_fmt(c, r) for c in cols) + " |" for r in rows]
    for by, title in (("context_tokens", "needle accuracy by context length"),
                      ("depth", "needle accuracy by depth")):
        if needle.empty:
            break
        grid = needle.groupby(["point", by], sort=False)[["correct", "cases"]].sum()
        acc = (grid["correct"] / grid["cases"]).unstack(by)
        keys = [k for k in sorted(acc.columns)]
        lines += ["", f"{title}:", "",
                  "| point | " + " | ".join(f"{k:g}" for k in keys) + " |",
                  "|---|" + "---:|" * len(keys)]
        order = [p for p in table["point"] if p in acc.index]
        lines += ["| " + p + " | " + " | ".join(f"{acc.loc[p, k]:.2f}" for k in keys) + " |"
                  for p in order]
    return "\n".join(lines)


def plot_frontier(table: pd.DataFrame, x: str = "kv_bytes_per_request") -> Figure:
    """Needle accuracy against KV memory per request (`x`), one line per eviction method
    (its budgets), full KV and the KV dtypes as labelled points; log x."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    scale = 1e6 if x.endswith("bytes_per_request") else 1.0
    for method, group in table.groupby("method", sort=False):
        g = group.sort_values(x)
        if method == "none":
            for _, r in g.iterrows():
                ax.scatter(r[x] / scale, r["needle_accuracy"], marker="s", color="black",
                           zorder=3)
                ax.annotate(str(r["point"]), (r[x] / scale, r["needle_accuracy"]),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)
        else:
            ax.plot(g[x] / scale, g["needle_accuracy"], marker="o", label=str(method))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("KV per request (MB)" if scale != 1 else x)
    ax.set_ylabel("needle accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("accuracy vs KV memory (the frontier)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return fig
