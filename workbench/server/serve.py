"""`workbench serve --model DIR [engine knobs]`: the OpenAI-compatible server under uvicorn.

    workbench serve --model workbench/assets/tiny-llama --max-num-seqs 64 --port 8000 \\
        [--host 127.0.0.1] [--api-key KEY] [--served-model-name NAME] [--max-body-bytes N]

The flags are those of `workbench.entrypoints.openai.cli_args` (every engine knob as vLLM
spells it: `--max-num-batched-tokens`, `--block-size`, `--enable-prefix-caching`, ...); a bad
value is one error line naming it (exit status 2). Binds 127.0.0.1:8000 unless told otherwise;
a port already in use is one error line naming it (exit status 2) before anything starts.
`--api-key KEY`: every route but /health and /metrics needs `Authorization: Bearer KEY` (the
protocol's `auth.py`).

The port is open at once; /health answers 503 until the engine is built, the kernels loaded
and a warm-up request has run (see startup.py; the log says what start-up spent its time on).
A start-up failure is logged and the process exits with status 1.
"""

from __future__ import annotations

import logging
import sys

from workbench.entrypoints.openai.cli_args import parse_args


def main(argv: list[str] | None = None) -> None:
    args, config = parse_args(list(sys.argv[1:] if argv is None else argv))
    from workbench.harness.ports import check_port_free

    check_port_free(args.host, args.port, "workbench serve")  # one line, before start-up
    import uvicorn

    from workbench.entrypoints.openai.protocol.http import DEFAULT_MAX_BODY_BYTES
    from workbench.server.app import build_app

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed: list[str] = []
    server: uvicorn.Server | None = None

    def on_startup_failure(message: str) -> None:  # on the start-up thread
        failed.append(message)
        if server is not None:
            server.should_exit = True

    app = build_app(
        config, served_model_name=args.served_model_name, api_key=args.api_key,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        on_startup_failure=on_startup_failure, log_stats=not args.disable_log_stats,
    )
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level,
                                           timeout_graceful_shutdown=5))
    server.run()
    if failed:  # one line, prefixed once (`workbench serve` passes an int status through)
        print(f"workbench serve: start-up failed in phase {failed[0]}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
