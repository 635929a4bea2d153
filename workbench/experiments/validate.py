"""Check a whole experiment template before its first run, and list every problem at once.

Place in the flow: `load_template` and `run_experiment` call `check_template`; a template with
problems raises one `TemplateError` listing them all, and nothing is run or logged. Checked:

    top-level keys, repeats, cache_state, noise, objective, slo and quality_gate keys
    rate_sweep  the block and what it rules out beside it (`experiments.rate_sweep`): then
                the objective is goodput and `arrivals` gives only mode/seed/max_concurrency
    target      kind and keys; the model folder (`target.model`: config.json + *.safetensors)
                and the tokenizer the workload is built with (`target.tokenizer`, else model)
    workload    fixture name and params, a jsonl file, or a trace (file, format, params:
                `harness.traces`); then the workload is built (lengths, max_model_len)
    arrivals    keys, mode and values (`ArrivalSpec`)
    engine      every baseline key and `variable.name` is a knob; the baseline's and each
                variant's EngineConfig is built (config.json is read, no weights are loaded),
                so `max_num_batched_tokens: 64` beside the default `max_num_seqs: 256` is
                refused here, not run by run; the longest prompt fits max_model_len

Engine configs are checked for in-process targets and for http targets whose `command` starts
the workbench's own server (`workbench serve` / `workbench router`; the router's own knobs,
such as `policy`, are its flags); a foreign server (`vllm serve ...`) checks its own flags.
Unknown names get a "did you mean" from the known ones.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workbench.errors import TemplateError, did_you_mean, is_int
from workbench.experiments.validate_engine import check_engine, check_simulated, check_target

WORKLOAD_KEYS = ("fixture", "jsonl", "trace", "format", "seed", "params", "name")


@dataclass
class Checked:
    """What `template_problems` found, and the workload it built on the way (or None)."""

    problems: list[str]
    workload: Any = None


def check_template(data: dict[str, Any], source: str = "template",
                   consequence: str = "nothing was run") -> Any:
    """The workload built while checking `data` (a raw template dict); `TemplateError`
    listing every problem otherwise."""
    checked = template_problems(data)
    if checked.problems:
        raise TemplateError(source, checked.problems, consequence)
    return checked.workload


def template_problems(data: Any) -> Checked:
    """Every problem in a raw template dict (nothing is run)."""
    from workbench.experiments.template_keys import _TOP_KEYS

    if not isinstance(data, dict):
        return Checked([f"a template must be a mapping of keys, not {type(data).__name__}"])
    out: list[str] = []
    for key in sorted(set(data) - _TOP_KEYS, key=str):
        out.append(f"unknown template key {key!r}{did_you_mean(key, sorted(_TOP_KEYS))}")
    for key in ("name", "question", "workload", "baseline"):
        if key not in data:
            out.append(f"template is missing {key!r}")
    _check_scalars(data, out)
    _check_mappings(data, out)
    if "cluster" in data:  # the executor's block (`executors.config.cluster_problems`)
        from workbench.experiments.executors.config import cluster_problems

        out.extend(cluster_problems(data["cluster"]))
    sweep = "rate_sweep" in data
    if sweep:
        from workbench.experiments.rate_sweep import rate_sweep_problems

        out.extend(rate_sweep_problems(data))
    baseline = data.get("baseline") or {}
    if not isinstance(baseline, dict):
        out.append(f"baseline must be a mapping of engine knobs, not {baseline!r}")
        baseline = {}
    name, values = _variable(data, baseline, out)
    target = data.get("target") or {"kind": "in-process", "model": "bundled"}
    if not isinstance(target, dict):
        out.append(f"target must be a mapping, not {target!r}")
        target = {}
    model, tokenizer, server = check_target(target, out)
    workload = _check_workload(data.get("workload"), tokenizer, out)
    if not sweep:  # a sweep's arrivals are checked with its block
        _check_arrivals(data.get("arrivals") or {"mode": "closed", "concurrency": 4}, out)
    _check_trace_times(data.get("arrivals"), workload, out)
    if server == "simulated":
        check_simulated(baseline, name, values, target, out)
    elif server != "foreign":
        check_engine(baseline, name, values, model, target, server, workload, out)
    return Checked(out, workload)


# --------------------------------------------------------------------------- plain fields

def _check_scalars(data: dict[str, Any], out: list[str]) -> None:
    from workbench.experiments.template_keys import CACHE_STATES, DIRECTIONS

    repeats = data.get("repeats", 3)
    if not is_int(repeats) or repeats < 1:
        out.append(f"repeats ({repeats!r}) must be an integer >= 1")
    warmup = data.get("warmup_requests", 2)
    if not is_int(warmup) or warmup < 0:
        out.append(f"warmup_requests ({warmup!r}) must be an integer >= 0")
    cache = data.get("cache_state", "warm-model")
    if cache not in CACHE_STATES:
        out.append(f"cache_state ({cache!r}) must be one of {', '.join(CACHE_STATES)}"
                   f"{did_you_mean(cache, CACHE_STATES)}")
    noise = data.get("noise", "spread")
    if noise not in ("spread", "bootstrap"):
        out.append(f"noise ({noise!r}) must be 'spread' or 'bootstrap'")
    from workbench.experiments.template_keys import verdict_key_problem

    for key, default in (("smallest_effect", 0.02), ("alpha", 0.05), ("max_repeats", None)):
        problem = verdict_key_problem(key, data.get(key, default),
                                      repeats if is_int(repeats) else 1)
        if problem:
            out.append(problem)
    share = data.get("max_other_cpu_share", 0.0)
    if not _number(share) or not 0 <= share <= 1:
        out.append(f"max_other_cpu_share ({share!r}) must be a share of the CPUs in [0, 1]")
    objective = data.get("objective") or {}
    if "rate_sweep" in data and isinstance(objective, dict):
        return  # a sweep's objective is goodput (`rate_sweep_problems`)
    if not isinstance(objective, dict):
        out.append(f"objective must be {{metric: NAME, direction: minimize|maximize}}, "
                   f"not {objective!r}")
        return
    for key in sorted(set(objective) - {"metric", "direction"}, key=str):
        out.append(f"unknown objective key {key!r}{did_you_mean(key, ['metric', 'direction'])}")
    d = objective.get("direction")
    if d is not None and d not in DIRECTIONS:
        out.append(f"objective.direction ({d!r}) must be one of {', '.join(DIRECTIONS)}"
                   f"{did_you_mean(d, DIRECTIONS)}")
        d = None
    _check_objective_metric(objective.get("metric", "output_throughput"), d,
                            "direction" in objective, out)


def _check_objective_metric(metric: Any, direction: str | None, given: bool,
                            out: list[str]) -> None:
    """The objective names a metric a run computes (the metric registry), and its direction
    agrees with the registry's."""
    from workbench.metrics import registry

    known = registry.metric_names()
    row = registry.spec(metric, registry.DEFAULT_PERCENTILES) if isinstance(metric, str) else None
    if row is None or row.source == "prometheus":
        out.append(f"objective.metric ({metric!r}) is not a metric a run computes"
                   f"{did_you_mean(metric, known)}; the metrics are listed in docs/metrics.md")
    elif row.objective is None and not given:
        out.append(f"objective.metric {metric} has no better direction (metric registry: "
                   "direction none); give objective.direction: minimize|maximize")
    elif row.objective is not None and direction is not None and direction != row.objective:
        out.append(f"objective.direction ({direction!r}) contradicts the metric registry "
                   f"({metric}: {row.direction} is better, so {row.objective})")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_mappings(data: dict[str, Any], out: list[str]) -> None:
    """slo and quality_gate: known keys, numbers."""
    from workbench.experiments.template_keys import SLO_KEYS

    slo = data.get("slo") or {}
    if not isinstance(slo, dict):
        out.append(f"slo must be a mapping such as {{p95_ttft_ms: 1000}}, not {slo!r}")
        slo = {}
    for key, v in slo.items():
        if key not in SLO_KEYS:
            out.append(f"unknown slo key {key!r}{did_you_mean(key, SLO_KEYS)}; allowed: "
                       f"{', '.join(SLO_KEYS)}")
        elif not _number(v) or v < 0:
            out.append(f"slo.{key} ({v!r}) must be a number >= 0")
    gate = data.get("quality_gate")
    if gate is None:
        return
    if not isinstance(gate, dict):
        out.append(f"quality_gate ({gate!r}) must be a mapping of thresholds")
        return
    from workbench.experiments.quality_report import (
        GATE_KEYS,
        NEEDLE,
        OPTIONS,
        THRESHOLDS,
        needle_problems,
    )

    for key, v in gate.items():
        if key not in GATE_KEYS:
            out.append(f"unknown quality_gate key {key!r}{did_you_mean(key, GATE_KEYS)}; "
                       f"allowed: {', '.join(GATE_KEYS)}")
        elif key == NEEDLE and v is not None:
            out.extend(needle_problems(v))
        elif key in THRESHOLDS and v is not None and not _number(v):
            out.append(f"quality_gate.{key} ({v!r}) must be a number")
        elif key in OPTIONS and v is not None and (not is_int(v) or v < 1):
            out.append(f"quality_gate.{key} ({v!r}) must be an integer >= 1")


