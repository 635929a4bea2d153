"""`workbench` command line: dispatches to the module that owns each job.

    workbench demo [...]            generate from the bundled checkpoint, print a report
    workbench bench offline [...]   engine vs transformers (and vLLM-CPU) throughput table
    workbench bench sched [...]     scheduler + KV manager cost per step
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = __doc__ or ""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from workbench.demo import main as run

        run(rest)
    elif cmd == "bench" and rest and rest[0] == "offline":
        from workbench.bench.offline import main as run

        run(rest[1:])
    elif cmd == "bench" and rest and rest[0] == "sched":
        from workbench.bench.sched_micro import main as run

        run(rest[1:])
    else:
        print(f"unknown command {' '.join(argv[:2])!r}\n{usage}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
