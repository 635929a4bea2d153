"""The calibrated cost model: `linear_fit`'s coefficients, stored as a profile JSON.

A profile (written by `workbench calibrate`, `calibrate.py`) is keyed by the machine it was
measured on (`cpu_info.machine_fingerprint`: CPU model, ISA, torch, threads) and the model
shape; by default it lives in the profile folder (`profile_dir`: $WORKBENCH_SIM_PROFILE_DIR,
else $WORKBENCH_CACHE_DIR/sim_profiles/, i.e. ~/.cache/workbench/sim_profiles/), where a
simulated target's `profile: auto` looks for it (`profile_lookup.py`):

    {"format": PROFILE_FORMAT, "source": "calibrated", "key": "<fingerprint> | <model>",
     "hardware": {"fingerprint": ..., "cpu": ..., "device": "cpu"},
     "model": {"name": ..., "shape": {...ModelShape}},
     "engine": {the engine knobs it ran with},
     "target": "duration_s" (offline design) | "step_interval_s" (--serving),
     "terms": [...TERMS], "coefficients_s": {term: seconds per unit},
     "fit": {FitResult.as_dict()}, "design": {...},
     "validity": {"valid": .., "reasons": [..], "other_cpu_share": .., ...},
     "step_columns": [BatchComposition fields..., "seconds"], "steps": [[...], ...],
     "created": ISO time}

`CalibratedCostModel.load(path)` reads one and predicts with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.config.compilation import cache_root
from workbench.sim.batch import BatchComposition
from workbench.sim.linear_fit import TERMS, predict

PROFILE_FORMAT = "workbench-sim-profile/3"  # /2: token_low, prefill_seq; /3: draft_token
PROFILE_DIR = "sim_profiles"
PROFILE_DIR_ENV = "WORKBENCH_SIM_PROFILE_DIR"


def profile_key(fingerprint: str, model: str) -> str:
    """What a calibrated profile is keyed by: the machine and the model shape."""
    return f"{fingerprint} | {model}"


def profile_dir() -> Path:
    """Where calibrated profiles are written and looked up: $WORKBENCH_SIM_PROFILE_DIR, else
    $WORKBENCH_CACHE_DIR/sim_profiles (default ~/.cache/workbench/sim_profiles)."""
    override = os.environ.get(PROFILE_DIR_ENV)
    return Path(override).expanduser() if override else cache_root() / PROFILE_DIR


def default_profile_path(fingerprint: str, model: str) -> Path:
    """<profile_dir()>/<model>-<12 hex of the key's sha256>.json."""
    digest = hashlib.sha256(profile_key(fingerprint, model).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:60]
    return profile_dir() / f"{slug}-{digest}.json"


class CalibratedCostModel:
    """CostModel from a calibrated profile (a dict in PROFILE_FORMAT)."""

    def __init__(self, profile: Mapping[str, Any], path: str | None = None) -> None:
        where = f"profile {path!r}" if path else "profile"
        if profile.get("format") != PROFILE_FORMAT:
            raise ValueError(f"{where} format ({profile.get('format')!r}) must be "
                             f"{PROFILE_FORMAT!r}")
        coefficients = profile.get("coefficients_s")
        if not isinstance(coefficients, Mapping):
            raise ValueError(f"{where} has no coefficients_s object")
        missing = [t for t in TERMS if t not in coefficients]
        if missing:
            raise ValueError(f"{where} coefficients_s lacks {', '.join(missing)} "
                             f"(terms: {', '.join(TERMS)})")
        for t in TERMS:
            v = coefficients[t]
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise ValueError(f"{where} coefficient {t} ({v!r}) must be a "
                                 "number >= 0")
        self.profile = dict(profile)
        self.path = path
        self.coefficients = {t: float(coefficients[t]) for t in TERMS}

    @classmethod
    def load(cls, path: str | Path) -> CalibratedCostModel:
        """Read a profile JSON (ValueError when unreadable or not a profile)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"profile {str(path)!r} is unreadable: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"profile {str(path)!r} must hold a JSON object")
        return cls(data, path=str(path))

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON (parent folders made); returns the path."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.profile, indent=2, sort_keys=True) + "\n")
        return out

    def step_time_s(self, batch: BatchComposition) -> float:
        return predict(self.coefficients, batch)

    def breakdown(self, batch: BatchComposition) -> dict[str, float]:
        """Seconds per term for `batch` (their sum is step_time_s)."""
        single = {t: 0.0 for t in TERMS}
        out = {}
        for t in TERMS:
            single[t] = self.coefficients[t]
            out[t] = predict(single, batch)
            single[t] = 0.0
        return out

    def describe(self) -> dict[str, Any]:
        p = self.profile
        model = p.get("model", {})
        return {"source": "calibrated", "profile": self.path or p.get("key", ""),
                "key": p.get("key"), "hardware": p.get("hardware"),
                "model": model.get("name") if isinstance(model, Mapping) else model,
                "coefficients_s": dict(self.coefficients), "fit": p.get("fit"),
                "validity": p.get("validity"),
                "created": p.get("created")}
