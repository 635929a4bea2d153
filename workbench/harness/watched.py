"""A micro-measurement under the same CPU watch and threshold as a replayed run.

    value, validity = watched(lambda: layer_timing(model), watch, max_other_cpu_share)

The runner judges every run by the share of the CPUs other processes took while it ran
(`validity.CpuWatch`, threshold `DEFAULT_MAX_OTHER_CPU_SHARE`). A micro-timing beside an
experiment's runs (one linear layer's forward, one all-reduce) is just as easily disturbed,
so it is watched and judged the same way: the value is kept, and `validity.valid` is False
with the reason stated when other processes took more than the threshold. Processes the
measurement starts itself (the all-reduce's gloo ranks) are its own, not "others".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    CpuWatch,
    Validity,
    default_cpu_watch,
    disturbed_line,
)

T = TypeVar("T")
logger = logging.getLogger(__name__)


def watched(fn: Callable[[], T], name: str, watch: CpuWatch | None = None,
            max_other_cpu_share: float | None = DEFAULT_MAX_OTHER_CPU_SHARE
            ) -> tuple[T, Validity]:
    """`fn()` under `watch` (default: the real one, or the stated share of
    WORKBENCH_OTHER_CPU_SHARE), judged by `max_other_cpu_share` (None: recorded only). A
    disturbed measurement logs one line naming `name`, the share and the threshold."""
    validity = Validity()
    with (watch or default_cpu_watch()).measure() as share:
        value = fn()
    validity.judge_cpu(share.others, max_other_cpu_share)
    if validity.disturbed and validity.other_cpu_share is not None \
            and max_other_cpu_share is not None:
        logger.warning(disturbed_line(name, validity.other_cpu_share, max_other_cpu_share))
    return value, validity
