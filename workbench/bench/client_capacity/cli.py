"""`workbench bench client-capacity`: how fast the load generator itself can go, so that a
measured server is never limited by its client.

    workbench bench client-capacity [--rates 50,100,200,...] [--duration-s 4]
        [--input-len 32] [--output-len 64] [--arrival poisson|constant] [--max-concurrency N]
        [--token-delay-s 0] [--stop-after 1] [--redo-disturbed 1] [--seed 0] [--no-pin]
        [--no-vllm] [--vllm-venv DIR] [--json PATH] [--strict] [--max-other-cpu-share 0.25]

The system under test is `mock_openai` (its own process, streaming tokens as fast as it can),
pinned to another core than this process where the machine has two or more. Each step is one
open-loop run at one rate: `duration_s` seconds of Poisson (or constant) arrivals, prompts of
`input_len` token ids, `output_len` tokens each, first through the workbench's own HTTP path
(`ours`), then, when its venv exists, through `vllm bench serve` (`vllm`). Rates rise
until `stop_after` steps in a row were late or failed (`steps`); the table, summary and JSON
are `report`'s. The package `workbench.bench.client_capacity`:

    config       the flags' dataclass (validated)
    steps        StepResult, statuses, the climb and its ceilings
    ours         one step of ours, judged by the harness's own validity checks
    vllm         one step of vLLM's client
    report       the result: table, summary, JSON
    cli (here)   start the mock, pin, sweep both clients; the command line
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from workbench.bench.client_capacity.config import ARRIVALS, MODEL, ClientCapacityConfig
from workbench.bench.client_capacity.ours import run_ours
from workbench.bench.client_capacity.report import ClientCapacity
from workbench.bench.client_capacity.steps import StepResult, sweep
from workbench.bench.client_capacity.vllm import run_vllm, vllm_plan
from workbench.bench.disagg.capacity import add_output_args
from workbench.bench.mock_openai.serve import pin_to_cpus
from workbench.harness.validity import (
    MAX_MEDIAN_LATENESS_S,
    MAX_P95_READ_LAG_S,
    CpuWatch,
    default_cpu_watch,
)


def plan_cores(available: set[int]) -> tuple[set[int], set[int]] | None:
    """(client cores, mock cores): one core each, the two lowest; None with one core."""
    cores = sorted(available)
    return ({cores[0]}, {cores[1]}) if len(cores) >= 2 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(config: ClientCapacityConfig, watch: CpuWatch | None = None,
            print_line: Callable[[str], None] | None = print) -> ClientCapacity:
    """Start the mock, pin, step our client (then vLLM's), stop the mock, unpin."""
    from workbench.bench.micro.roofline import cpu_summary
    from workbench.harness.server_process import ServerProcess

    watch = watch if watch is not None else default_cpu_watch()
    plan = plan_cores(os.sched_getaffinity(0)) if config.pin else None
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "workbench.bench.mock_openai", "--port", str(port),
           "--model", MODEL, "--token-delay-s", str(config.token_delay_s)]
    cmd += [f"--cpu={c}" for c in sorted(plan[1])] if plan else []
    original = os.sched_getaffinity(0)
    python, note = vllm_plan(config)
    with tempfile.TemporaryDirectory(prefix="client-capacity-") as tmp, ServerProcess(
            cmd, root + "/v1", ready_timeout_s=60, log_path=Path(tmp) / "mock.log") as server:
        try:
            if plan:
                pin_to_cpus(sorted(plan[0]))
            ours, _ = sweep(config, lambda r: run_ours(config, root + "/v1", server, r, watch),
                            print_line)
            theirs: list[StepResult] = []
            if python is not None:
                theirs, failure = sweep(config, lambda r: run_vllm(
                    python, config, root, server.pid, r, watch), print_line)
                note = None if failure is None else f"failed: {failure}"
        finally:
            if plan:
                pin_to_cpus(sorted(original))
    pinning = {"client": sorted(plan[0]), "mock": sorted(plan[1])} if plan else None
    return ClientCapacity(config, cpu_summary(), pinning, ours, theirs, note)


def _rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rates {text!r}: {e}") from e


def _parser() -> argparse.ArgumentParser:
    d = ClientCapacityConfig()
    ap = argparse.ArgumentParser(prog="workbench bench client-capacity",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=_rates, default=d.rates, help="req/s, comma-separated")
    ap.add_argument("--duration-s", type=float, default=d.duration_s, help="per step")
    ap.add_argument("--input-len", type=int, default=d.input_len, help="prompt tokens")
    ap.add_argument("--output-len", type=int, default=d.output_len, help="tokens per request")
    ap.add_argument("--arrival", choices=ARRIVALS, default=d.arrival)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--token-delay-s", type=float, default=d.token_delay_s,
                    help="the mock's delay between tokens")
    ap.add_argument("--stop-after", type=int, default=d.stop_after,
                    help="stop after this many steps in a row were late or failed")
    ap.add_argument("--redo-disturbed", type=int, default=d.redo_disturbed,
                    help="redo a disturbed step up to this many times")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--no-pin", action="store_true", help="leave client and mock unpinned")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's client")
    ap.add_argument("--vllm-venv", type=Path, default=d.vllm_venv)
    add_output_args(ap)
    return ap


def main(argv: Sequence[str] | None = None, watch: CpuWatch | None = None) -> int:
    args = _parser().parse_args(argv)
    config = ClientCapacityConfig(
        rates=args.rates, duration_s=args.duration_s, input_len=args.input_len,
        output_len=args.output_len, arrival=args.arrival, max_concurrency=args.max_concurrency,
        token_delay_s=args.token_delay_s, stop_after=args.stop_after,
        redo_disturbed=args.redo_disturbed, max_other_cpu_share=args.max_other_cpu_share,
        seed=args.seed, pin=not args.no_pin, vllm=not args.no_vllm, vllm_venv=args.vllm_venv)
    result = measure(config, watch)
    pin = (f"client on CPU {result.pinning['client']}, mock on CPU {result.pinning['mock']}"
           if result.pinning else "not pinned")
    print(f"\n{result.cpu}; {pin}; {config.arrival} arrivals, {config.duration_s:g} s per "
          f"step, prompts {config.input_len} tokens, {config.output_len} tokens streamed each; "
          f"late above a median lateness of {MAX_MEDIAN_LATENESS_S * 1e3:g} ms, slow-read above "
          f"a p95 read-loop lag of {MAX_P95_READ_LAG_S * 1e3:g} ms\n")
    print(result.table() + "\n")
    print(result.summary())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.as_dict(), indent=1))
    if result.disturbed:
        print(f"INVALID steps (disturbed): other processes used more than "
              f"{config.max_other_cpu_share:.0%} of the CPUs; not used for the ceiling")
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
