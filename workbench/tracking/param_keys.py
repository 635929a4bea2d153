"""One parameter naming on every path: the MLflow param key of each knob.

A knob is logged under the same key whether it comes from a template (`workbench run`, every
child run), a sweep point (`workbench sweep` of a notebook) or a notebook's own `publish`, so
runs of the same knob line up in one MLflow compare view. The keys are vLLM's knob names:

    engine knobs          bare, as in EngineConfig / `vllm serve`: max_num_batched_tokens,
                          max_num_seqs, enable_prefix_caching, dtype, block_size, ...
    speculative_config    its fields: num_speculative_tokens, speculative_method,
                          speculative_model, speculative_<field>; `speculative_config: null`
                          (speculation off) logs num_speculative_tokens = 0 (notebook 07's k=0)
    arrivals              request_rate (rate), concurrency, max_concurrency, burstiness,
                          ramp_up_s, arrival_mode (mode), arrival_seed (seed)
    workload              workload (the fixture), workload_seed, workload_jsonl,
                          workload_name, and its params bare (num_requests, prefix_len, ...)
    a trace workload      workload.trace.<key> (`trace_keys`): format, path, sha256 (the
                          file's), every trace option with its default filled in (rate_scale,
                          max_requests, start_s, duration_s, max_model_len, ...), num_requests
                          (kept), records_read, dropped.<reason>; from the built workload
                          when the caller has it, else the template's path, format and params
    everything else       as it was: cache_state, model, repeat, target.<field>

Notebook parameters that name a knob differently are mapped at logging time (`NOTEBOOK`),
e.g. notebook 03's `baseline_budget` / `budgets` -> max_num_batched_tokens. When two names
of one mapping would give the same key, the swept parameter (or the one already named by its
key) takes it and the other keeps its own name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SPECULATIVE_FIELDS = {"num_speculative_tokens": "num_speculative_tokens",
                      "method": "speculative_method", "model": "speculative_model"}
ARRIVALS = {"rate": "request_rate", "mode": "arrival_mode", "seed": "arrival_seed"}
TRACE = "workload.trace."
WORKLOAD = {"fixture": "workload", "seed": "workload_seed", "jsonl": "workload_jsonl",
            "name": "workload_name", "trace": TRACE + "path", "format": TRACE + "format"}
# a built trace workload's params (harness/traces/build.py) -> their key after TRACE
TRACE_RENAMED = {"file_sha256": "sha256"}
# notebook parameter -> knob key (only the names that differ from the key)
NOTEBOOK = {
    "baseline_budget": "max_num_batched_tokens",
    "budgets": "max_num_batched_tokens",
    "budget": "max_num_batched_tokens",
    "rate": "request_rate",
    "caching": "enable_prefix_caching",
    "concurrencies": "concurrency",
    "k": "num_speculative_tokens",
    "method": "speculative_method",
    "draft_model": "speculative_model",
    "block_sizes": "block_size",
    "max_model_lens": "max_model_len",
}


def speculative_key(field: str) -> str:
    return SPECULATIVE_FIELDS.get(field, f"speculative_{field}")


def engine_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """An engine config as {knob key: value}: knobs bare, speculative_config by its fields,
    other dict-valued knobs as <knob>.<field> (flattened by the store)."""
    out: dict[str, Any] = {}
    for knob, value in config.items():
        if knob == "speculative_config":
            if value is None:
                out["num_speculative_tokens"] = 0
            elif isinstance(value, Mapping):
                out.update({speculative_key(f): v for f, v in value.items()})
            else:
                out[knob] = value
        else:
            out[knob] = value
    return out


def arrival_params(arrivals: Mapping[str, Any]) -> dict[str, Any]:
    return {ARRIVALS.get(k, k): v for k, v in arrivals.items()}


def trace_keys(built: Any) -> dict[str, Any]:
    """A built trace workload's keys (`harness.traces`: `Workload.params` with source
    "trace"): workload.trace.<format, path, sha256, each option, records_read, dropped> and
    workload.trace.num_requests (the requests kept); {} for any other workload."""
    params = getattr(built, "params", None)
    if not isinstance(params, Mapping) or params.get("source") != "trace":
        return {}
    out: dict[str, Any] = {}
    for k, v in params.items():
        if k != "source":
            out[TRACE + TRACE_RENAMED.get(str(k), str(k))] = v
    out[TRACE + "num_requests"] = len(built.requests)
    return out


def workload_params(workload: Mapping[str, Any], built: Any = None) -> dict[str, Any]:
    """A template's workload block as keys; a trace's (`trace` in it) under TRACE, from the
    `built` workload when given (`trace_keys`: defaults, sha256, counts), else from the
    block (path, format, params)."""
    if "trace" in workload:
        out = {WORKLOAD[k]: workload[k] for k in ("seed", "name") if k in workload}
        from_built = trace_keys(built)
        if from_built:
            return {**out, **from_built}
        out.update({WORKLOAD[k]: workload[k] for k in ("trace", "format") if k in workload})
        out.update({TRACE + k: v for k, v in dict(workload.get("params") or {}).items()})
        return out
    out = {WORKLOAD.get(k, k): v for k, v in workload.items() if k != "params"}
    out.update(dict(workload.get("params") or {}))
    return out


def run_params(engine: Mapping[str, Any], workload: Mapping[str, Any],
               arrivals: Mapping[str, Any], *, built: Any = None, **rest: Any
               ) -> dict[str, Any]:
    """The params of one measured run: engine knobs, then arrivals, then workload (`built`:
    the workload the run replays, for a trace's resolved keys), then `rest` (cache_state,
    model, repeat, target ...). A later group never overwrites an earlier key: a clash keeps
    the later one under its group (`arrivals.<k>`, `workload.<k>`)."""
    out = dict(engine_params(engine))
    for group, params in (("arrivals", arrival_params(arrivals)),
                          ("workload", workload_params(workload, built)), ("", rest)):
        for k, v in params.items():
            out[k if k not in out else f"{group or 'run'}.{k}"] = v
    return out


def notebook_params(params: Mapping[str, Any], swept: str | None = None) -> dict[str, Any]:
    """A notebook's parameters with the knob names of `NOTEBOOK` mapped to their keys.
    When several names map to one key, the `swept` one wins, else a name that already is the
    key, else the first; the others keep their own names."""
    claims: dict[str, list[str]] = {}
    for name in params:
        claims.setdefault(NOTEBOOK.get(name, name), []).append(name)
    owner: dict[str, str] = {}
    for key, names in claims.items():
        owner[key] = (swept if swept in names else key if key in names else names[0])
    out: dict[str, Any] = {}
    for name, value in params.items():
        key = NOTEBOOK.get(name, name)
        out[key if owner[key] == name else name] = value
    return out


def param_key(name: str) -> str:
    """The key one knob is logged under, from any of its names: a notebook parameter
    (`budgets`), a template path (`arrivals.rate`, `speculative_config.method`,
    `workload.params.num_requests`) or the key itself."""
    if name in NOTEBOOK:
        return NOTEBOOK[name]
    head, _, rest = name.partition(".")
    if head == "engine" and rest:
        return param_key(rest)
    if head == "speculative_config" and rest:
        return speculative_key(rest)
    if head == "arrivals" and rest:
        return ARRIVALS.get(rest, rest)
    if head == "workload" and rest:
        return rest.partition(".")[2] if rest.startswith("params.") else WORKLOAD.get(rest, rest)
    return name
