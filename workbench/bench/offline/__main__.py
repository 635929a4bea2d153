"""`python -m workbench.bench.offline`: the offline throughput bench (`throughput.main`)."""

from workbench.bench.offline.throughput import main

raise SystemExit(main())
