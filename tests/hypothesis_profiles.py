"""Hypothesis example counts come from a profile, never from a test file.

    HYPOTHESIS_PROFILE=ci    (default) today's counts: 100 examples per property, the
                             stateful KV-cache machine 200; the suite stays quick
    HYPOTHESIS_PROFILE=long  20x: 2,000 examples per property, the KV-cache machine 4,000
                             (run on demand, e.g. before a release or after a cache change)

    HYPOTHESIS_PROFILE=long pytest tests/core/kv_cache/test_manager_stateful.py \\
        --hypothesis-show-statistics      # passing / failing / invalid examples, timings

Both profiles drop the per-example deadline (a loaded machine must not fail a test) and print
the reproduction blob of a failure. A test that needs another count than the profile's
(a slow property, a cheap state machine) asks `examples(n)`: n under ci, scaled with the
profile otherwise; it never hard-codes `max_examples`. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import os

from hypothesis import settings

ENV = "HYPOTHESIS_PROFILE"
CI_EXAMPLES = 100
PROFILES = {"ci": CI_EXAMPLES, "long": 20 * CI_EXAMPLES}


def load() -> str:
    """Register both profiles and load the one $HYPOTHESIS_PROFILE names (default ci)."""
    for name, count in PROFILES.items():
        settings.register_profile(name, max_examples=count, deadline=None, print_blob=True)
    name = os.environ.get(ENV) or "ci"
    if name not in PROFILES:
        raise ValueError(f"{ENV} ({name!r}) must be one of {', '.join(PROFILES)}")
    settings.load_profile(name)
    return name


def examples(ci_count: int) -> int:
    """A test's own example count: `ci_count` under the ci profile, scaled by the loaded
    profile's ratio to ci (x20 under long)."""
    return max(1, round(ci_count * settings.default.max_examples / CI_EXAMPLES))
