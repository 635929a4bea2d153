"""Argument checks of the planning calculator: a bad argument is a ValueError naming it and its
value (`workbench calc` prints the message as one line)."""

from __future__ import annotations

import math


def need_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def need_num(name: str, value: float, low: float, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        bound = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")


def need_pos(name: str, value: float) -> None:
    need_num(name, value, 0.0)
    if value == 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
