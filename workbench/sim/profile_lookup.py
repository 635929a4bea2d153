"""`profile: auto`: a simulated target priced by this machine's newest calibrated profile.

    target: {kind: simulated, model: bundled, profile: auto}    # or profile: this-machine

`workbench calibrate` writes profiles keyed by the machine and the model shape
(`calibrated.py`) into the profile folder, `calibrated.profile_dir()`:
$WORKBENCH_SIM_PROFILE_DIR, else $WORKBENCH_CACHE_DIR/sim_profiles (default
~/.cache/workbench/sim_profiles). `find_profile` reads every *.json directly in that folder
(files that are not profiles are skipped, and counted) and keeps the profiles that match:

    hardware.fingerprint  == this machine's (`cpu_info.machine_fingerprint()`: CPU model,
                             ISA, torch version, torch's thread count), exactly
    model.shape           == the target model's `ModelShape`, every field but its name (a
                             named shape, a shipped model or a folder: `model_shapes.py`)
    engine.dtype          == the engine config's `dtype`; `auto` (or none): the engine's
                             default on the profile's device (float32 on CPU, bfloat16 on CUDA)

Of the matches, an undisturbed calibration (`validity.valid`) beats a disturbed one, then the
newest (`created`) wins. None: one `UserError` naming the folder, the fingerprint, the model,
its shape and dtype, what the folder held, and the `workbench calibrate` command that writes
the profile. The run's `target.cost_model.profile` names the file it used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.sim.calibrated import PROFILE_DIR_ENV, PROFILE_FORMAT, profile_dir

AUTO = ("auto", "this-machine")
SHAPE_LABELS = {"num_layers": "layers", "hidden_size": "hidden", "num_heads": "heads",
                "num_kv_heads": "kv_heads", "head_dim": "head_dim",
                "intermediate_size": "intermediate", "vocab_size": "vocab",
                "num_experts": "experts", "experts_per_token": "experts_per_token"}
MOE_FIELDS = ("num_experts", "experts_per_token")  # described only when not 0 (MoE)


def is_auto(value: Any) -> bool:
    """Whether `target.profile` asks for the lookup (AUTO) rather than naming a file."""
    return isinstance(value, str) and value in AUTO


def auto_dtype(device: str) -> str:
    """The engine's dtype for `dtype: auto` on `device` (`EngineConfig.torch_dtype_name`)."""
    return "bfloat16" if device.startswith("cuda") else "float32"


@dataclass(frozen=True)
class ProfileQuery:
    """What a calibrated profile must match: the machine, the model's shape, the dtype."""

    fingerprint: str  # `cpu_info.machine_fingerprint()`
    model: str  # the target's model, as written (for messages and the calibrate command)
    shape: Mapping[str, Any]  # `ModelShape.as_dict()` without "name"
    dtype: str = "auto"  # the engine config's dtype knob

    def __post_init__(self) -> None:
        if not isinstance(self.fingerprint, str) or not self.fingerprint:
            raise ValueError(f"fingerprint ({self.fingerprint!r}) must be a non-empty string")
        if not isinstance(self.shape, Mapping) or "name" in self.shape or not self.shape:
            raise ValueError(f"shape ({self.shape!r}) must be a ModelShape's fields without "
                             "its name")
        if not isinstance(self.dtype, str) or not self.dtype:
            raise ValueError(f"dtype ({self.dtype!r}) must be a dtype name or 'auto'")

    def matches(self, profile: Mapping[str, Any]) -> bool:
        hardware, model, engine = (_mapping(profile.get(k)) for k in
                                   ("hardware", "model", "engine"))
        shape = {k: v for k, v in _mapping(model.get("shape")).items() if k != "name"}
        if hardware.get("fingerprint") != self.fingerprint or shape != dict(self.shape):
            return False
        wanted = self.dtype if self.dtype != "auto" else \
            auto_dtype(str(hardware.get("device", "cpu")))
        return engine.get("dtype") == wanted

    def describe(self) -> str:
        shape = ", ".join(f"{label}={self.shape[k]}" for k, label in SHAPE_LABELS.items()
                          if k in self.shape and (self.shape[k] or k not in MOE_FIELDS))
        return (f"this machine ({self.fingerprint}) and model {self.model!r} ({shape}; "
                f"dtype {self.dtype})")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def query_for(target: Mapping[str, Any], config: Mapping[str, Any],
              fingerprint: str | None = None) -> ProfileQuery:
    """The query of a simulated target and one engine config; `fingerprint`: this machine's
    unless given (tests inject one)."""
    from workbench.config.named_models import resolve_model
    from workbench.sim.model_shapes import model_shape

    model = str(target.get("model", "bundled"))
    shape = {k: v for k, v in model_shape(resolve_model(model)).as_dict().items() if k != "name"}
    if fingerprint is None:
        from workbench.platforms.cpu_info import machine_fingerprint

        fingerprint = machine_fingerprint()
    return ProfileQuery(fingerprint, model, shape, str(config.get("dtype") or "auto"))


