"""`workbench serve`'s flags (vLLM's `entrypoints/openai/cli_args.py`): the server's own and
every engine knob.

    args, engine_config = parse_args(["--model", DIR, "--max-num-seqs", "64", "--port", "0"])

Read by `workbench serve` (`workbench.server.serve`) to start, and by `workbench router` to
check its replicas' flags before it launches any (a bad flag is one error line, exit status 2)
and to read what it needs from them (the API key, the tensor-parallel size, the block size).

Every engine knob is a flag from `workbench.engine.arg_utils` (the config dataclasses' fields
and their help), spelled as vLLM does: `--max-num-batched-tokens`, `--block-size`,
`--enable-prefix-caching` / `--no-enable-prefix-caching`, `--max-num-seqs`,
`--scheduling-policy` (or `--policy`), ... (`--speculative-config` takes JSON). A knob left
out keeps the engine's default; a bad value is one error line naming it (exit status 2).
"""

from __future__ import annotations

import argparse

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
    """(the parsed flags, the engine's config); exits with status 2 and one error line on a
    bad flag or value."""
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
