"""Test helper: a template dict with some top-level keys changed (None removes the key)."""

from __future__ import annotations

import copy
from typing import Any


def changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(base)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d
