"""What `workbench sim-search` searches: a simulated target, one workload at one arrival rate,
a goodput SLO and a grid over configurations (Vidur-Search's question: the cheapest
configuration that meets the SLO at the target rate).

    name: llama3-8b-h100
    target: {model: Llama-3-8B, hardware: H100-SXM, router_policy: least_outstanding}
    workload: {fixture: balanced-chat, seed: 0, params: {num_requests: 400}}
                                    # or {jsonl: PATH} or {trace: PATH, format: NAME, params}
    arrivals: {mode: poisson, rate: 20.0, seed: 0}      # an open loop: the target rate
    slo: {ttft_ms: 500, tpot_ms: 50, attainment: 0.9}   # harness.goodput.GoodputSLO
    engine: {max_model_len: 4096}                       # knobs every point shares
    grid:                                               # every combination is one point
      tensor_parallel_size: [1, 2]
      num_instances: [1, 2, 4]                          # replicas behind the router, or
      # pd: ["1:1", "1:3"]                              # P:D splits (num_prefill:num_decode)
      max_num_batched_tokens: [2048, 8192]
      max_num_seqs: [128, 256]
    repeat: 0                                           # seeds the step noise

A point costs tensor_parallel_size x pipeline_parallel_size x instances GPUs (instances:
num_instances, or num_prefill + num_decode). `SearchSpec.from_dict` refuses a bad spec with
every problem named (field, value, what is allowed); `points()` expands the grid in the order
of GRID_AXES, each axis's values in the order given.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import UserError, did_you_mean, is_int
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.goodput import GoodputSLO

SPEC_KEYS = ("name", "target", "workload", "arrivals", "slo", "engine", "grid", "repeat")
GRID_AXES = ("tensor_parallel_size", "pipeline_parallel_size", "num_instances", "pd",
             "max_num_batched_tokens", "max_num_seqs")
ENGINE_AXES = ("tensor_parallel_size", "pipeline_parallel_size", "max_num_batched_tokens",
               "max_num_seqs")
WORKLOAD_SOURCES = ("fixture", "jsonl", "trace")
PD_TARGET_KEYS = ("num_prefill", "num_decode")


@dataclass(frozen=True)
class SearchPoint:
    """One configuration of the grid; `max_num_batched_tokens` / `max_num_seqs` None: the
    engine block's value or the scheduler's default."""

    index: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    num_instances: int = 1
    num_prefill: int | None = None  # a P:D split: num_prefill + num_decode instances
    num_decode: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None

    @property
    def instances(self) -> int:
        if self.num_prefill is not None and self.num_decode is not None:
            return self.num_prefill + self.num_decode
        return self.num_instances

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.instances

    @property
    def layout(self) -> str:
        """The instances as the table shows them: "4" replicas or "1:3" (P:D)."""
        if self.num_prefill is not None:
            return f"{self.num_prefill}:{self.num_decode}"
        return str(self.num_instances)


@dataclass(frozen=True)
class SearchSpec:
    """A search (module docstring); every field is checked in __post_init__."""

    name: str
    target: Mapping[str, Any]
    workload: Mapping[str, Any]
    arrival: ArrivalSpec
    slo: GoodputSLO
    grid: Mapping[str, tuple[Any, ...]]
    engine: Mapping[str, Any] = field(default_factory=dict)
    repeat: int = 0

    def __post_init__(self) -> None:
        bad = self._problems()
        if bad:
            raise UserError(f"search spec {self.name!r}: " + "; ".join(bad))

    def _problems(self) -> list[str]:
        out: list[str] = []
        if not isinstance(self.name, str) or not self.name:
            out.append(f"name ({self.name!r}) must be a non-empty string")
        if not is_int(self.repeat) or self.repeat < 0:
            out.append(f"repeat ({self.repeat!r}) must be an integer >= 0 (seeds the noise)")
        if not self.arrival.is_open_loop:
            out.append(f"arrivals.mode ({self.arrival.mode!r}) must be an open loop (poisson, "
                       "gamma, constant or trace): the search asks for a target rate")
        out += _workload_problems(self.workload)
        out += _grid_problems(self.grid, self.engine, self.target)
        if out:  # the points' targets and configs only mean something on a sound grid
            return out
        from workbench.sim.target import config_problems, target_problems

        seen: set[str] = set()
        for p in self.points():
            for msg in target_problems(self.point_target(p)) + \
                    config_problems(self.point_target(p), self.point_config(p)):
                if msg not in seen:
                    seen.add(msg)
                    out.append(msg)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> SearchSpec:
        """A spec from its YAML mapping (module docstring); every problem named."""
        if not isinstance(data, Mapping):
            raise UserError(f"a search spec must be a mapping of {', '.join(SPEC_KEYS)}, not "
                            f"{type(data).__name__}")
        out = [f"{k!r} is not a search spec key{did_you_mean(k, SPEC_KEYS)} (keys: "
               f"{', '.join(SPEC_KEYS)})" for k in data if k not in SPEC_KEYS]
        out += [f"{k} is missing" for k in ("target", "workload", "arrivals", "slo", "grid")
                if k not in data]
        for k in ("target", "workload", "arrivals", "slo", "grid", "engine"):
            if k in data and not isinstance(data[k], Mapping):
                out.append(f"{k} must be a mapping, not {data[k]!r}")
        if out:
            raise UserError("search spec: " + "; ".join(out))
        try:
            arrival = ArrivalSpec.from_dict(dict(data["arrivals"]))
        except ValueError as e:
            raise UserError(f"search spec arrivals: {e}") from None
        slo = dict(data["slo"])
        unknown = sorted(set(slo) - {"ttft_ms", "tpot_ms", "attainment"})
        if unknown or not {"ttft_ms", "tpot_ms"} <= set(slo):
            raise UserError(f"search spec slo ({slo!r}) takes ttft_ms, tpot_ms (bounds in ms) "
                            "and attainment (the share of requests that must meet both, "
                            "default 0.9)")
        try:
            goodput_slo = GoodputSLO(**slo)
        except ValueError as e:
            raise UserError(f"search spec slo: {e}") from None
        grid = {k: _grid_values(k, v) for k, v in data["grid"].items()}
        return cls(name=str(data.get("name", "search")), target=dict(data["target"]),
                   workload=dict(data["workload"]), arrival=arrival, slo=goodput_slo,
                   grid=grid, engine=dict(data.get("engine") or {}),
                   repeat=data.get("repeat", 0))

    def as_dict(self) -> dict[str, Any]:
        """The spec as `from_dict` reads it (JSON-safe; P:D values as "P:D")."""
        grid = {k: [f"{v[0]}:{v[1]}" if k == "pd" else v for v in vs]
                for k, vs in self.grid.items()}
        return {"name": self.name, "target": dict(self.target),
                "workload": dict(self.workload), "arrivals": self.arrival.to_dict(),
                "slo": {"ttft_ms": self.slo.ttft_ms, "tpot_ms": self.slo.tpot_ms,
                        "attainment": self.slo.attainment},
                "engine": dict(self.engine), "grid": grid, "repeat": self.repeat}

    def points(self) -> list[SearchPoint]:
        """Every combination of the grid (GRID_AXES order, values as given)."""
        axes = [a for a in GRID_AXES if a in self.grid]
        fixed = {"tensor_parallel_size": int(self.engine.get("tensor_parallel_size", 1)),
                 "pipeline_parallel_size": int(self.engine.get("pipeline_parallel_size", 1)),
                 "num_instances": int(self.target.get("num_instances", 1)),
                 "max_num_batched_tokens": self.engine.get("max_num_batched_tokens"),
                 "max_num_seqs": self.engine.get("max_num_seqs")}
        out = []
        for i, values in enumerate(itertools.product(*(self.grid[a] for a in axes))):
            kw: dict[str, Any] = dict(fixed)
            for axis, value in zip(axes, values, strict=True):
                if axis == "pd":
                    kw["num_prefill"], kw["num_decode"] = value
                else:
                    kw[axis] = value
            out.append(SearchPoint(index=i, **kw))
        return out

    def point_target(self, p: SearchPoint) -> dict[str, Any]:
        """The simulated target block of point `p`."""
        target = {"kind": "simulated", **self.target}
        if p.num_prefill is not None:
            target.pop("num_instances", None)
            target.update(num_prefill=p.num_prefill, num_decode=p.num_decode)
        else:
            target["num_instances"] = p.num_instances
        return target

    def point_config(self, p: SearchPoint) -> dict[str, Any]:
        """The engine knobs of point `p` (the engine block, the grid's values over it)."""
        config = {**self.engine, "tensor_parallel_size": p.tensor_parallel_size,
                  "pipeline_parallel_size": p.pipeline_parallel_size}
        for knob in ("max_num_batched_tokens", "max_num_seqs"):
            if getattr(p, knob) is not None:
                config[knob] = getattr(p, knob)
        return config


def _grid_values(axis: str, raw: Any) -> tuple[Any, ...]:
    """An axis's values as a tuple; a P:D value "1:3" or [1, 3] as (1, 3)."""
    values = tuple(raw) if isinstance(raw, list | tuple) else (raw,)
    if axis != "pd":
        return values
    out: list[Any] = []
    for v in values:
        if isinstance(v, str) and v.count(":") == 1:
            p, d = v.split(":")
            out.append((int(p), int(d)) if p.strip().isdigit() and d.strip().isdigit() else v)
        elif isinstance(v, list | tuple) and len(v) == 2:
            out.append(tuple(v))
        else:
            out.append(v)
    return tuple(out)


def _grid_problems(grid: Mapping[str, tuple[Any, ...]], engine: Mapping[str, Any],
                   target: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    if not grid:
        out.append(f"grid is empty; give at least one axis of {', '.join(GRID_AXES)}")
    for axis, values in grid.items():
        if axis not in GRID_AXES:
            out.append(f"grid.{axis} is not a search axis{did_you_mean(axis, GRID_AXES)} "
                       f"(axes: {', '.join(GRID_AXES)})")
            continue
        if not values:
            out.append(f"grid.{axis} is empty; give at least one value")
        if len(set(values)) != len(values):
            out.append(f"grid.{axis} ({list(values)}) repeats a value")
        for v in values:
            ok = (isinstance(v, tuple) and len(v) == 2 and all(is_int(x) and x >= 1 for x in v)
                  if axis == "pd" else is_int(v) and v >= 1)
            if not ok:
                allowed = ("a P:D split such as \"1:3\" (num_prefill:num_decode, each >= 1)"
                           if axis == "pd" else "an integer >= 1")
                out.append(f"grid.{axis} value {v!r} must be {allowed}")
        if axis in ENGINE_AXES and axis in engine:
            out.append(f"{axis} is both in engine ({engine[axis]!r}) and a grid axis; keep one")
    for knob in ("tensor_parallel_size", "pipeline_parallel_size"):
        if knob in engine and (not is_int(engine[knob]) or engine[knob] < 1):
            out.append(f"engine.{knob} ({engine[knob]!r}) must be an integer >= 1")
    n = target.get("num_instances", 1)
    if not is_int(n) or n < 1:
        out.append(f"target.num_instances ({n!r}) must be an integer >= 1")
    if "num_instances" in grid and "pd" in grid:
        out.append("grid.num_instances and grid.pd both set the instances; keep one")
    if ("num_instances" in grid or "pd" in grid) and "num_instances" in target:
        out.append(f"target.num_instances ({target['num_instances']!r}) and the grid both set "
                   "the instances; keep the grid's")
    if "kind" in target and target["kind"] != "simulated":
        out.append(f"target.kind ({target['kind']!r}) must be 'simulated' (or left out)")
    if "pd" in grid:
        from workbench.sim.target import TARGET_KEYS

        if not all(k in TARGET_KEYS for k in PD_TARGET_KEYS):
            out.append("grid.pd needs a simulated target with num_prefill and num_decode, "
                       f"which this build's does not have (its keys: {', '.join(TARGET_KEYS)})")
    return out


def _workload_problems(workload: Mapping[str, Any]) -> list[str]:
    sources = [k for k in WORKLOAD_SOURCES if k in workload]
    if len(sources) != 1:
        return [f"workload needs exactly one of {', '.join(WORKLOAD_SOURCES)} (a fixture name, "
                f"a JSONL file or a trace file), not {sources or 'none'}"]
    if sources == ["fixture"]:
        from workbench.harness.workloads import FIXTURES

        if workload["fixture"] not in FIXTURES:
            return [f"workload.fixture ({workload['fixture']!r}) must be one of "
                    f"{', '.join(sorted(FIXTURES))}"]
        if not is_int(workload.get("seed", 0)):
            return [f"workload.seed ({workload['seed']!r}) must be an integer"]
    if sources == ["trace"]:
        from workbench.harness.traces import trace_spec_problems

        return trace_spec_problems(dict(workload))
    return []
