"""`make test`'s pytest: the suite without tests/cluster/, and tests/cluster/ on request.

    python scripts/run_tests.py [pytest args for the main run]
    WORKBENCH_CLUSTER_TESTS=1 python scripts/run_tests.py   # also the Ray cluster tests

The Ray cluster tests (tests/cluster/: two `ray start` nodes, an MLflow server, replicas
and TP ranks as actors) take 5-10 minutes on 2 cores, mostly waiting for processes to start
and nodes to die. Run beside the rest on a 2-core machine they starved Ray's own start-up
(`ray start` timed out in CI, 2026-12-05) and pushed the suite past its 20-minute budget, so
they run only when WORKBENCH_CLUSTER_TESTS=1 (`make test-cluster`), after the main run, in
a second pytest process; the exit status is the main run's, or the cluster run's when that
one failed. `python -m pytest` (everything, one process) gives the same verdict, only slower.

The main run uses pytest-xdist with `WORKBENCH_TEST_WORKERS` workers (default: 2, or 1 on a
one-CPU machine), distributed by file (`--dist loadfile`: a file's module fixtures are built
once, and tests that share a fixed port live in one file). Most of the suite waits on
processes (servers, routers, notebook kernels, torchrun), so two workers on 2 cores beat one.
`WORKBENCH_TEST_WORKERS=0` runs it in one process.

Both runs get WORKBENCH_HUGEPAGES=0 unless it is set: 4 KB pages in every process the suite
starts. Huge pages change no result, only speed, and on this project's VMs faulting in huge
pages of memory the guest has not touched recently costs seconds of system time per process
(notebook 01's test: 59 s with them, 46 s without, 27 s against 9 s of system time);
tests/worker/test_hugepages.py sets what it checks itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

CLUSTER = "tests/cluster"
WORKERS_ENV = "WORKBENCH_TEST_WORKERS"
CLUSTER_ENV = "WORKBENCH_CLUSTER_TESTS"


def xdist_args() -> list[str]:
    """pytest-xdist's flags for the main run ([] for one process)."""
    raw = os.environ.get(WORKERS_ENV, "")
    try:
        workers = int(raw) if raw else min(2, os.cpu_count() or 1)
    except ValueError:
        raise SystemExit(f"{WORKERS_ENV} ({raw!r}) must be an integer >= 0") from None
    if workers < 0:
        raise SystemExit(f"{WORKERS_ENV} ({raw!r}) must be an integer >= 0")
    return [] if workers <= 1 else ["-n", str(workers), "--dist", "loadfile"]


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    workers = xdist_args()  # a bad value stops here, before anything starts
    cluster = os.environ.get(CLUSTER_ENV, "") == "1"
    os.environ.setdefault("WORKBENCH_HUGEPAGES", "0")  # inherited by both runs (see above)
    # the slowest tests named in every CI log: the suite must stay under 20 minutes
    main_rc = subprocess.call([sys.executable, "-m", "pytest", "--ignore", CLUSTER,
                               "--durations=25", *workers, *argv], cwd=root)
    if not cluster:
        print(f"\n{CLUSTER}: not run (set {CLUSTER_ENV}=1 or run `make test-cluster`)")
        return main_rc
    t0 = time.monotonic()
    print(f"\n==== {CLUSTER} ====", flush=True)
    cluster_rc = subprocess.call([sys.executable, "-m", "pytest", CLUSTER], cwd=root)
    print(f"{CLUSTER}: {time.monotonic() - t0:.0f} s", flush=True)
    # pytest's "no tests collected" (5) is not a failure of the cluster run (no Ray: skipped)
    return main_rc or (cluster_rc if cluster_rc not in (0, 5) else 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
