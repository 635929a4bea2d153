"""`workbench serve --model DIR [engine knobs]`: the OpenAI-compatible server under uvicorn.

    workbench serve --model workbench/assets/tiny-llama --max-num-seqs 64 --port 8000 \\
        [--host 127.0.0.1] [--api-key KEY] [--served-model-name NAME] [--max-body-bytes N]

Every engine knob is a flag derived from the config dataclasses (`workbench.config`), spelled
as vLLM does: `--max-num-batched-tokens`, `--block-size`, `--enable-prefix-caching` /
`--no-enable-prefix-caching`, `--dtype`, `--max-model-len`, `--max-num-seqs`,
`--num-gpu-blocks-override`, `--kv-cache-memory-bytes`, `--enable-chunked-prefill` /
`--no-enable-chunked-prefill`, `--long-prefill-token-threshold`, `--policy`, `--seed`, ...
(`--speculative-config` takes JSON). A knob left out keeps the engine's default; a bad value
is one error line naming it (exit status 2). Binds 127.0.0.1:8000 unless told otherwise.

The port is open at once; /health answers 503 until the engine is built, the kernels loaded
and a warm-up request has run (see startup.py; the log says what start-up spent its time on).
A start-up failure is logged and the process exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import types
import typing
from typing import Any

from workbench.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)

_SKIP = {"model", "hf_config"}
_TOP_LEVEL = {  # EngineConfig fields that are knobs (the sub-configs are expanded)
    "speculative_config", "quantization", "enforce_eager", "device", "attention_backend",
}


def engine_knobs() -> list[tuple[str, Any, Any]]:
    """(name, type, default) for every engine knob `EngineConfig.from_kwargs` accepts."""
    out: list[tuple[str, Any, Any]] = []
    seen: set[str] = set()
    skip_sched = {"max_model_len"}
    for cls, skip in ((ModelConfig, _SKIP), (CacheConfig, set()), (SchedulerConfig, skip_sched),
                      (ParallelConfig, set()), (EngineConfig, None)):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if skip is None and f.name not in _TOP_LEVEL:
                continue
            if (skip and f.name in skip) or f.name in seen:
                continue
            seen.add(f.name)
            default = None if f.default is dataclasses.MISSING else f.default
            out.append((f.name, hints[f.name], default))
    return out


def _base_type(tp: Any) -> Any:
    """int | None -> int; dict[str, Any] | None -> dict (also beside a dataclass: a config
    given as a JSON object on the command line)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if any((typing.get_origin(a) or a) is dict for a in args):
            return dict
        tp = args[0] if len(args) == 1 else str
    return typing.get_origin(tp) or tp


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench serve", description="Serve a local checkpoint over an OpenAI API.",
    )
    ap.add_argument("model_tag", nargs="?", default=None, help="the model folder (or --model)")
    ap.add_argument("--model", default=None, help="a local Hugging Face folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    ap.add_argument("--served-model-name", default=None, help="default: the --model value")
    ap.add_argument("--max-body-bytes", type=int, default=None,
                    help="largest request body (default 4 MiB)")
    ap.add_argument("--disable-log-stats", action="store_true",
                    help="no periodic engine log line (throughput, running, waiting, KV usage, "
                         "prefix hits; every WORKBENCH_LOG_STATS_INTERVAL s, default 10)")
    ap.add_argument("--log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug"])
    knobs = ap.add_argument_group("engine knobs (default: the engine's)")
    for name, tp, default in engine_knobs():
        flag = "--" + name.replace("_", "-")
        base = _base_type(tp)
        helptext = f"default: {default}"
        if base is bool:
            knobs.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                               default=None, help=helptext)
        elif base is dict:
            knobs.add_argument(flag, dest=name, type=json.loads, default=None,
                               metavar="JSON", help=helptext)
        else:
            conv = base if base in (int, float) else str
            knobs.add_argument(flag, dest=name, type=conv, default=None, help=helptext)
    return ap


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, EngineConfig]:
    ap = build_parser()
    args = ap.parse_args(argv)
    model = args.model or args.model_tag
    if not model:
        ap.error("--model is required (a local Hugging Face folder)")
    kwargs = {
        name: getattr(args, name) for name, _, _ in engine_knobs()
        if getattr(args, name) is not None
    }
    try:
        config = EngineConfig.from_kwargs(model, **kwargs)
    except ValueError as e:
        ap.error(str(e))
    return args, config


def main(argv: list[str] | None = None) -> None:
    args, config = parse_args(list(sys.argv[1:] if argv is None else argv))
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
    if failed:
        sys.exit(f"workbench serve: start-up failed in phase {failed[0]}")


if __name__ == "__main__":
    main()
