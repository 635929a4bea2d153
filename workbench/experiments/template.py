"""Experiment templates: the contract of one question (seed 001's method).

A template (YAML, `experiments/*.yaml`) fixes the SLO, the workload, the arrivals, the target
and the baseline engine config, then names exactly ONE variable:

    name: chunked-prefill-budget
    question: Does a smaller max_num_batched_tokens cut p95 ITL without breaking p95 TTFT?
    objective: {metric: p95_itl_ms, direction: minimize}
    slo: {p95_ttft_ms: 3000, p95_tpot_ms: 500, max_error_rate: 0.0}
    workload: {fixture: long-prefill, seed: 0, params: {num_requests: 16}}
    arrivals: {mode: poisson, rate: 8.0, seed: 0}
    target: {kind: in-process, model: bundled}
    baseline: {max_num_batched_tokens: 512, dtype: float32}
    variable: {name: max_num_batched_tokens, values: [64, 128, 256, 1024]}
    repeats: 3
    max_repeats: 10            # optional: add repeat rounds while undecided (sequential.py)
    smallest_effect: 0.02      # optional: +-2% counts as "no change" (default 0.02)
    alpha: 0.05                # optional: the verdict's error rate (default 0.05)
    cache_state: warm-model
    quality_gate: {min_token_agreement: 1.0, num_prompts: 4}   # optional

`objective.metric` and the `slo` keys are names of the metric registry
(`workbench.metrics.registry`, docs/metrics.md); `objective.direction` defaults to the
registry's direction for the metric.

The verdict (workbench.experiments.verdict, verdict_rule): per metric better / worse /
no change / undecided from a Welch t interval of the relative effect on log values. `noise`
(spread | bootstrap) is deprecated: the verdict ignores it (a FutureWarning says so); it
still sets `workbench rerun`'s drift band.

`quality_gate` (workbench.experiments.quality): thresholds `min_token_agreement`,
`max_ppl_increase_pct`, `max_mean_kl`, `min_top1_agreement` and options `num_prompts`,
`max_tokens`, `ppl_tokens`, `ppl_context`; and `needle: {min_accuracy: 0.9, lengths: [...],
depths: [...], cases_per_cell: 4, seed: 0}`, passkey retrieval on the template's model
(`model: needle`; workbench.experiments.needle); a variant that misses a threshold is never
adopted.

`rate_sweep` (optional, `workbench.experiments.rate_sweep`): measure each value's goodput
over a sweep of Poisson request rates instead of one run; the objective is then goodput.

`cluster` (optional, `workbench.experiments.executors.config`): what each run asks of a Ray
cluster under `--executor ray`: `num_cpus`, `num_gpus`, and `runs_per_node` (default 1: a run
holds a whole node; 2+: that many runs may share one). Ignored by the local executor.

Instead of `variable`, `variants:` may list full engine configs; each must differ from the
baseline in the same single key, and anything else is refused naming the keys.

`load_template` checks the whole template first (`workbench.experiments.validate`: knob names,
every variant's engine config, the model folder, the workload, arrivals) and refuses it with
one `TemplateError` listing every problem; `parse_template` alone checks only the structure.
"""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import UserError
from workbench.experiments.path_names import check_path_name
from workbench.experiments.rate_sweep import RateSweep, parse_rate_sweep
from workbench.experiments.template_keys import (  # noqa: F401 - re-exported names
    _TOP_KEYS,
    CACHE_STATES,
    DIRECTIONS,
    SLO_KEYS,
    one_variable,
    verdict_key_problem,
)
from workbench.metrics.registry import spec as metric_spec


@dataclass
class Objective:
    """The metric to improve; `direction` defaults to the metric registry's."""

    metric: str = "output_throughput"
    direction: str = None  # type: ignore[assignment]  # resolved in __post_init__

    def __post_init__(self) -> None:
        if self.direction is None:
            row = metric_spec(self.metric)
            self.direction = (row.objective if row is not None else None) or "maximize"
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"objective.direction ({self.direction!r}) must be one of {', '.join(DIRECTIONS)}"
            )

    def better(self, delta: float) -> bool:
        return delta < 0 if self.direction == "minimize" else delta > 0


