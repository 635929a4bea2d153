"""`make test`'s pytest: the whole suite, with tests/cluster/ beside the rest.

    python scripts/run_tests.py [pytest args for the main run]

The Ray cluster tests (tests/cluster/: two `ray start` nodes, an MLflow server, replicas
and TP ranks as actors) spend most of their ~3.5 minutes waiting for processes to start and
nodes to die, not computing (about 1.5 CPU-minutes), so they run in a second pytest process
while the rest of the suite runs in this one: the suite's wall time stays near the rest's
alone. The cluster run's output is kept in a temporary file and printed after the main
run's; the exit status is the main run's, or the cluster run's when that one failed.
`python -m pytest` (everything, one process) gives the same verdict, only slower.

The main run uses pytest-xdist with `WORKBENCH_TEST_WORKERS` workers (default: 2, or 1 on a
one-CPU machine), distributed by file (`--dist loadfile`: a file's module fixtures are built
once, and tests that share a fixed port live in one file). Most of the suite waits on
processes (servers, routers, notebook kernels, torchrun), so two workers on 2 cores took the
main run from ~15 to ~10 minutes (AMD EPYC, 2 cores, 2026-12-02). `WORKBENCH_TEST_WORKERS=0`
runs it in one process.

Both runs get WORKBENCH_HUGEPAGES=0 unless it is set: 4 KB pages in every process the suite
starts. Huge pages change no result, only speed, and on this project's VMs faulting in huge
pages of memory the guest has not touched recently costs seconds of system time per process
(notebook 01's test: 59 s with them, 46 s without, 27 s against 9 s of system time);
tests/worker/test_hugepages.py sets what it checks itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = "tests/cluster"
WORKERS_ENV = "WORKBENCH_TEST_WORKERS"


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
    os.environ.setdefault("WORKBENCH_HUGEPAGES", "0")  # inherited by both runs (see above)
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.monotonic()
        cluster = subprocess.Popen([sys.executable, "-m", "pytest", CLUSTER], cwd=root,
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            # the slowest tests named in every CI log: the suite must stay under 15 minutes
            main_rc = subprocess.call([sys.executable, "-m", "pytest", "--ignore", CLUSTER,
                                       "--durations=25", *workers, *argv], cwd=root)
            cluster_rc = cluster.wait()
        finally:
            if cluster.poll() is None:  # interrupted: let its fixtures stop the Ray nodes
                cluster.send_signal(signal.SIGINT)
                try:
                    cluster.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    cluster.kill()
                    cluster.wait()
        log.seek(0)
        print(f"\n==== {CLUSTER} (run beside the rest; {time.monotonic() - t0:.0f} s in all) "
              "====", flush=True)
        sys.stdout.write(log.read())
    # pytest's "no tests collected" (5) is not a failure of the cluster run (no Ray: skipped)
    return main_rc or (cluster_rc if cluster_rc not in (0, 5) else 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
