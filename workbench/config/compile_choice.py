"""Whether the compiled forward is the default, decided by a measurement on this machine.

    python -m workbench.bench.offline.compile_ab --model M       measures eager vs compiled on the
                                                         offline workload and records the pair
    LLM(M)                                               no compilation_config: the record for
                                                         (this machine, M's shape) decides

The record, `compile_choice.json` in $WORKBENCH_CACHE_DIR (default ~/.cache/workbench), keyed by
the machine (`cpu_info.machine_fingerprint`: CPU model, ISA, torch, threads) and the model's
shape (`model_key`: architecture, layers, widths, vocab, dtype):

    {"version": 1, "machines": {machine: {model: {"eager_tok_s": .., "compiled_tok_s": ..,
                                                   "date": "2026-12-02", "source": ..}}}}

A CPU engine whose compilation mode nobody set (no compilation_config, no enforce_eager, no
$WORKBENCH_COMPILATION_MODE) compiles (mode 3) when the record says the compiled forward gave
at least MIN_GAIN more output tok/s than eager in the medians and its slowest run was no
slower than the eager median (a gain inside the runs' spread is no gain), and stays eager
otherwise or without a record
(the CUDA default is not measured yet: eager). `measured_default` says which and why, for
the engine's notes. An unreadable file counts as no record.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from workbench.config.compilation import CACHE_ENV as CACHE_ENV  # re-exported: tests set it
from workbench.config.compilation import cache_root
from workbench.platforms.cpu_info import machine_fingerprint

CHOICE_FILE = "compile_choice.json"
VERSION = 1
MIN_GAIN = 0.05  # compiled must give this much more output tok/s to become the default
logger = logging.getLogger(__name__)


def default_path() -> Path:
    return cache_root() / CHOICE_FILE


def model_key(hf_config: dict[str, Any], dtype: str) -> str:
    """The shape that decides the forward's cost: architecture, depth, widths, vocab, dtype."""
    arch = (hf_config.get("architectures") or ["?"])[0]
    heads = hf_config.get("num_attention_heads")
    parts = [arch, f"layers={hf_config.get('num_hidden_layers')}",
             f"hidden={hf_config.get('hidden_size')}", f"heads={heads}",
             f"kv_heads={hf_config.get('num_key_value_heads') or heads}",
             f"head_dim={hf_config.get('head_dim')}",
             f"intermediate={hf_config.get('intermediate_size')}",
             f"vocab={hf_config.get('vocab_size')}", f"dtype={dtype}"]
    return "; ".join(parts)


@dataclass(frozen=True)
class CompileChoice:
    """One measured pair: output tok/s eager and compiled on the offline workload."""

    eager_tok_s: float  # medians of the undisturbed runs
    compiled_tok_s: float
    date: str
    source: str
    compiled_slowest_tok_s: float | None = None  # the compiled side's slowest undisturbed run

    def __post_init__(self) -> None:
        for name in ("eager_tok_s", "compiled_tok_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} ({value!r}) must be a number > 0")

    @property
    def ratio(self) -> float:
        return self.compiled_tok_s / self.eager_tok_s

    @property
    def compiles(self) -> bool:
        """Compiled by >= MIN_GAIN in the medians, and by more than the runs' spread: even
        the compiled side's slowest run at least the eager median."""
        slowest = self.compiled_slowest_tok_s
        return self.ratio >= 1.0 + MIN_GAIN and (slowest is None or slowest >= self.eager_tok_s)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"version": VERSION, "machines": {}}
    except (OSError, ValueError) as e:
        logger.warning("compile choice file %s unreadable (%s): no measured default", path, e)
        return {"version": VERSION, "machines": {}}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return {"version": VERSION, "machines": {}}
    return data


def lookup(model: str, machine: str | None = None,
           path: Path | None = None) -> CompileChoice | None:
    """This machine's record for the model key, or None."""
    entry = _read(path or default_path())["machines"].get(
        machine or machine_fingerprint(), {}).get(model)
    if not isinstance(entry, dict):
        return None
    try:
        slowest = entry.get("compiled_slowest_tok_s")
        return CompileChoice(float(entry["eager_tok_s"]), float(entry["compiled_tok_s"]),
                             str(entry.get("date", "")), str(entry.get("source", "")),
                             None if slowest is None else float(slowest))
    except (KeyError, TypeError, ValueError):
        return None


def record(model: str, choice: CompileChoice, machine: str | None = None,
           path: Path | None = None) -> Path:
    """Write (replace) this machine's record for the model key; returns the file."""
    path = path or default_path()
    data = _read(path)
    section = data["machines"].setdefault(machine or machine_fingerprint(), {})
    section[model] = {"eager_tok_s": choice.eager_tok_s, "compiled_tok_s": choice.compiled_tok_s,
                      "date": choice.date or str(date.today()), "source": choice.source,
                      "compiled_slowest_tok_s": choice.compiled_slowest_tok_s}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def measured_default(device: str, hf_config: dict[str, Any], dtype: str
                     ) -> tuple[bool | None, str]:
    """What this machine's record decides for the model's default, and why (one read of the
    record): (True / False: compile or not, None: no record or not a CPU; the reason, for
    the engine's notes)."""
    if device != "cpu":
        return None, "the CUDA default (eager until the compiled CUDA path has run on a GPU)"
    choice = lookup(model_key(hf_config, dtype))
    if choice is None:
        return None, ("the CPU default: no measurement of this model on this machine (python "
                      "-m workbench.bench.offline.compile_ab --model MODEL records one)")
    verdict = "compiled" if choice.compiles else "eager"
    return choice.compiles, (
        f"{verdict}, measured on this machine {choice.date}: compiled/eager "
        f"{choice.ratio:.2f}x ({choice.compiled_tok_s:.0f} vs {choice.eager_tok_s:.0f} "
        f"output tok/s; compiled needs >= {1 + MIN_GAIN:.2f}x and its slowest run at least "
        "the eager median)")
