"""Suite-wide test settings.

- Hypothesis profiles (tests/hypothesis_profiles.py): HYPOTHESIS_PROFILE=ci (default) | long.
- A quiet CPU watch: every measured run judges the share of the CPUs other processes took
  (workbench.harness.validity); the suite states that share as 0 through
  WORKBENCH_OTHER_CPU_SHARE (also seen by subprocesses: notebooks, CLI runs), and turns the
  client read-lag judgement off (WORKBENCH_MAX_READ_LAG_S=off: the lag is recorded only), so
  no result depends on the machine's load. Tests of the disturbance logic inject
  `FixedCpuWatch` or a `CpuWatch` with scripted readings explicitly.
- Results folders (`workbench.experiments.results`): WORKBENCH_RESULTS_DIR points at a
  temporary folder, so CLI runs in tests never write into the checkout's results/.
- The slow profile: tests marked `slow` outside tests/cluster/ (the end-to-end runs of
  notebooks 07-10 and 12 under papermill, the GPU check's CPU pass: 2-5 minutes each on 2
  cores, mostly starting routers, replicas and kernels) run only with
  WORKBENCH_SLOW_TESTS=1 (`make test-full`), so `make test` stays under 20 minutes on 2
  cores; tests/cluster/ has its own switch (scripts/run_tests.py).
- Caches (`WORKBENCH_CACHE_DIR`: the linear-backend autotune's timings, compiled graphs):
  a temporary folder per session, so the suite never reads or writes ~/.cache/workbench.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.hypothesis_profiles import load as load_hypothesis_profile
from workbench.harness.validity import MAX_READ_LAG_ENV, STATED_SHARE_ENV

HYPOTHESIS_PROFILE = load_hypothesis_profile()


SLOW_ENV = "WORKBENCH_SLOW_TESTS"


def pytest_report_header(config: pytest.Config) -> str:
    slow = "on" if os.environ.get(SLOW_ENV) == "1" else f"off (${SLOW_ENV}=1 runs them)"
    return (f"hypothesis profile: {HYPOTHESIS_PROFILE} ($HYPOTHESIS_PROFILE=ci|long); "
            f"slow tests: {slow}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SLOW_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"slow profile: set {SLOW_ENV}=1 (make test-full)")
    for item in items:
        if "slow" in item.keywords and "tests/cluster/" not in item.nodeid:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def results_dir_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from workbench.experiments.results import RESULTS_ENV

    saved = {name: os.environ.get(name) for name in (RESULTS_ENV, "WORKBENCH_CACHE_DIR")}
    os.environ[RESULTS_ENV] = str(tmp_path_factory.mktemp("results"))
    os.environ["WORKBENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    for name, old in saved.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@pytest.fixture(autouse=True, scope="session")
def quiet_cpu_watch() -> Iterator[None]:
    settings = {STATED_SHARE_ENV: "0", MAX_READ_LAG_ENV: "off"}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield
    for name, old in saved.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
