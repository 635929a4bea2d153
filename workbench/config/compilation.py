"""vLLM's `compilation_config`, validated: whether and how the model forward is compiled.

    compilation_config=3                              the mode alone (vLLM's old `-O3`)
    compilation_config={"mode": 3}                    or "VLLM_COMPILE"; {"level": 3} (vLLM's
                                                      former name of the field) is accepted
    compilation_config={"mode": 0}                    eager: no torch.compile
    compilation_config={"mode": 3, "backend": "eager", "compile_sizes": [1, 4]}

Modes (vLLM's `CompilationMode` numbers and names):

    0 NONE                 eager PyTorch, every op dispatched from Python
    1 STOCK_TORCH_COMPILE  plain `torch.compile` of the forward: dynamo's own shape policy
                           (the first batch's token count is compiled static, a second count
                           recompiles with it dynamic), compiled lazily on the first steps
    2 DYNAMO_TRACE_ONCE    refused: vLLM traces once and drops dynamo's guards; not built here
    3 VLLM_COMPILE         the workbench pipeline (`workbench.compilation`): the token dim marked
                           dynamic from the start (one graph for every batch of 2+ tokens, plus
                           a static one for 1 token, dynamo's 0/1 specialization), each
                           `compile_sizes` entry also compiled static, every graph compiled at
                           engine start, paged attention an opaque custom op, inductor's caches
                           under `cache_dir`

`mode=None` (the default) is resolved by `EngineConfig`: `enforce_eager=True` -> 0 (as vLLM, it
also overrides an explicit mode, with a warning); otherwise $WORKBENCH_COMPILATION_MODE when
set, else what `python -m workbench.bench.offline.compile_ab` measured for this model on this
machine (`workbench.config.compile_choice`: compiled when it gave >= 5% more output tok/s than
eager), else the device default (`DEFAULT_MODE`: eager; CUDA stays eager until the compiled
CUDA path has run on a GPU, vLLM's default there is 3).

`backend` is torch.compile's: "inductor" (generated C++/OpenMP on CPU, Triton on CUDA), or
"eager" / "aot_eager" (dynamo alone / plus AOT autograd: no codegen, for checking graph breaks
fast). `inductor_compile_config` entries are inductor options laid over
the device's defaults (`INDUCTOR_DEFAULTS`; CPU: `freezing` -- the weights become constants
and inductor packs them for oneDNN/MKL, without which the compiled forward loses the packed
GEMMs of `workbench.layers.linear_backend` and runs slower than eager).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class CompilationMode(enum.IntEnum):
    """vLLM's compilation modes (the numbers of its former `level`)."""

    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


SUPPORTED_MODES = (CompilationMode.NONE, CompilationMode.STOCK_TORCH_COMPILE,
                   CompilationMode.VLLM_COMPILE)
COMPILE_BACKENDS = ("inductor", "eager", "aot_eager")
CACHE_ENV = "WORKBENCH_CACHE_DIR"  # the workbench's cache root (linear autotune, compile)
# overrides DEFAULT_MODE (never an explicit compilation_config): a mode number or name, e.g. to
# run a test suite compiled (as vLLM's former VLLM_TORCH_COMPILE_LEVEL)
MODE_ENV = "WORKBENCH_COMPILATION_MODE"

# The mode a device gets when neither compilation_config nor enforce_eager says (docs/compile.md
# has the figures). CPU: decided by measurement on the 2-core AVX-512 box. CUDA: the compiled
# path is written (Triton attention inside the opaque op, decode CUDA graphs capturing the
# compiled forward) but has never run on a GPU, so it stays opt-in.
DEFAULT_MODE = {"cpu": CompilationMode.NONE, "cuda": CompilationMode.NONE}
# inductor options per device, under the user's inductor_compile_config
INDUCTOR_DEFAULTS: dict[str, dict[str, Any]] = {"cpu": {"freezing": True}, "cuda": {}}


def _mode_of(value: Any, name: str) -> CompilationMode:
    """An int (0..3) or a mode name ("NONE", "VLLM_COMPILE", case-insensitive)."""
    if isinstance(value, CompilationMode):
        return value
    number = value
    if isinstance(value, str):
        key = value.strip().upper()
        if key in CompilationMode.__members__:
            return CompilationMode[key]
        number = int(key) if key.isdigit() else None
    if isinstance(number, int) and not isinstance(number, bool) and number in set(
            CompilationMode):
        return CompilationMode(number)
    names = ", ".join(f"{m.value} ({m.name})" for m in CompilationMode)
    raise ValueError(f"compilation_config {name} ({value!r}) must be one of {names}")


def default_mode(device: str, measured: bool | None = None) -> CompilationMode:
    """WORKBENCH_COMPILATION_MODE when set (a mode number or name); else what a measurement on
    this machine decided (`measured`: compiled faster -> VLLM_COMPILE, not -> NONE; see
    `workbench.config.compile_choice`); else DEFAULT_MODE."""
    env = os.environ.get(MODE_ENV, "").strip()
    if env:
        return _mode_of(env, f"mode from {MODE_ENV}")
    if measured is not None:
        return CompilationMode.VLLM_COMPILE if measured else CompilationMode.NONE
    return DEFAULT_MODE[device]


