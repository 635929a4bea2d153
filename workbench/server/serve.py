"""`workbench serve --model DIR [engine knobs]`: the OpenAI-compatible server under uvicorn.

    workbench serve --model workbench/assets/tiny-llama --max-num-seqs 64 --port 8000 \\
        [--host 127.0.0.1] [--api-key KEY] [--served-model-name NAME] [--max-body-bytes N]

Every engine knob is a flag from `workbench.engine_args` (the config dataclasses' fields and
their help), spelled as vLLM does: `--max-num-batched-tokens`, `--block-size`,
`--enable-prefix-caching` / `--no-enable-prefix-caching`, `--max-num-seqs`,
`--scheduling-policy` (or `--policy`), ... (`--speculative-config` takes JSON). A knob left
out keeps the engine's default; a bad value is one error line naming it (exit status 2).
Binds 127.0.0.1:8000 unless told otherwise; a port already in use is one error line naming it
(exit status 2) before anything starts. `--api-key KEY`: every route but /health and /metrics
needs `Authorization: Bearer KEY` (server/auth.py).

The port is open at once; /health answers 503 until the engine is built, the kernels loaded
and a warm-up request has run (see startup.py; the log says what start-up spent its time on).
A start-up failure is logged and the process exits with status 1.
"""

from __future__ import annotations

import argparse
import logging
import sys

from workbench.config import EngineConfig
from workbench.engine.arg_utils import add_engine_args, engine_kwargs


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench serve", description="Serve a local checkpoint over an OpenAI API.",
    )
    ap.add_argument("model_tag", nargs="?", default=None, help="the model folder (or --model)")
    ap.add_argument("--model", default=None, help="a local Hugging Face folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' on every route but /health and "
                         "/metrics")
    ap.add_argument("--served-model-name", default=None, help="default: the --model value")
    ap.add_argument("--max-body-bytes", type=int, default=None,
                    help="largest request body (default 4 MiB)")
    ap.add_argument("--disable-log-stats", action="store_true",
                    help="no periodic engine log line (throughput, running, waiting, KV usage, "
                         "prefix hits; every WORKBENCH_LOG_STATS_INTERVAL s, default 10)")
    ap.add_argument("--log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug"])
    add_engine_args(ap, title="engine knobs (default: the engine's)")
    return ap


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, EngineConfig]:
    ap = build_parser()
    args = ap.parse_args(argv)
    model = args.model or args.model_tag
    if not model:
        ap.error("--model is required (a local Hugging Face folder)")
    try:
        config = EngineConfig.from_kwargs(model, **engine_kwargs(args))
    except ValueError as e:
        ap.error(str(e))
    return args, config


def main(argv: list[str] | None = None) -> None:
    args, config = parse_args(list(sys.argv[1:] if argv is None else argv))
    from workbench.harness.ports import check_port_free

    check_port_free(args.host, args.port, "workbench serve")  # one line, before start-up
    import uvicorn

    from workbench.server.app import DEFAULT_MAX_BODY_BYTES, build_app

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