def _variable(data: dict[str, Any], baseline: dict[str, Any], out: list[str]
              ) -> tuple[str | None, list[Any]]:
    """(variable name, values) from `variable` or `variants`; problems appended."""
    from workbench.experiments.template_keys import one_variable

    if "variable" in data and "variants" in data:
        out.append("give either 'variable' or 'variants', not both")
        return None, []
    if "variants" in data:
        variants = data["variants"]
        if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
            out.append("variants must be a list of engine configs (mappings)")
            return None, []
        try:
            name = one_variable(baseline, variants)
        except ValueError as e:
            out.append(str(e))
            return None, []
        return name, [v.get(name) for v in variants]
    var = data.get("variable")
    if var is None:
        out.append("the template must name one 'variable' (or 'variants')")
        return None, []
    if not isinstance(var, dict) or set(var) != {"name", "values"}:
        out.append(f"variable must be {{name: <engine knob>, values: [...]}}, not {var!r}")
        return None, []
    name, values = str(var["name"]), var["values"]
    if not isinstance(values, list) or not values:
        out.append(f"variable.values ({values!r}) must be a non-empty list of values to try "
                   "against the baseline")
        return name, []
    if name in baseline and baseline[name] in values:
        out.append(f"variable {name} value {baseline[name]!r} equals the baseline; list only "
                   "the changed values (the baseline is always run)")
    keys = [json.dumps(v, sort_keys=True, default=str) for v in values]
    if len(set(keys)) != len(keys):
        out.append(f"variable.values ({values!r}) contain duplicates")
    return name, values


