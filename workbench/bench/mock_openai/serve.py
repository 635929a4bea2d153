"""A mock OpenAI-compatible server that streams tokens as fast as it can: the system under test
when the load generator itself is measured (`workbench bench client-capacity`).

    python -m workbench.bench.mock_openai --port 8011 [--host 127.0.0.1] [--model mock]
        [--token-delay-s 0] [--eos-after N] [--default-max-tokens 16] [--cpu C]

No model runs. This module starts it: as a program (until SIGTERM or SIGINT, its address on
the first line of stdout, pinned with `--cpu`) or on a daemon thread (`serve_in_thread`:
tests, notebooks). What it serves is in `server` (routes, streams), `generation` (vLLM's
chunk and body shapes, token counts, refusals) and `http` (a minimal HTTP/1.1 on stdlib
asyncio streams, so the mock spends less CPU per token than the clients it measures), beside
this module in `workbench.bench.mock_openai`. Binds 127.0.0.1 by default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence

from workbench.bench.mock_openai.generation import MockConfig
from workbench.bench.mock_openai.server import MockServer

__all__ = ["MockConfig", "MockServer", "main", "pin_to_cpus", "serve_in_thread"]


def pin_to_cpus(cpus: Sequence[int]) -> None:
    """Pin every thread of this process (and what it starts later) to `cpus` (Linux
    `sched_setaffinity` per task: with pid 0 it would pin the calling thread only)."""
    target = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, target)


@contextlib.contextmanager
def serve_in_thread(config: MockConfig) -> Iterator[MockServer]:
    """The mock on a daemon thread's own event loop (tests, notebooks); yields the started
    server (`port`), stops it on exit."""
    loop = asyncio.new_event_loop()
    server = MockServer(config)
    thread = threading.Thread(target=loop.run_forever, name="mock-openai", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=30)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _serve(config: MockConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = MockServer(config)
    port = await server.start()
    print(f"mock OpenAI server on http://{config.host}:{port}/v1 (model {config.model!r}, "
          f"token_delay_s {config.token_delay_s})", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.mock_openai",
                                 description=__doc__.split("\n\n")[0])
    d = MockConfig()
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port, help="0: any free port")
    ap.add_argument("--model", default=d.model, help="the served model name")
    ap.add_argument("--token-delay-s", type=float, default=d.token_delay_s,
                    help="seconds between tokens (0: as fast as possible)")
    ap.add_argument("--eos-after", type=int, default=None,
                    help="emit EOS after this many tokens unless the request sets ignore_eos")
    ap.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    ap.add_argument("--max-model-len", type=int, default=d.max_model_len)
    ap.add_argument("--cpu", type=int, action="append", default=None,
                    help="pin the server to this CPU (repeatable)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = MockConfig(host=args.host, port=args.port, model=args.model,
                        token_delay_s=args.token_delay_s, eos_after=args.eos_after,
                        default_max_tokens=args.default_max_tokens,
                        max_model_len=args.max_model_len)
    if args.cpu:
        pin_to_cpus(args.cpu)
    asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
