"""`workbench router`: N independent `workbench serve` replicas behind one OpenAI endpoint.

    workbench router --num-replicas 2 --policy prefix_aware --port 8000 \\
        --model DIR --dtype float32 --max-model-len 1024 [every `workbench serve` flag]

Router flags (`RouterConfig`): --num-replicas, or --num-workers W (W / --tensor-parallel-size
replicas: the worker count held fixed while TP varies), --policy (alias --routing-policy:
round_robin | least_outstanding | prefix_aware), --prefix-blocks K, --prefix-block-size B
(default: the replicas' --block-size), --load-bound-min, --load-bound-frac,
--replica-threads (OMP_NUM_THREADS per replica process and per TP rank, default 1),
--replica-ready-timeout-s, --replica-log-dir, --replica-log-level (default warning),
--max-attempts, --host (default 127.0.0.1), --port (default 8000), --log-level.
`--replica-url URL` (repeatable) routes to servers already running instead of starting
replicas (`--model` still names the folder whose tokenizer keys the requests).

Every other flag goes to each replica's `workbench serve` and is checked by its parser first
(a bad engine flag is one error line, exit status 2). The engine's scheduling `--policy`
(fcfs | priority) is spelled `--scheduling-policy` here, as in vLLM, since `--policy` is the
router's. An experiment template can name this command: its engine config becomes flags, so
`policy: prefix_aware` in a variant is the routing policy.
"""

from __future__ import annotations

import argparse
import logging
import sys

from workbench.router.config import RouterConfig
from workbench.router.policies import POLICIES

# Config keys a template may give that are the router's, not an engine's (flags of this
# command): what a check of a router template's engine config must leave out.
ROUTER_KNOBS = ("num_replicas", "num_workers", "policy", "routing_policy", "prefix_blocks",
                "prefix_block_size", "load_bound_min", "load_bound_frac", "replica_threads",
                "replica_ready_timeout_s", "replica_log_dir", "replica_log_level",
                "replica_url", "scheduling_policy", "max_attempts", "health_interval_s")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench router", allow_abbrev=False,
        description="Route OpenAI requests over independent `workbench serve` replicas.",
        epilog="Other flags go to every replica's `workbench serve` (--model, engine knobs).")
    d = RouterConfig()
    ap.add_argument("--num-replicas", type=int, default=None,
                    help=f"independent replicas (default {d.num_replicas})")
    ap.add_argument("--num-workers", type=int, default=None,
                    help="worker processes in all: num_workers / --tensor-parallel-size "
                         "replicas (instead of --num-replicas)")
    ap.add_argument("--policy", "--routing-policy", dest="policy", choices=POLICIES,
                    default=d.policy)
    ap.add_argument("--prefix-blocks", type=int, default=d.prefix_blocks,
                    help="prefix_aware keys on the first K full blocks of the prompt")
    ap.add_argument("--prefix-block-size", type=int, default=None,
                    help="tokens per block of the key (default: the replicas' block size)")
    ap.add_argument("--load-bound-min", type=float, default=d.load_bound_min)
    ap.add_argument("--load-bound-frac", type=float, default=d.load_bound_frac)
    ap.add_argument("--replica-threads", type=int, default=d.replica_threads)
    ap.add_argument("--replica-ready-timeout-s", type=float, default=d.ready_timeout_s)
    ap.add_argument("--replica-log-dir", default=None,
                    help="replica-<i>.log files here (default: temporary files)")
    ap.add_argument("--replica-log-level", default="warning")
    ap.add_argument("--replica-url", action="append", default=None,
                    help="route to this running server instead of starting replicas")
    ap.add_argument("--scheduling-policy", default=None,
                    help="the replicas' engine --policy (fcfs | priority)")
    ap.add_argument("--max-attempts", type=int, default=None,
                    help="replicas a request may try (default: every live one)")
    ap.add_argument("--health-interval-s", type=float, default=d.health_interval_s)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug"])
    return ap


def _num_replicas(args: argparse.Namespace, tensor_parallel_size: int) -> int:
    """--replica-url count, else --num-workers / TP (checked against --num-replicas when both
    are given), else --num-replicas, else the default."""
    if args.replica_url:
        return len(args.replica_url)
    if args.num_workers is None:
        return RouterConfig.num_replicas if args.num_replicas is None else args.num_replicas
    num = RouterConfig.replicas_for_workers(args.num_workers, tensor_parallel_size)
    if args.num_replicas is not None and args.num_replicas != num:
        raise ValueError(
            f"num_replicas ({args.num_replicas}) contradicts num_workers ({args.num_workers}) "
            f"/ tensor_parallel_size ({tensor_parallel_size}) = {num}; give one of them")
    return num


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, RouterConfig, list[str], str]:
    """(router args, RouterConfig, the replicas' `workbench serve` flags, the model folder)."""
    from workbench.server.serve import parse_args as serve_parse_args

    ap = build_parser()
    args, serve_args = ap.parse_known_args(argv)
    if args.scheduling_policy is not None:
        serve_args += ["--policy", args.scheduling_policy]
    serve_args += ["--log-level", args.replica_log_level]
    _, engine = serve_parse_args([*serve_args, "--port", "0"])  # exits 2 on a bad flag
    tp = engine.parallel_config.tensor_parallel_size
    try:
        num = _num_replicas(args, tp)
        config = RouterConfig(
            num_replicas=num, policy=args.policy, prefix_blocks=args.prefix_blocks,
            block_size=args.prefix_block_size or engine.cache_config.block_size,
            load_bound_min=args.load_bound_min, load_bound_frac=args.load_bound_frac,
            replica_threads=args.replica_threads, ready_timeout_s=args.replica_ready_timeout_s,
            health_interval_s=args.health_interval_s, max_attempts=args.max_attempts,
            tensor_parallel_size=tp)
    except ValueError as e:
        ap.error(str(e))
    return args, config, serve_args, engine.model_config.model


def main(argv: list[str] | None = None) -> None:
    args, config, serve_args, model = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per forwarded request
    import uvicorn

    from workbench.models.tokenizer import load_tokenizer
    from workbench.router.app import build_router_app
    from workbench.router.pool import ReplicaPool

    if args.replica_url:
        pool = ReplicaPool(urls=args.replica_url)
    else:
        pool = ReplicaPool(serve_args, config.num_replicas, threads=config.replica_threads,
                           ready_timeout_s=config.ready_timeout_s, log_dir=args.replica_log_dir)
    app = build_router_app(config, pool, load_tokenizer(model))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
