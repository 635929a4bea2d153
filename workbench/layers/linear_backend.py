"""CPU fp32 linear backends: the GEMMs a linear layer can run on, and the per-shape plan that
says which one serves a batch of a given row count.

    backend  packed once after loading                 per call
    torch    -                                         F.linear (MKL's sgemm, unpacked weight)
    mkl      mkl::_mkl_reorder_linear_weight(W, 64)    mkl::_mkl_linear(x, Wp, W, b, rows)
    onednn   mkldnn::_reorder_linear_weight(W)         mkldnn::_linear_pointwise(x, Wp, b, "none")

mkl is the path of `cpu_gemm.py` (what torch.compile's weight freezing uses for fp32 linears);
onednn is the pair inductor uses for dynamic shapes and low precision (vLLM-CPU calls oneDNN
through its own C++ handle, `dispatch_cpu_unquantized_gemm`; torch's ops are the way in here).
`torch._C._nn.mkldnn_linear` is not a candidate: its input must be a mkldnn-layout tensor, a
conversion per call.

A `LinearPlan` belongs to one weight shape [out, in]: at most one packed backend (the packed
copy costs the weight's bytes again, as before) and, per row bucket, the backend to call:

    rows     1..3 | 4..31 | 32..127 | 128..511 | 512..
    probe       1 |    16 |      64 |      256 |   1024    (the rows the autotune measures)

each bucket holding the rows nearest its probe on a log scale. The plans come from
`linear_autotune.py` (measured, cached per machine) or from WORKBENCH_CPU_LINEAR_BACKEND.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

BACKENDS = ("torch", "mkl", "onednn")
PACKED_BACKENDS = ("mkl", "onednn")
PROBE_ROWS = (1, 16, 64, 256, 1024)
BUCKET_MAX_ROWS = (3, 31, 127, 511)  # the last bucket is unbounded
BACKEND_ENV = "WORKBENCH_CPU_LINEAR_BACKEND"
LEGACY_PACKED_ENV = "WORKBENCH_CPU_PACKED_GEMM"  # "0": no packing (= torch)
MODES = ("auto", *BACKENDS)

Shape = tuple[int, int]  # a weight's [out_features, in_features]


def bucket_of(rows: int) -> int:
    """Index of the row bucket (and of its probe in PROBE_ROWS) that `rows` falls in."""
    for i, hi in enumerate(BUCKET_MAX_ROWS):
        if rows <= hi:
            return i
    return len(BUCKET_MAX_ROWS)


def bucket_label(first: int, last: int | None = None) -> str:
    """Rows of buckets first..last (default: first alone), e.g. '4..31', '512..'."""
    last = first if last is None else last
    lo = 1 if first == 0 else BUCKET_MAX_ROWS[first - 1] + 1
    return f"{lo}.." if last == len(BUCKET_MAX_ROWS) else f"{lo}..{BUCKET_MAX_ROWS[last]}"


@dataclass(frozen=True)
class LinearPlan:
    """Which backend serves each row bucket of one weight shape.

    `packed` is the one packed backend the weight is packed for (None: no packed copy);
    every entry of `backends` (one per bucket) is "torch" or `packed`. `source` says where
    the plan came from: "measured" (autotuned now), "cache" (autotuned earlier on this
    machine), "forced" (WORKBENCH_CPU_LINEAR_BACKEND / an explicit mode), or "only torch" (no
    packed backend in this torch build); `tune_s` is the
    time spent measuring this shape (0 unless measured)."""

    shape: Shape
    packed: str | None
    backends: tuple[str, ...]
    source: str
    tune_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.backends) != len(PROBE_ROWS):
            raise ValueError(f"backends ({self.backends}) must name one backend per row bucket "
                             f"({len(PROBE_ROWS)})")
        allowed = {"torch", self.packed}
        if any(b not in allowed for b in self.backends):
            raise ValueError(f"backends ({self.backends}) must each be 'torch' or the packed "
                             f"backend ({self.packed!r})")
        if self.packed is not None and self.packed not in PACKED_BACKENDS:
            raise ValueError(f"packed ({self.packed!r}) must be one of {PACKED_BACKENDS} or None")

    @classmethod
    def uniform(cls, shape: Shape, backend: str, source: str = "forced") -> LinearPlan:
        """One backend for every row count."""
        packed = None if backend == "torch" else backend
        return cls(shape, packed, (backend,) * len(PROBE_ROWS), source)

    def backend_for(self, rows: int) -> str:
        return self.backends[bucket_of(rows)]

    def describe(self) -> str:
        """e.g. '1..31 torch, 32.. onednn': the buckets, runs of one backend merged."""
        runs: list[tuple[int, int, str]] = []
        for i, b in enumerate(self.backends):
            if runs and runs[-1][2] == b:
                runs[-1] = (runs[-1][0], i, b)
            else:
                runs.append((i, i, b))
        return ", ".join(f"{bucket_label(first, last)} {b}" for first, last, b in runs)


class PackableLinear(Protocol):
    """A layer that takes a plan (LinearBase, ParallelLMHead): `linear_autotune` sets
    `linear_plan` and `packed_weight` after loading; the forward passes both to `linear`."""

    linear_plan: LinearPlan | None
    packed_weight: torch.Tensor | None

    @property
    def weight(self) -> torch.Tensor: ...


def unavailable_reason(backend: str) -> str | None:
    """None when this torch build can run `backend` for fp32 CPU weights, else why not."""
    if backend == "torch":
        return None
    if backend == "mkl":
        if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear"):
            return "this torch build has no MKL packed GEMM"
        return None
    if backend == "onednn":
        if not torch.backends.mkldnn.is_available() or not hasattr(
                torch.ops.mkldnn, "_linear_pointwise"):
            return "this torch build has no oneDNN linear"
        precision = getattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision",
                            "none")
        if precision not in ("none", "ieee"):
            return f"torch.backends.mkldnn.matmul.fp32_precision is {precision!r} (not fp32)"
        return None
    raise ValueError(f"backend ({backend!r}) must be one of {', '.join(BACKENDS)}")


def available_backends() -> tuple[str, ...]:
    return tuple(b for b in BACKENDS if unavailable_reason(b) is None)


def mode_from_env() -> str:
    """auto (autotune) or the backend WORKBENCH_CPU_LINEAR_BACKEND forces; the legacy
    WORKBENCH_CPU_PACKED_GEMM=0 means torch. ValueError names a bad value or a conflict."""
    value = os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{BACKEND_ENV} ({os.environ[BACKEND_ENV]!r}) must be one of "
                         f"{' | '.join(MODES)}")
    if os.environ.get(LEGACY_PACKED_ENV, "1") == "0":
        if value in PACKED_BACKENDS:
            raise ValueError(f"{BACKEND_ENV}={value} asks for a packed backend but "
                             f"{LEGACY_PACKED_ENV}=0 turns packing off; unset one of them")
        return "torch"
    return value


def check_mode(mode: str) -> None:
    """ValueError unless `mode` is known and, when it forces a backend, this build runs it."""
    if mode not in MODES:
        raise ValueError(f"linear backend mode ({mode!r}) must be one of {' | '.join(MODES)}")
    if mode != "auto" and (why := unavailable_reason(mode)) is not None:
        raise ValueError(f"linear backend {mode!r} was forced ({BACKEND_ENV}) but {why}; "
                         "use auto or another backend")


def pack(backend: str | None, weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of `weight` [out, in] for `backend` (None for torch / None)."""
    w = weight.detach()
    if backend is None or backend == "torch":
        return None
    if backend == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(w, 64)
    if backend == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(w)
    raise ValueError(f"backend ({backend!r}) must be one of {', '.join(BACKENDS)}")


def run(backend: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        packed: torch.Tensor | None) -> torch.Tensor:
    """x [rows, in] @ weight^T + bias on `backend`; `packed` is weight packed for it."""
    if backend == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if backend == "mkl":
        return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.shape[0])
    return F.linear(x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None, plan: LinearPlan | None) -> torch.Tensor:
    """x @ weight^T + bias on the backend `plan` names for x's row count; F.linear without a
    plan, for an empty batch, or for a batch that is not 2-D."""
    if plan is None or x.dim() != 2 or x.shape[0] == 0:
        return F.linear(x, weight, bias)
    backend = plan.backends[bucket_of(x.shape[0])]
    if backend == "torch":
        return F.linear(x, weight, bias)
    return run(backend, x, weight, bias, packed)


def runner(backend: str, weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> backend's linear of x with `weight` (packed once here), for timing."""
    packed = pack(backend, weight)
    return lambda x: run(backend, x, weight, None, packed)
