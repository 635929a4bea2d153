"""Values JSON can carry but no request field may hold, found in one walk over a decoded body.

Place in the flow: `requests.parse_request` calls `check_json_values` before the pydantic
models see the body, and turns `BadValue` into a 400 naming `param`, the value's path written
as pydantic writes locations (`messages.0.content`, `stop.1`; None for the body itself).

- a non-finite number: Python's json reads `Infinity`, `-Infinity`, `NaN` and `1e400`, and
  pydantic's floats would pass them on (temperature Infinity once sampled uniformly);
- a string or key that is not valid Unicode: JSON's `\\ud800` escape decodes to a lone
  surrogate, which no tokenizer can encode (it was a 500);
- an array longer than `max_items`: pydantic validates a list while holding the interpreter
  lock, so a 4 MB list of token ids would stall every other request for ~0.4 s.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_ITEMS = 1 << 16  # longest JSON array in a request body unless the app says otherwise


class BadValue(ValueError):
    """`param`: the offending value's path (None: the body itself)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def check_json_values(data: Any, max_items: int = MAX_ITEMS) -> None:
    """Raise BadValue at the first value (in document order) that no request field may
    hold: a non-finite number, a string or key that is not valid Unicode, an array longer than
    `max_items`. Iterative, with each path a (parent, key) link: a deeply nested body costs
    neither stack nor quadratic time."""
    stack: list[tuple[Any, _Path]] = [(data, None)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                _refuse(path, "must be a finite number; Infinity, -Infinity and NaN are not "
                              f"allowed (got {json.dumps(value)})")
        elif isinstance(value, str):
            _check_unicode(value, path, "the string is")
        elif isinstance(value, list):
            if len(value) > max_items:
                _refuse(path, f"the list has {len(value)} items; at most {max_items} are "
                              "allowed")
            stack.extend((v, (path, str(i))) for i, v in reversed(list(enumerate(value)))
                         if not isinstance(v, int))  # ints (and bools) are always fine
        elif isinstance(value, dict):
            for k in value:
                _check_unicode(k, path, f"the key {k!a} is")
            stack.extend((v, (path, k)) for k, v in reversed(value.items()))


_Path = tuple[Any, str] | None  # (parent path, key); None is the body itself


def _check_unicode(text: str, path: _Path, what: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        _refuse(path, f"{what} not valid Unicode: a lone surrogate ({text[e.start]!a}) at "
                      f"character {e.start}; \\uD800-\\uDFFF escapes must come in "
                      "high-low pairs")


def _refuse(path: _Path, message: str) -> None:
    keys: list[str] = []
    while path is not None:
        path, key = path
        keys.append(key)
    param = ".".join(reversed(keys)) if keys else None
    where = "the request body" if param is None else param or "the field named ''"
    raise BadValue(f"{where}: {message}", param)
