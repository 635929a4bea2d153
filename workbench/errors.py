"""Errors the user can fix: one clear sentence, no traceback.

Place in the flow: a leaf module every layer may import. Code that refuses bad input raises
`UserError` (or a plain `ValueError`, the config dataclasses' habit); the command line
(`workbench.cli.main`) prints either as one line `workbench <verb>: <message>` and exits 2.
`UserError` subclasses `ValueError`, so callers that catch `ValueError` keep working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