@dataclass
class Template:
    name: str
    question: str
    objective: Objective
    slo: dict[str, float]
    workload: dict[str, Any]
    arrivals: dict[str, Any]
    target: dict[str, Any]
    baseline: dict[str, Any]
    variable_name: str
    variable_values: list[Any]
    repeats: int = 3
    cache_state: str = "warm-model"
    quality_gate: dict[str, Any] | None = None
    warmup_requests: int = 2
    noise: str = "spread"  # deprecated for the verdict: `workbench rerun`'s drift band only
    smallest_effect: float = 0.02  # |relative effect| inside this: "no change" (0.02 = +-2%)
    alpha: float = 0.05  # the verdict's error rate (two-sided), over all planned looks
    max_repeats: int | None = None  # repeat rounds while undecided up to this; None: repeats
    rate_sweep: RateSweep | None = None  # goodput per value over a rate sweep (rate_sweep.py)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_path_name("name", self.name)  # it names results/<name>/: never a path
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats ({self.repeats}) must be an integer >= 1")
        if self.cache_state not in CACHE_STATES:
            raise ValueError(
                f"cache_state ({self.cache_state!r}) must be one of {', '.join(CACHE_STATES)}"
            )
        if self.noise not in ("spread", "bootstrap"):
            raise ValueError(f"noise ({self.noise!r}) must be 'spread' or 'bootstrap'")
        problem = verdict_key_problem("smallest_effect", self.smallest_effect) or \
            verdict_key_problem("alpha", self.alpha) or \
            verdict_key_problem("max_repeats", self.max_repeats, 1)
        if problem:
            raise ValueError(problem)
        unknown = sorted(set(self.slo) - set(SLO_KEYS))
        if unknown:
            raise ValueError(
                f"slo keys {', '.join(unknown)} are not known; allowed: {', '.join(SLO_KEYS)}"
            )
        if not {"fixture", "jsonl", "trace"} & set(self.workload):
            raise ValueError("workload must name a 'fixture' or a 'jsonl' file (or a 'trace' "
                             "file)")
        if not self.variable_values:
            raise ValueError(f"variable {self.variable_name!r} has no values")
        if self.quality_gate is not None:
            if not isinstance(self.quality_gate, dict):
                raise ValueError(
                    f"quality_gate ({self.quality_gate!r}) must be a mapping of thresholds"
                )
            from workbench.experiments.quality_report import check_gate

            check_gate(self.quality_gate)

    @property
    def repeat_cap(self) -> int:
        """The most repeats per side: `max_repeats` (never below `repeats`)."""
        return max(self.repeats, self.max_repeats or self.repeats)

    @property
    def planned_looks(self) -> int:
        """Verdicts the adaptive design may take: after `repeats`, then after each round."""
        return self.repeat_cap - self.repeats + 1

    def variant_config(self, value: Any) -> dict[str, Any]:
        """The baseline engine config with the one variable set to `value`."""
        cfg = copy.deepcopy(self.baseline)
        cfg[self.variable_name] = value
        return cfg

    def as_data(self) -> dict[str, Any]:
        """The template as a raw dict built from its fields (what `check_template` reads;
        fields changed after parsing, as notebooks do, are what is checked and run)."""
        data = copy.deepcopy({k: v for k, v in self.raw.items() if k not in ("variants",)})
        data.update(copy.deepcopy({
            "name": self.name, "question": self.question,
            "objective": {"metric": self.objective.metric,
                          "direction": self.objective.direction},
            "slo": self.slo, "workload": self.workload, "arrivals": self.arrivals,
            "target": self.target, "baseline": self.baseline,
            "variable": {"name": self.variable_name,
                         "values": [dict(v) if isinstance(v, dict) else v
                                    for v in self.variable_values]},
            "repeats": self.repeats, "cache_state": self.cache_state,
            "warmup_requests": self.warmup_requests, "noise": self.noise,
            "smallest_effect": self.smallest_effect, "alpha": self.alpha}))
        if self.max_repeats is not None:
            data["max_repeats"] = self.max_repeats
        if "noise" not in self.raw and self.noise == "spread":
            data.pop("noise")  # the default, not written (it is deprecated)
        if self.quality_gate is not None:
            data["quality_gate"] = copy.deepcopy(self.quality_gate)
        else:
            data.pop("quality_gate", None)
        if self.rate_sweep is not None:
            data["rate_sweep"] = self.rate_sweep.to_dict()
        else:
            data.pop("rate_sweep", None)
        return data

    def with_baseline(self, baseline: dict[str, Any]) -> dict[str, Any]:
        """The raw template with a new baseline (what `workbench promote` writes)."""
        raw = copy.deepcopy(self.raw)
        raw["baseline"] = copy.deepcopy(baseline)
        return raw