# --------------------------------------------------------------------------- workload
def _fixture_params(name: str) -> tuple[str, ...]:
    from workbench.harness.workloads import fixture_params

    return tuple(sorted(fixture_params(name)))


def _check_workload(spec: Any, tokenizer: str | None, out: list[str]) -> Any:
    """The built workload, or None (problems appended)."""
    from workbench.harness.workloads import FIXTURES, load_jsonl, make_workload

    if spec is None:
        return None
    if not isinstance(spec, dict):
        out.append(f"workload must be a mapping with 'fixture' (or 'jsonl' or 'trace'), "
                   f"not {spec!r}")
        return None
    n = len(out)
    for key in sorted(set(spec) - set(WORKLOAD_KEYS), key=str):
        out.append(f"unknown workload key {key!r}{did_you_mean(key, WORKLOAD_KEYS)}")
    fixture, params = spec.get("fixture"), spec.get("params") or {}
    if "format" in spec and "trace" not in spec:
        out.append("workload.format names a trace file's format; give it with 'trace'")
    if "trace" in spec:
        if fixture is not None or "jsonl" in spec:
            out.append("workload names 'trace' beside 'fixture' or 'jsonl'; give one")
        else:
            from workbench.harness.traces import trace_spec_problems

            out.extend(trace_spec_problems(spec))
    elif "jsonl" in spec:
        if fixture is not None:
            out.append("workload names both 'fixture' and 'jsonl'; give one")
        elif not Path(str(spec["jsonl"])).is_file():
            out.append(f"workload.jsonl ({str(spec['jsonl'])!r}) is not a file")
    elif fixture is None:
        out.append("workload must name a 'fixture' or a 'jsonl' file (or a 'trace' file)")
    elif fixture not in FIXTURES:
        out.append(f"workload.fixture ({fixture!r}) is not a fixture"
                   f"{did_you_mean(fixture, FIXTURES)}; fixtures: {', '.join(sorted(FIXTURES))}")
    elif not isinstance(params, dict):
        out.append(f"workload.params must be a mapping, not {params!r}")
    else:
        allowed = _fixture_params(fixture)
        for key in sorted(set(params) - set(allowed), key=str):
            out.append(f"unknown workload.params key {key!r} for fixture {fixture!r}"
                       f"{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
    seed = spec.get("seed", 0)
    if not is_int(seed):
        out.append(f"workload.seed ({seed!r}) must be an integer")
    if len(out) > n or tokenizer is None:
        return None
    try:
        from workbench.models.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer)
        if "jsonl" in spec:
            return load_jsonl(spec["jsonl"], tokenizer=tok, name=spec.get("name"))
        if "trace" in spec:
            from workbench.harness.traces import load_trace_spec

            return load_trace_spec(spec, tok)
        assert isinstance(fixture, str)  # a key of FIXTURES: checked above (else out grew)
        return make_workload(fixture, seed, tok, **params)
    except (ValueError, TypeError) as e:
        out.append(f"workload: {e}")
    except Exception as e:  # noqa: BLE001 - a broken tokenizer folder, named
        out.append(f"workload: cannot build it with the tokenizer in {tokenizer}: "
                   f"{type(e).__name__}: {e}")
    return None


