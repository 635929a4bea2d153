"""Errors the user can fix: one clear sentence, no traceback.

Place in the flow: a leaf module every layer may import. Code that refuses bad input raises
`UserError` (or a plain `ValueError`, the config dataclasses' habit); the command line
(`workbench.cli.main`) prints either as one line `workbench <verb>: <message>` and exits 2.
`UserError` subclasses `ValueError`, so callers that catch `ValueError` keep working.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (JSON/YAML true would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[int | float]:
    """An int (not a bool) or a float that is not NaN (infinities pass)."""
    return (is_int(value) or isinstance(value, float)) and not math.isnan(value)


class UserError(ValueError):
    """Input the user can fix (a file, a flag, a template field), named in the message."""


class TemplateError(UserError):
    """An experiment template with one or more problems, all of them listed."""

    def __init__(self, source: str, problems: list[str],
                 consequence: str = "nothing was run") -> None:
        self.source = source
        self.problems = list(problems)
        n = len(self.problems)
        lines = [f"{source}: {n} problem{'s' if n != 1 else ''}; {consequence}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, '' when none is close."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
