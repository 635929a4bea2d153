"""Engine knobs as command-line flags, from one source: the config dataclasses' fields.

    engine_knobs()                      (name, type, default, help) of every knob
                                        `EngineConfig.from_kwargs` accepts
    add_engine_args(parser, defaults)   one flag per knob, spelled as vLLM does
                                        (`--max-num-batched-tokens`, `--enable-prefix-caching`
                                        / `--no-enable-prefix-caching`, `--speculative-config`
                                        JSON, `-O3` = `--compilation-config 3`); `defaults`
                                        overrides what a tool starts from
    engine_kwargs(args)                 the knobs a parsed namespace sets, for from_kwargs

`workbench serve` (and the router's replicas), `workbench demo-engine` and `workbench bench
offline` build their flags here, so a knob's name, type, default and help cannot drift
between them (as vLLM's `EngineArgs.add_cli_args`, in vLLM's `engine/arg_utils.py`). A
field's help is its `workbench.config.knob(...)` metadata, and a knob's flag type is what the
knob accepts (`accepts`: e.g. a dict for a JSON knob) else its annotation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Collection
from typing import Any

from workbench.config import (
    TOP_LEVEL_KNOBS,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)

_SKIP = {"model", "hf_config"}
JSON_OR_WORD = {"compilation_config"}  # JSON knobs that also take a bare word (a mode name)
_TOP_LEVEL = {"quantization", *TOP_LEVEL_KNOBS}  # knobs among EngineConfig's fields
# vLLM's spellings beside ours: -O3 is `--compilation-config 3` (the mode alone, as vLLM's
# `-O` was before it became --optimization-level; there -O0 is still no compilation)
ALIASES = {"policy": ["--scheduling-policy"], "compilation_config": ["-O"]}


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    type: Any  # what the knob accepts (its input type): the flag's type comes from it
    default: Any
    help: str


def engine_knobs() -> list[Knob]:
    """Every engine knob `EngineConfig.from_kwargs` accepts, in config order."""
    out: list[Knob] = []
    seen: set[str] = set()
    skip_sched = {"max_model_len"}
    for cls, skip in ((ModelConfig, _SKIP), (CacheConfig, set()), (SchedulerConfig, skip_sched),
                      (ParallelConfig, set()), (EngineConfig, None)):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if skip is None and f.name not in _TOP_LEVEL:
                continue
            if (skip and f.name in skip) or f.name in seen:
                continue
            seen.add(f.name)
            default = None if f.default is dataclasses.MISSING else f.default
            accepts = f.metadata.get("accepts", hints[f.name])
            out.append(Knob(f.name, accepts, default, f.metadata.get("help", "")))
    return out


def _base_type(tp: Any) -> Any:
    """int | None -> int; dict[str, Any] | None -> dict (also beside a dataclass: a config
    given as a JSON object on the command line)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if any((typing.get_origin(a) or a) is dict for a in args):
            return dict
        tp = args[0] if len(args) == 1 else str
    return typing.get_origin(tp) or tp


def add_engine_args(
    parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None,
    title: str = "engine knobs", exclude: Collection[str] = (),
) -> argparse._ArgumentGroup:
    """One flag per knob. A flag left out stays None (the engine's default applies) unless
    `defaults` names the knob: then that value is the tool's default, shown in --help.
    `exclude`: knobs the tool fixes itself or whose flag it uses for something else (pass
    the same to `engine_kwargs`)."""
    defaults = defaults or {}
    unknown = sorted((set(defaults) | set(exclude)) - {k.name for k in engine_knobs()})
    if unknown:
        raise ValueError(f"unknown engine knob(s) {', '.join(unknown)}")
    group = parser.add_argument_group(title)
    for k in engine_knobs():
        if k.name in exclude:
            continue
        flags = ["--" + k.name.replace("_", "-"), *ALIASES.get(k.name, [])]
        base = _base_type(k.type)
        start = defaults.get(k.name)
        shown = (f"default: {start!r} (this tool's; the engine's: {k.default!r})"
                 if k.name in defaults else f"default: {k.default!r}")
        helptext = f"{k.help}; {shown}" if k.help else shown
        if base is bool:
            group.add_argument(*flags, dest=k.name, action=argparse.BooleanOptionalAction,
                               default=start, help=helptext)
        elif base is dict:
            parse: Callable[[str], Any] = _json_or_word if k.name in JSON_OR_WORD else json.loads
            group.add_argument(*flags, dest=k.name, type=parse, default=start,
                               metavar="JSON", help=helptext)
        else:
            conv: Callable[[str], Any] = base if base in (int, float) else str
            group.add_argument(*flags, dest=k.name, type=conv, default=start, help=helptext)
    return group


def _json_or_word(text: str) -> Any:
    """A JSON value, or the bare word itself (`-O VLLM_COMPILE`); the config validates it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def engine_kwargs(args: argparse.Namespace, exclude: Collection[str] = ()) -> dict[str, Any]:
    """The knobs the namespace sets (None = not given: the engine's default applies)."""
    return {k.name: getattr(args, k.name) for k in engine_knobs()
            if k.name not in exclude and getattr(args, k.name, None) is not None}
