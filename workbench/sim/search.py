"""Search (Vidur-Search's question): simulate every configuration of a `SearchSpec`'s grid at
the target rate and choose the cheapest one that meets the goodput SLO.

    spec = SearchSpec.from_dict(yaml.safe_load(...))      # workbench/sim/search_spec.py
    result = search(spec, backend="pool")                 # or "serial", "ray"
    result.rows        # one dict per point, ROW_COLUMNS, in grid order
    result.chosen      # the cheapest point meeting the SLO, or None: result.verdict() says so

Each point is one `run_simulated` of the shared workload and arrivals (the harness's records;
seeded by `spec.repeat`), judged as the harness judges goodput:

    slo_attainment   requests meeting TTFT <= ttft_ms and TPOT <= tpot_ms / all requests
    meets_slo        slo_attainment >= slo.attainment
    goodput          requests meeting the SLO per second of the run (vLLM's request_goodput)

The chosen point: among those meeting the SLO, the fewest GPUs (tensor x pipeline x
instances), then the highest goodput, the highest attainment, the lowest p95 TTFT, the first
in the grid. A point that cannot run (the weights leave no KV pool at that TP degree, a budget
the scheduler refuses) is a row with its `error`, never chosen.

Fan-out: `serial`, a local process `pool`, or `ray` (a running cluster at `ray_address`,
"auto" by default, else a local one started for the search). Every point is deterministic
for its seed, so the rows are identical whichever runs them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from workbench.errors import UserError
from workbench.harness.goodput import slo_attainment
from workbench.harness.metrics import compute_metrics
from workbench.harness.workloads import Workload
from workbench.sim.search_spec import SearchPoint, SearchSpec

BACKENDS = ("serial", "pool", "ray")
POINT_COLUMNS = ("index", "num_gpus", "tensor_parallel_size", "pipeline_parallel_size",
                 "num_instances", "num_prefill", "num_decode", "max_num_batched_tokens",
                 "max_num_seqs")
RESULT_COLUMNS = ("slo_attainment", "goodput", "p95_ttft_ms", "median_tpot_ms",
                  "request_throughput", "failed", "meets_slo", "error")
ROW_COLUMNS = POINT_COLUMNS + RESULT_COLUMNS


@dataclass
class SearchResult:
    """Every point's row (grid order), the chosen row (None: no point meets the SLO) and the
    fan-out that ran them."""

    spec: SearchSpec
    rows: list[dict[str, Any]]
    chosen: dict[str, Any] | None
    backend: str

    def verdict(self) -> str:
        """One line: the chosen configuration, or that none meets the SLO and the closest."""
        s = self.spec.slo
        slo = (f"TTFT <= {s.ttft_ms:g} ms and TPOT <= {s.tpot_ms:g} ms for >= "
               f"{s.attainment:.0%} of requests at {_rate(self.spec)}")
        if self.chosen is not None:
            r = self.chosen
            return (f"chosen: point {r['index']}, {r['num_gpus']} GPUs ({describe(r)}): "
                    f"{r['slo_attainment']:.1%} of requests within the SLO ({slo}), goodput "
                    f"{r['goodput']:.2f} req/s")
        ran = [r for r in self.rows if r["error"] is None]
        if not ran:
            return (f"none meets the SLO ({slo}): no point could run (see each row's error)")
        best = max(ran, key=lambda r: (r["slo_attainment"], -r["num_gpus"], -r["index"]))
        return (f"none meets the SLO ({slo}): the closest is point {best['index']}, "
                f"{best['num_gpus']} GPUs ({describe(best)}), {best['slo_attainment']:.1%} "
                "within it; widen the grid (more instances, TP) or relax the SLO")


def _rate(spec: SearchSpec) -> str:
    a = spec.arrival
    if a.mode == "trace":
        return "the trace's own arrival times"
    return "a burst (every request at t = 0)" if a.rate == float("inf") else \
        f"{a.mode} {a.rate:g} req/s"


def describe(row: dict[str, Any]) -> str:
    """"tp 2, pp 1, 4 instances, budget 8192, max_num_seqs 256" (P:D: "1:3 P:D")."""
    layout = (f"{row['num_prefill']}:{row['num_decode']} P:D" if row["num_prefill"] is not None
              else f"{row['num_instances']} instance{'s' if row['num_instances'] != 1 else ''}")
    parts = [f"tp {row['tensor_parallel_size']}", f"pp {row['pipeline_parallel_size']}", layout]
    for knob, label in (("max_num_batched_tokens", "budget"), ("max_num_seqs", "max_num_seqs")):
        parts.append(f"{label} {row[knob] if row[knob] is not None else 'default'}")
    return ", ".join(parts)


def point_row(p: SearchPoint) -> dict[str, Any]:
    return {"index": p.index, "num_gpus": p.num_gpus,
            "tensor_parallel_size": p.tensor_parallel_size,
            "pipeline_parallel_size": p.pipeline_parallel_size,
            "num_instances": p.instances, "num_prefill": p.num_prefill,
            "num_decode": p.num_decode, "max_num_batched_tokens": p.max_num_batched_tokens,
            "max_num_seqs": p.max_num_seqs}


def evaluate(spec: SearchSpec, point: SearchPoint, workload: Workload) -> dict[str, Any]:
    """One point's row: simulate it, judge it against the SLO."""
    from workbench.sim.target import make_instances, run_simulated

    row = point_row(point)
    target, config = spec.point_target(point), spec.point_config(point)
    try:  # the configuration itself: its KV pool, its scheduler config
        make_instances(target, config, spec.repeat)
    except ValueError as e:
        return {**row, **dict.fromkeys(RESULT_COLUMNS[:-2]), "meets_slo": False,
                "error": str(e)}
    run = run_simulated(target, config, workload, spec.arrival, repeat=spec.repeat)
    attainment = slo_attainment(run.records, spec.slo,
                                unsent_requests=len(workload.requests) - len(run.records))
    m = compute_metrics(run.records, run.duration_s, slo=spec.slo.as_slo())
    return {**row, "slo_attainment": attainment, "goodput": m["request_goodput"],
            "p95_ttft_ms": m["p95_ttft_ms"], "median_tpot_ms": m["median_tpot_ms"],
            "request_throughput": m["request_throughput"], "failed": int(m["failed"]),
            "meets_slo": attainment >= spec.slo.attainment, "error": None}


