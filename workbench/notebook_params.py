"""Check a notebook's parameters (type and range) before it does any work.

Place in the flow: every notebook under notebooks/ opens the cell after its papermill
`parameters` cell (papermill puts the `injected-parameters` cell between the two) with

    from workbench.notebook_params import TRACKING, Int, Model, check_params
    check_params(globals(), model=Model(), max_num_seqs=Int(min=1), ..., **TRACKING)

so `papermill nb.ipynb out.ipynb -p max_num_seqs eight` (or `workbench sweep ... -p
max_num_seqs eight`) stops there with one `NotebookParameterError` naming the parameter, the
value and what is allowed, instead of failing somewhere later. Every problem is listed at once.
Types are strict: an integer parameter refuses 8.0 and True; a number accepts 8.
`Int(at_least="max_num_seqs", why=...)` relates two parameters (vLLM refuses a
max_num_batched_tokens below max_num_seqs). `workbench sweep` reads these declarations from
the notebook's source (`workbench.sweeps.notebook_specs`) and checks every value before the
first point runs.

One name per knob: a parameter that sets an engine knob carries the engine's name
(`max_num_batched_tokens`, as in SchedulerConfig and `vllm serve`); a list of values tried
against it is `<knob>_values`. A renamed parameter keeps working for a while through
`renamed_params(globals(), old="new")`: a FutureWarning naming the new name.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import UserError, did_you_mean


class NotebookParameterError(UserError):
    """One or more notebook parameters have the wrong type or are out of range."""


class Spec:
    """What one parameter must be: `problem(value)` says why it is not, or returns None."""

    def describe(self) -> str:
        raise NotImplementedError

    def problem(self, value: Any) -> str | None:
        raise NotImplementedError

    def relation_problem(self, value: Any, namespace: Mapping[str, Any]) -> str | None:
        """Why `value` does not fit the other parameters in `namespace`, or None."""
        return None


def _range(low: float | None, high: float | None, low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    return f" <= {high}" if high is not None else ""


@dataclass(frozen=True)
class Int(Spec):
    min: int | None = None
    max: int | None = None
    choices: tuple[int, ...] | None = None
    at_least: str | None = None  # another parameter this one must be >= (checked by name)
    why: str = ""  # said after an `at_least` problem: the rule's reason and its fix

    def relation_problem(self, value: Any, namespace: Mapping[str, Any]) -> str | None:
        other = namespace.get(self.at_least) if self.at_least else None
        if (isinstance(other, int) and isinstance(value, int) and not isinstance(value, bool)
                and value < other):
            return f">= {self.at_least} ({other})" + (f": {self.why}" if self.why else "")
        return None

    def describe(self) -> str:
        if self.choices:
            return f"an integer, one of {', '.join(map(str, self.choices))}"
        return "an integer" + _range(self.min, self.max)

    def problem(self, value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and (
            (self.min is None or value >= self.min) and (self.max is None or value <= self.max)
            and (not self.choices or value in self.choices))
        return None if ok else self.describe()


@dataclass(frozen=True)
class Float(Spec):
    min: float | None = None
    max: float | None = None
    min_open: bool = False  # True: value > min

    def describe(self) -> str:
        return "a number" + _range(self.min, self.max, self.min_open)

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            return self.describe()
        low = self.min is None or (value > self.min if self.min_open else value >= self.min)
        return None if low and (self.max is None or value <= self.max) else self.describe()


@dataclass(frozen=True)
class Str(Spec):
    choices: tuple[str, ...] | None = None
    nonempty: bool = False

    def describe(self) -> str:
        if self.choices:
            return f"one of {', '.join(repr(c) for c in self.choices)}"
        return "a non-empty string" if self.nonempty else "a string"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or (self.nonempty and not value):
            return self.describe()
        if self.choices and value not in self.choices:
            return self.describe() + did_you_mean(value, self.choices)
        return None


@dataclass(frozen=True)
class Bool(Spec):
    def describe(self) -> str:
        return "True or False"

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else self.describe()


@dataclass(frozen=True)
class List(Spec):
    item: Spec | None = None  # None: any items
    min_len: int = 1

    def describe(self) -> str:
        what = "a non-empty list" if self.min_len == 1 else (
            "a list" if self.min_len == 0 else f"a list of at least {self.min_len} items")
        return what + ("" if self.item is None else f", each {self.item.describe()}")

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, list) or len(value) < self.min_len:
            return self.describe()
        for i, v in enumerate(value):
            bad = None if self.item is None else self.item.problem(v)
            if bad is not None:
                return f"{self.describe()} (item {i}, {v!r}, is not {bad})"
        return None


@dataclass(frozen=True)
class Dict(Spec):
    def describe(self) -> str:
        return "a dict"

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, dict) else self.describe()


@dataclass(frozen=True)
class Model(Spec):
    """A local Hugging Face folder (config.json inside) or a shipped model name."""

    def describe(self) -> str:
        from workbench.config.named_models import NAMED_MODELS

        return f"a local model folder or one of {', '.join(NAMED_MODELS)}"

    def problem(self, value: Any) -> str | None:
        from workbench.config.named_models import NAMED_MODELS, resolve_model

        if isinstance(value, str) and value and (Path(resolve_model(value)) / "config.json"
                                                 ).is_file():
            return None
        hint = did_you_mean(value, NAMED_MODELS) if isinstance(value, str) else ""
        return self.describe() + hint


@dataclass(frozen=True)
class Fixture(Spec):
    """A workload fixture name (workbench.harness.workloads.FIXTURES)."""

    def describe(self) -> str:
        from workbench.harness.workloads import FIXTURES

        return f"one of {', '.join(sorted(FIXTURES))}"

    def problem(self, value: Any) -> str | None:
        from workbench.harness.workloads import FIXTURES

        if isinstance(value, str) and value in FIXTURES:
            return None
        return self.describe() + (did_you_mean(value, FIXTURES) if isinstance(value, str)
                                  else "")


BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)  # CacheConfig.block_size
CACHE_STATES = ("cold", "warm-model", "warm-prefix")  # the harness's cache states


def __getattr__(name: str) -> Any:
    if name == "QUANT_VARIANTS":  # keys of workbench.experiments.studies.quantization.VARIANTS
        from workbench.experiments.studies.quantization import VARIANTS

        return tuple(VARIANTS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The tracking parameters every notebook declares (workbench.analysis.notebook).
TRACKING: dict[str, Spec] = {
    "figures_dir": Str(), "mlflow_uri": Str(), "mlflow_parent_run_id": Str(),
    "mlflow_experiment": Str(),
}


def _kind(value: Any) -> str:
    return type(value).__name__


def parameter_problems(namespace: Mapping[str, Any], specs: Mapping[str, Spec]
                       ) -> list[str]:
    """One line per parameter of `specs` that `namespace` lacks or holds a bad value for."""
    out: list[str] = []
    for name, spec in specs.items():
        if name not in namespace:
            out.append(f"{name} is not defined (the parameters cell must assign it)")
            continue
        value = namespace[name]
        bad = spec.problem(value)
        if bad is None:
            bad = spec.relation_problem(value, namespace)
        if bad is not None:
            out.append(f"{name} ({value!r}, a {_kind(value)}) must be {bad}")
    return out


def check_params(namespace: Mapping[str, Any], **specs: Spec) -> None:
    """`NotebookParameterError` listing every parameter of `specs` that is missing from
    `namespace` (a notebook's `globals()`) or has the wrong type or range."""
    problems = parameter_problems(namespace, specs)
    if len(problems) == 1:
        raise NotebookParameterError(f"notebook parameter {problems[0]}")
    if problems:
        raise NotebookParameterError(
            f"{len(problems)} notebook parameters are invalid: " + "; ".join(problems))


def renamed_params(namespace: MutableMapping[str, Any], **renamed: str) -> None:
    """Accept the old name of a renamed parameter: `renamed_params(globals(),
    baseline_budget="max_num_batched_tokens")` before `check_params`. An old name papermill
    injected (`-p baseline_budget 256`, `workbench sweep ... baseline_budget`) gives a
    FutureWarning naming the new one, and its value moves to the new name (the old one is
    removed). `workbench sweep` reads the same call (`sweeps.notebook_specs`)."""
    for old, new in renamed.items():
        if old in namespace:
            warnings.warn(f"notebook parameter {old} is renamed {new}; {old} will stop "
                          f"working: pass -p {new} ...", FutureWarning, stacklevel=2)
            namespace[new] = namespace.pop(old)
