"""`make test`'s pytest: the whole suite, with tests/cluster/ beside the rest.

    python scripts/run_tests.py [pytest args for the main run]

The Ray cluster tests (tests/cluster/: two `ray start` nodes, an MLflow server, replicas
and TP ranks as actors) spend most of their ~3.5 minutes waiting for processes to start and
nodes to die, not computing (about 1.5 CPU-minutes), so they run in a second pytest process
while the rest of the suite runs in this one: the suite's wall time stays near the rest's
alone. The cluster run's output is kept in a temporary file and printed after the main
run's; the exit status is the main run's, or the cluster run's when that one failed.
`python -m pytest` (everything, one process) gives the same verdict, only slower.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = "tests/cluster"


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.monotonic()
        cluster = subprocess.Popen([sys.executable, "-m", "pytest", CLUSTER], cwd=root,
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            # the slowest tests named in every CI log: the suite must stay under 15 minutes
            main_rc = subprocess.call([sys.executable, "-m", "pytest", "--ignore", CLUSTER,
                                       "--durations=25", *argv], cwd=root)
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
