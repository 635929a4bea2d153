"""Short labels for a variable's values: MLflow run names, verdict metric names, plot ticks.

    value_label("max_num_batched_tokens", 64)                     -> "budget=64"
    value_label("speculative_config", {"method": "ngram", "num_speculative_tokens": 5},
                values=[{... 3}, {... 5}])                         -> "k=5"
    baseline_label("max_num_batched_tokens", 512)                 -> "baseline (512)"
    metric_label("budget=64")                                     -> "budget_64"

A name may be any of a knob's names (`budgets`, `arrivals.rate`, the param key itself:
`workbench.tracking.param_keys.param_key`); a few long knob names have a short form
(`SHORT`). A dict value (speculative_config) is never shown as its repr: the label names the
fields that differ across `values` (the template's values, baseline included), else all of
its identifying fields (`IDENTIFYING`: method, k, draft), else all of them, as compact
key=value pairs cut at `MAX_LEN` characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.tracking.param_keys import engine_params, param_key

MAX_LEN = 40
SHORT = {
    "max_num_batched_tokens": "budget",
    "num_speculative_tokens": "k",
    "speculative_method": "method",
    "speculative_model": "draft",
    "max_num_seqs": "seqs",
    "enable_prefix_caching": "prefix_caching",
    "enable_chunked_prefill": "chunked_prefill",
    "request_rate": "rate",
    "tensor_parallel_size": "tp",
    "max_model_len": "max_len",
    "speculative_config": "spec",
    "kv_transfer_config": "kv_tier",
    "kv_compression_config": "kv_compression",
    "kv_connector": "connector",
    "spec_name": "spec",
    "preemption_mode": "preemption",
}
# dict-valued knobs: None reads "off"
DICT_KNOBS = ("speculative_config", "kv_transfer_config", "kv_compression_config")

# the fields that name a dict value when nothing differs (a lone value, or one against "off")
IDENTIFYING = ("speculative_method", "num_speculative_tokens", "speculative_model",
               "kv_connector", "method", "budget_tokens", "budget_ratio")


def short_name(name: str) -> str:
    """The short form of a knob's name ("max_num_batched_tokens" -> "budget")."""
    key = param_key(name)
    return SHORT.get(key, key.rsplit(".", 1)[-1])


def value_text(value: Any) -> str:
    """A scalar as it reads best: 64, 0.5, on/off for booleans, none for None."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(value_text(v) for v in value)
    if isinstance(value, Mapping):
        return ",".join(f"{short_name(str(k))}={value_text(v)}" for k, v in value.items())
    return str(value)


def _fields(name: str, value: Any) -> dict[str, Any]:
    """A dict value's fields under their param keys (speculative_config: k, method, ...)."""
    if param_key(name) == "speculative_config":
        return engine_params({"speculative_config": value})
    out: dict[str, Any] = {}
    for k, v in value.items():  # nested dicts (kv_connector_extra_config) by their fields
        out.update({str(k2): v2 for k2, v2 in v.items()} if isinstance(v, Mapping)
                   else {str(k): v})
    return out


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LEN else text[:MAX_LEN - 3] + "..."


def _inner(name: str, value: Any, values: Sequence[Any]) -> tuple[str, bool]:
    """(text, named): `named` when the text already carries field names (a dict)."""
    dict_like = isinstance(value, Mapping) or (
        value is None and param_key(name) in DICT_KNOBS
        and any(isinstance(v, Mapping) for v in values))
    if not dict_like:
        return value_text(value), False
    if value is None:
        return "off", False
    mine = _fields(name, value)
    others = [_fields(name, v) for v in values if isinstance(v, Mapping)]
    differ = [k for k in mine if any(o.get(k, object()) != mine[k] for o in others)]
    keys = differ or [k for k in mine if k in IDENTIFYING] or list(mine)
    return ",".join(f"{short_name(k)}={value_text(mine[k])}" for k in keys), True


def value_label(name: str, value: Any, values: Sequence[Any] = ()) -> str:
    """"budget=64", "k=5", "prefix_caching=on"; a dict by the fields that differ across
    `values` (all its fields when none differ or `values` is empty)."""
    text, named = _inner(name, value, values)
    return _cut(text if named else f"{short_name(name)}={text}")


def short_value(name: str, value: Any, values: Sequence[Any] = ()) -> str:
    """The value without the knob's name, where an axis or legend names it: "512", "on",
    "k=3" (a dict keeps its field names)."""
    return _cut(_inner(name, value, values)[0])


def baseline_label(name: str, value: Any, values: Sequence[Any] = ()) -> str:
    """"baseline (512)", "baseline (off)", "baseline (k=3)"."""
    return f"baseline ({short_value(name, value, values)})"


def metric_label(label: str) -> str:
    """A label as part of an MLflow metric name (no "=", "(", ",", "/"): "budget=64" ->
    "budget_64", "baseline (512)" -> "baseline_512"."""
    return re.sub(r"[^\w.\-]+", "_", label).strip("_") or "_"