def choose(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The cheapest row meeting the SLO (module docstring's order), None when none does."""
    ok = [r for r in rows if r["meets_slo"]]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["num_gpus"], -r["goodput"], -r["slo_attainment"],
                                  r["p95_ttft_ms"], r["index"]))


# ---------------------------------------------------------------- fan-out
_WORKER: dict[str, Any] = {}


def _pool_init(spec: SearchSpec, workload: Workload) -> None:
    _WORKER["spec"], _WORKER["workload"] = spec, workload


def _pool_evaluate(point: SearchPoint) -> dict[str, Any]:
    return evaluate(_WORKER["spec"], point, _WORKER["workload"])


def run_points(spec: SearchSpec, workload: Workload, backend: str = "pool",
               workers: int | None = None, ray_address: str = "auto") -> list[dict[str, Any]]:
    """Every point's row, in grid order, run by `backend` (BACKENDS); `workers`: the pool's
    processes (default: this machine's cores)."""
    if backend not in BACKENDS:
        raise UserError(f"backend ({backend!r}) must be one of {', '.join(BACKENDS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise UserError(f"workers ({workers!r}) must be an integer >= 1")
    points = spec.points()
    if backend == "ray":
        return _ray_rows(spec, workload, points, ray_address)
    n = pool_size(workers, len(points)) if backend == "pool" else 1
    if n <= 1:
        return [evaluate(spec, p, workload) for p in points]
    with ProcessPoolExecutor(n, initializer=_pool_init, initargs=(spec, workload)) as pool:
        return list(pool.map(_pool_evaluate, points))


def pool_size(workers: int | None, num_points: int) -> int:
    """The pool's processes: `workers` (default: this machine's cores), at most one a point;
    1 means the points run serially in this process."""
    return max(1, min(workers or os.cpu_count() or 1, num_points))


def _ray_evaluate(spec: SearchSpec, point: SearchPoint, workload: Workload) -> dict[str, Any]:
    return evaluate(spec, point, workload)


def _ray_rows(spec: SearchSpec, workload: Workload, points: list[SearchPoint],
              address: str) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise UserError("--ray: the ray package is not installed (pip install ray); without "
                        "--ray the points fan out over a local process pool") from None
    started = not ray.is_initialized()
    if started:
        quiet: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                 "logging_level": "ERROR"}
        try:
            ray.init(address=address, **quiet)
        except ConnectionError:
            if address != "auto":
                raise UserError(f"--ray {address}: no Ray cluster answers at that address "
                                "(start one with `ray start --head`, or use --ray auto)") from None
            try:  # no cluster running: a local one for this search
                ray.init(**quiet)
            except Exception as e:  # noqa: BLE001 - Ray's startup failures are untyped
                raise UserError(f"--ray: a local Ray cluster did not start ({e}); start one "
                                "with `ray start --head` and retry, or drop --ray for the "
                                "local process pool") from None
    try:
        remote = ray.remote(num_cpus=1)(_ray_evaluate)
        spec_ref, workload_ref = ray.put(spec), ray.put(workload)
        rows: list[dict[str, Any]] = ray.get([remote.remote(spec_ref, p, workload_ref)
                                              for p in points])
        return rows
    finally:
        if started:
            ray.shutdown()


def build_workload(spec: SearchSpec) -> Workload:
    """The spec's workload, built with the tokenizer the simulated target names
    (`sim.target.tokenizer_name`: a named shape uses the bundled one)."""
    from workbench.config.named_models import resolve_model
    from workbench.harness.traces import load_trace_spec
    from workbench.harness.workloads import load_jsonl, make_workload
    from workbench.models.tokenizer import load_tokenizer
    from workbench.sim.target import tokenizer_name

    w = spec.workload
    tok = load_tokenizer(resolve_model(tokenizer_name(spec.target)))
    if "jsonl" in w:
        return load_jsonl(w["jsonl"], tokenizer=tok, name=w.get("name"))
    if "trace" in w:
        return load_trace_spec(dict(w), tok)
    return make_workload(str(w["fixture"]), int(w.get("seed", 0)), tok,
                         **(w.get("params") or {}))


def search(spec: SearchSpec, workload: Workload | None = None, backend: str = "pool",
           workers: int | None = None, ray_address: str = "auto") -> SearchResult:
    """Run the whole grid (module docstring); `workload` default: `build_workload(spec)`."""
    wl = build_workload(spec) if workload is None else workload
    rows = run_points(spec, wl, backend, workers, ray_address)
    if backend == "pool":
        n = pool_size(workers, len(rows))
        backend = f"pool of {n} processes" if n > 1 else "serial"
    return SearchResult(spec, rows, choose(rows), backend)