def cache_root() -> Path:
    """The workbench's cache root: $WORKBENCH_CACHE_DIR, default ~/.cache/workbench (the
    linear autotune's timings, the compiled-forward choice and inductor's caches live here)."""
    return Path(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "workbench"))


def default_cache_dir() -> Path:
    """$WORKBENCH_CACHE_DIR/torch_compile (default ~/.cache/workbench/torch_compile)."""
    return cache_root() / "torch_compile"


@dataclass
class CompilationConfig:
    """The fields of vLLM's CompilationConfig this engine implements (module docstring)."""

    # None: EngineConfig picks the default; a number or name is accepted and parsed here
    mode: CompilationMode | None = field(
        default=None, metadata={"accepts": CompilationMode | int | str | None})
    level: int | None = None  # vLLM's former name of `mode`; must agree with it when both given
    backend: str = "inductor"  # torch.compile backend: inductor | eager | aot_eager
    # token counts also compiled with a static shape (mode 3); a batch of exactly that many
    # tokens runs its own graph, any other count the dynamic one
    compile_sizes: list[int] = field(default_factory=list)
    cache_dir: str = ""  # inductor's caches; "" = default_cache_dir()
    inductor_compile_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.level is not None:
            level = _mode_of(self.level, "level")
            if self.mode is not None and _mode_of(self.mode, "mode") != level:
                raise ValueError(
                    f"compilation_config level ({self.level!r}) and mode ({self.mode!r}) "
                    "disagree; level is vLLM's former name of mode: give one"
                )
            self.mode = level
        if self.mode is not None:
            self.mode = _mode_of(self.mode, "mode")
            if self.mode not in SUPPORTED_MODES:
                raise ValueError(
                    f"compilation_config mode ({self.mode.value}, {self.mode.name}) is not "
                    "implemented; use 0 (NONE), 1 (STOCK_TORCH_COMPILE) or 3 (VLLM_COMPILE)"
                )
        if self.backend not in COMPILE_BACKENDS:
            raise ValueError(
                f"compilation_config backend ({self.backend!r}) must be one of "
                f"{', '.join(COMPILE_BACKENDS)}"
            )
        sizes = self.compile_sizes
        if not isinstance(sizes, list | tuple) or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(
                f"compilation_config compile_sizes ({sizes!r}) must be a list of token "
                "counts >= 1"
            )
        self.compile_sizes = sorted(set(sizes))
        if self.compile_sizes and self.mode == CompilationMode.STOCK_TORCH_COMPILE:
            raise ValueError(
                f"compilation_config compile_sizes ({self.compile_sizes}) needs mode 3 "
                "(VLLM_COMPILE); mode 1 is torch.compile with dynamo's own shape policy"
            )
        if not isinstance(self.cache_dir, str):
            raise ValueError(f"compilation_config cache_dir ({self.cache_dir!r}) must be a "
                             "folder path (a string; '' for the default)")
        if not isinstance(self.inductor_compile_config, dict):
            raise ValueError(
                f"compilation_config inductor_compile_config ({self.inductor_compile_config!r})"
                " must be a dict of inductor options, e.g. {\"freezing\": false}"
            )

    @property
    def compiles(self) -> bool:
        """True for a mode that runs torch.compile (after EngineConfig resolved the mode)."""
        return self.mode is not None and self.mode != CompilationMode.NONE

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()

    def inductor_options(self, device: str) -> dict[str, Any]:
        """The device's inductor defaults with the user's entries laid over them."""
        return {**INDUCTOR_DEFAULTS.get(device, {}), **self.inductor_compile_config}

    def describe(self) -> str:
        mode = self.mode
        if mode is None or mode == CompilationMode.NONE:
            return "NONE (eager)"
        return f"{mode.name} (backend {self.backend})"

    @classmethod
    def from_any(cls, value: CompilationConfig | dict[str, Any] | int | str | None
                 ) -> CompilationConfig:
        """An int / mode name (the mode alone), a dict of fields, or a CompilationConfig."""
        if isinstance(value, CompilationConfig):
            return value
        if value is None:
            return cls()
        if isinstance(value, dict):
            allowed = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - allowed)
            if unknown:
                raise ValueError(
                    f"compilation_config has unknown key(s) {', '.join(unknown)}; allowed: "
                    f"{', '.join(sorted(allowed))}"
                )
            return cls(**value)
        if isinstance(value, int | str) and not isinstance(value, bool):
            return cls(mode=_mode_of(value, "mode"))
        raise ValueError(
            f"compilation_config ({value!r}) must be a mode (0..3 or a name such as "
            "'VLLM_COMPILE') or a dict such as {'mode': 3}"
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "level"}
        if self.mode is not None:
            out["mode"] = int(self.mode)
        return out