def _read(path: Path) -> dict[str, Any] | None:
    """The profile in `path`, or None when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("format") == PROFILE_FORMAT else None


def _rank(profile: Mapping[str, Any], path: Path) -> tuple[bool, bool, str, str]:
    """Undisturbed first, then one timed on the serving path (`calibrate --serving`: where
    templates measure), then the newest, then the file name (a stable order)."""
    valid = _mapping(profile.get("validity")).get("valid") is not False
    serving = _mapping(profile.get("design")).get("mode") == "serving"
    return valid, serving, str(profile.get("created") or ""), path.name


def find_profile(query: ProfileQuery, directory: str | Path | None = None,
                 requested: str = "auto") -> Path:
    """The best matching profile's path in `directory` (default `profile_dir()`); none:
    a UserError (module docstring) naming `target.profile` as `requested`."""
    folder = Path(directory) if directory is not None else profile_dir()
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    best: tuple[tuple[bool, bool, str, str], Path] | None = None
    others = not_profiles = 0
    for path in files:
        profile = _read(path)
        if profile is None:
            not_profiles += 1
        elif not query.matches(profile):
            others += 1
        elif best is None or _rank(profile, path) > best[0]:
            best = (_rank(profile, path), path)
    if best is not None:
        return best[1]
    held = ("the folder does not exist" if not folder.is_dir() else
            "it holds no .json file" if not files else
            f"it holds {others} profile(s) of other machines, models or dtypes"
            + (f" and {not_profiles} other .json file(s)" if not_profiles else ""))
    raise UserError(f"target.profile ({requested!r}): no calibrated profile in {folder} matches "
                    f"{query.describe()}; {held}; {_remedy(query)}")


def _remedy(query: ProfileQuery) -> str:
    """The command that writes the missing profile (or why there is none)."""
    from workbench.config.named_models import resolve_model
    from workbench.sim.model_shapes import NAMED_SHAPES

    if query.model in NAMED_SHAPES and not Path(resolve_model(query.model)).is_dir():
        return (f"{query.model!r} is a named shape without weights, which `workbench "
                "calibrate` cannot run: give target.hardware (an analytic GPU profile) or a "
                "model folder")
    engine = "" if query.dtype == "auto" else f" --engine '{{\"dtype\": \"{query.dtype}\"}}'"
    return (f"write one with `workbench calibrate --model {query.model}{engine}` (or set "
            f"{PROFILE_DIR_ENV} to the folder that holds it)")


def resolve_profile(target: Mapping[str, Any], config: Mapping[str, Any],
                    fingerprint: str | None = None, directory: str | Path | None = None
                    ) -> str:
    """The profile file a simulated target uses: `target.profile` as written, or for AUTO
    the `find_profile` match of this machine, the target's model and the config's dtype."""
    value = target["profile"]
    if not is_auto(value):
        return str(value)
    return str(find_profile(query_for(target, config, fingerprint), directory, value))


def profile_problems(target: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A template check's view (one target with `profile` and no `hardware`, one config):
    the profile file is missing, or AUTO finds none; [] when it resolves."""
    if "profile" not in target or "hardware" in target:
        return []
    value = target["profile"]
    if not is_auto(value):
        if Path(str(value)).is_file():
            return []
        return [f"target.profile ({value!r}) is not a file (a profile JSON that `workbench "
                f"calibrate` wrote, or {' / '.join(AUTO)}: the newest of this machine in "
                f"{profile_dir()})"]
    try:
        resolve_profile(target, config)
    except ValueError as e:  # UserError, or a model whose shape cannot be read
        return [str(e)]
    return []