def _check_trace_times(arrivals: Any, workload: Any, out: list[str]) -> None:
    """`arrivals: {mode: trace}` needs every request that follows none to have arrival_s."""
    if not isinstance(arrivals, dict) or arrivals.get("mode") != "trace" or workload is None:
        return
    timeless = sum(1 for r in workload.requests if r.arrival_s is None and r.follows is None)
    if timeless:
        out.append(f"arrivals.mode 'trace' replays the workload's arrival_s, but {timeless} of "
                   f"its {len(workload.requests)} requests have none (a ShareGPT trace records "
                   "no times); choose mode poisson, gamma, constant or closed")


def _check_arrivals(spec: Any, out: list[str]) -> None:
    from workbench.harness.arrivals import MODES, ArrivalSpec

    if not isinstance(spec, dict):
        out.append(f"arrivals must be a mapping with 'mode', not {spec!r}")
        return
    allowed = [f.name for f in fields(ArrivalSpec)]
    unknown = sorted(set(spec) - set(allowed), key=str)
    for key in unknown:
        out.append(f"unknown arrivals key {key!r}{did_you_mean(key, allowed)}")
    mode = spec.get("mode")
    if mode is not None and mode not in MODES:
        out.append(f"arrivals.mode ({mode!r}) must be one of {', '.join(MODES)}"
                   f"{did_you_mean(mode, MODES)}")
        return
    if not unknown:
        try:
            ArrivalSpec.from_dict(spec)
        except (ValueError, TypeError) as e:
            out.append(f"arrivals: {e}")