class KnobValue(dict[str, Any]):
    """A dict-valued knob value (e.g. a `speculative_config`) that can key the per-value
    tables of an experiment: hashed by its canonical JSON, equal to the plain dict."""

    def __hash__(self) -> int:  # type: ignore[override]  # dict sets __hash__ = None
        return hash(json.dumps(self, sort_keys=True, default=str))


yaml.SafeDumper.add_representer(KnobValue, yaml.representer.SafeRepresenter.represent_dict)


def _hashable(value: Any) -> Any:
    return KnobValue(value) if isinstance(value, dict) else value


def parse_template(data: dict[str, Any]) -> Template:
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ValueError(
            f"unknown template key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TOP_KEYS))}"
        )
    for key in ("name", "question", "workload", "baseline"):
        if key not in data:
            raise ValueError(f"template is missing {key!r}")
    baseline = dict(data["baseline"] or {})
    if "variable" in data and "variants" in data:
        raise ValueError("give either 'variable' or 'variants', not both")
    if "variable" in data:
        var = data["variable"]
        if not isinstance(var, dict) or set(var) != {"name", "values"}:
            raise ValueError("variable must be {name: <engine knob>, values: [...]}")
        name, values = str(var["name"]), list(var["values"])
    elif "variants" in data:
        variants = [dict(v) for v in data["variants"]]
        name = one_variable(baseline, variants)
        values = [v[name] for v in variants]
    else:
        raise ValueError("template must name one 'variable' (or 'variants')")
    values = [_hashable(v) for v in values]
    if name in baseline and baseline[name] in values:
        raise ValueError(
            f"variable {name} value {baseline[name]!r} equals the baseline; list only the "
            "changed values (the baseline is always run)"
        )
    if "noise" in data:
        warnings.warn(f"template key noise ({data['noise']!r}) is deprecated: the verdict "
                      "ignores it and uses a Welch t interval (keys alpha, smallest_effect, "
                      "max_repeats; docs/experiments.md); it only sets `workbench rerun`'s "
                      "drift band. Remove it to silence this.", FutureWarning, stacklevel=2)
    repeats = int(data.get("repeats", 3))
    cap = data.get("max_repeats")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap < repeats:
        raise ValueError(f"max_repeats ({cap}) must be >= repeats ({repeats}); leave it out "
                         "for no extra rounds")
    sweep = parse_rate_sweep(data)  # None without `rate_sweep`; its rules in rate_sweep.py
    if sweep is None:
        objective = Objective(**(data.get("objective") or {}))
        arrivals = dict(data.get("arrivals") or {"mode": "closed", "concurrency": 4})
    else:  # the objective is goodput; the sweep sets the Poisson rate per point
        objective = Objective((data.get("objective") or {}).get("metric", "goodput"),
                              "maximize")
        arrivals = dict(data.get("arrivals") or {})
    return Template(
        name=str(data["name"]),
        question=str(data["question"]),
        objective=objective,
        slo=dict(data.get("slo") or {}),
        workload=dict(data["workload"]),
        arrivals=arrivals,
        target=dict(data.get("target") or {"kind": "in-process", "model": "bundled"}),
        baseline=baseline,
        variable_name=name,
        variable_values=values,
        repeats=repeats,
        cache_state=str(data.get("cache_state", "warm-model")),
        quality_gate=data.get("quality_gate"),
        warmup_requests=int(data.get("warmup_requests", 2)),
        noise=str(data.get("noise", "spread")),
        smallest_effect=data.get("smallest_effect", 0.02),
        alpha=data.get("alpha", 0.05),
        max_repeats=cap,
        rate_sweep=sweep,
        raw=copy.deepcopy(data),
    )


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """A YAML file's content; `UserError` naming the file (and the line) otherwise."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} ({str(path)!r}) is not a file")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{p}{where}: not valid YAML: {problem}") from e


def load_template(path: str | Path) -> Template:
    """Read, check (every problem at once, `TemplateError`) and parse a template file."""
    from workbench.experiments.validate import check_template

    data = read_yaml(path, "template")
    check_template(data, source=str(path))
    return parse_template(data)
