"""`workbench router`: N independent `workbench serve` replicas behind one OpenAI endpoint.

    workbench router --num-replicas 2 --policy prefix_aware --port 8000 \\
        --model DIR --dtype float32 --max-model-len 1024 [every `workbench serve` flag]

Router flags (`RouterConfig`): --num-replicas, or --num-workers W (W / --tensor-parallel-size
replicas: the worker count held fixed while TP varies), --policy (alias --routing-policy:
round_robin | least_outstanding | prefix_aware), --prefix-blocks K, --prefix-block-size B
(default: the replicas' --block-size), --load-bound-min, --load-bound-frac,
--replica-threads (OMP_NUM_THREADS per replica process and per TP rank, default 1),
--replica-ready-timeout-s, --replica-log-dir, --replica-log-level (default warning),
--max-attempts, --host (default 127.0.0.1), --port (default 8000; a busy port is one error
line before any replica starts), --log-level. `--api-key KEY` (a `workbench serve` flag, so
every replica gets it) also guards the router: every route but /health and /metrics needs
`Authorization: Bearer KEY`. Logged command lines show `--api-key ***`.
`--replica-url URL` (repeatable) routes to servers already running instead of starting
replicas (`--model` still names the folder whose tokenizer keys the requests).

Where the replicas run: `--executor local` (default: processes on 127.0.0.1) or
`--executor ray [--address HOST:PORT]` (Ray actors on a Ray cluster's nodes, spread one per
node while nodes have room, restarted by Ray when lost and routed to again; `ray_pool.py`,
docs/cluster_serving.md), with `--replica-num-cpus C` (each replica's placement bundle;
default --replica-threads x --tensor-parallel-size) and `--replica-resources JSON` (custom
resources per replica, e.g. '{"workbench_node": 1}': a node each). Not with --replica-url,
--prefill-url / --decode-url or --replica-log-dir. Both modes, colocated and disaggregated.

Disaggregated prefill/decode (`disagg.py`; `workbench disagg ...` is this command in that mode):

    workbench router --num-prefill P --num-decode M [--prefill-policy prefix_aware]
        [--decode-policy least_outstanding] --model DIR [every `workbench serve` flag]
    workbench router --prefill-url URL [--prefill-url URL ...] --decode-url URL [...] \
        --model DIR                                   servers already running (vLLM or ours)

Any of these flags selects the mode (`workbench disagg` alone: P = M = 1). P prefill replicas
get `--kv-transfer-config {"kv_connector": "P2pConnector", "kv_role": "kv_producer"}`, M
decode replicas `kv_consumer`; a --kv-transfer-config among the engine flags is merged per
side (`disagg_pool`). --prefill-policy: round_robin | least_outstanding | prefix_aware;
--decode-policy: round_robin | least_outstanding. --num-workers W, if given, must equal
(P + M) x --tensor-parallel-size; with W and no --num-decode, M = W / TP - P, so at a fixed W
`--num-prefill` is the one knob of "colocated vs P:D" (0: the colocated router, W / TP
replicas). --num-replicas and --replica-url are the colocated mode's.

Every other flag goes to each replica's `workbench serve` and is checked by its parser first
(a bad engine flag is one error line, exit status 2). The engine's scheduling `--policy`
(fcfs | priority) is spelled `--scheduling-policy` here, as in vLLM, since `--policy` is the
router's. An experiment template can name this command: its engine config becomes flags, so
`policy: prefix_aware` in a variant is the routing policy.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING

from workbench.router.config import DECODE_POLICIES, EXECUTORS, RouterConfig
from workbench.router.policies import POLICIES

if TYPE_CHECKING:
    from workbench.router.ray_pool import RayReplicaPool

# Config keys a template may give that are the router's, not an engine's (flags of this
# command): what a check of a router template's engine config must leave out.
ROUTER_KNOBS = ("num_replicas", "num_workers", "policy", "routing_policy", "prefix_blocks",
                "prefix_block_size", "load_bound_min", "load_bound_frac", "replica_threads",
                "replica_ready_timeout_s", "replica_log_dir", "replica_log_level",
                "replica_url", "scheduling_policy", "max_attempts", "health_interval_s",
                "num_prefill", "num_decode", "prefill_url", "decode_url", "prefill_policy",
                "decode_policy", "kv_push", "executor", "address", "replica_num_cpus",
                "replica_resources")


def build_parser(prog: str = "workbench router") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
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
    g = ap.add_argument_group("disaggregated prefill/decode (any of these selects it)")
    g.add_argument("--num-prefill", type=int, default=None,
                   help="prefill replicas (kv_producer; default 1; 0: colocated)")
    g.add_argument("--num-decode", type=int, default=None,
                   help="decode replicas (kv_consumer; default 1, or with --num-workers W: "
                        "W / TP - P)")
    g.add_argument("--prefill-url", action="append", default=None,
                   help="a running prefill server (repeatable; with --decode-url)")
    g.add_argument("--decode-url", action="append", default=None,
                   help="a running decode server (repeatable; with --prefill-url)")
    g.add_argument("--prefill-policy", choices=POLICIES, default=d.prefill_policy)
    g.add_argument("--decode-policy", choices=DECODE_POLICIES, default=d.decode_policy)
    g.add_argument("--kv-push", action=argparse.BooleanOptionalAction, default=d.kv_push,
                   help="choose the decode replica first and have the (layerwise) prefill "
                        "replica push the KV to it while it prefills (default: the decode "
                        "replica pulls after the prefill)")
    r = ap.add_argument_group("where the replicas run")
    r.add_argument("--executor", choices=EXECUTORS, default=d.executor,
                   help="local: processes on this machine; ray: Ray actors on a Ray cluster's "
                        "nodes, restarted when lost (pip install -e '.[cluster]')")
    r.add_argument("--address", default=None,
                   help="ray: the cluster's HOST:PORT (default: RAY_ADDRESS, else the cluster "
                        "`ray start` started here, else a new local one)")
    r.add_argument("--replica-num-cpus", type=float, default=None,
                   help="ray: CPUs each replica's placement bundle holds (default: "
                        "--replica-threads x --tensor-parallel-size)")
    r.add_argument("--replica-resources", default=None,
                   help='ray: custom resources per replica, JSON, e.g. {"workbench_node": 1} '
                        "(a node each)")
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


def _sides(args: argparse.Namespace, tensor_parallel_size: int) -> tuple[int, int]:
    """(num_prefill, num_decode) of the disaggregated mode: the URL counts, else the flags
    (1 each by default); ValueError for a colocated flag or a contradiction."""
    for name, value in (("num_replicas", args.num_replicas), ("replica_url", args.replica_url)):
        if value is not None:
            raise ValueError(f"{name} ({value}) is the colocated router's; with disaggregated "
                             "prefill/decode give --num-prefill and --num-decode (or "
                             "--prefill-url and --decode-url)")
    if args.prefill_url or args.decode_url:
        if not (args.prefill_url and args.decode_url):
            raise ValueError(f"prefill_url ({args.prefill_url}) and decode_url "
                             f"({args.decode_url}) must both be given (running servers)")
        if args.num_prefill is not None or args.num_decode is not None:
            raise ValueError(f"num_prefill ({args.num_prefill}) / num_decode "
                             f"({args.num_decode}) start replicas; --prefill-url and "
                             "--decode-url name running ones: give one or the other")
        return len(args.prefill_url), len(args.decode_url)
    prefill = 1 if args.num_prefill is None else args.num_prefill
    decode = args.num_decode
    if decode is None and args.num_workers is not None and isinstance(prefill, int):
        # the worker count held fixed: the workers left after the prefill side decode
        decode = RouterConfig.replicas_for_workers(args.num_workers,
                                                   tensor_parallel_size) - prefill
    sides = (prefill, 1 if decode is None else decode)
    for name, n in zip(("num_prefill", "num_decode"), sides, strict=True):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} ({n}) must be an integer >= 1 with disaggregated "
                             "prefill/decode")
    if args.num_workers is not None:
        workers = sum(sides) * tensor_parallel_size
        if args.num_workers != workers:
            raise ValueError(
                f"num_workers ({args.num_workers}) contradicts (num_prefill ({sides[0]}) + "
                f"num_decode ({sides[1]})) x tensor_parallel_size ({tensor_parallel_size}) = "
                f"{workers}")
    return sides


def _ray_placement(args: argparse.Namespace) -> dict[str, float] | None:
    """--replica-resources as a dict; ValueError for it, or for flags that name running
    servers or log files, with --executor ray."""
    resources = None
    if args.replica_resources is not None:
        try:
            resources = json.loads(args.replica_resources)
        except ValueError as e:
            raise ValueError(f"replica_resources ({args.replica_resources!r}) is not JSON: "
                             f"{e}") from None
    if args.executor == "ray":
        for name in ("replica_url", "prefill_url", "decode_url", "replica_log_dir"):
            value = getattr(args, name)
            if value is not None:
                what = "names a log folder on this machine (Ray keeps each replica's log on "\
                       "its node)" if name == "replica_log_dir" else "routes to running servers"
                raise ValueError(f"{name} ({value}) {what}; --executor ray starts the "
                                 "replicas as Ray actors: give one or the other")
    return resources


def parse_args(argv: list[str], disaggregated: bool = False
               ) -> tuple[argparse.Namespace, RouterConfig, list[str], str]:
    """(router args, RouterConfig, the replicas' `workbench serve` flags, the model folder).
    Disaggregated (`disaggregated`, or any disaggregation flag): the serve flags come without
    the user's --kv-transfer-config, which is `args.kv_transfer_config` (a dict or None)."""
    from workbench.entrypoints.openai.cli_args import parse_args as serve_parse_args
    from workbench.router.disagg_pool import split_kv_transfer_config

    ap = build_parser("workbench disagg" if disaggregated else "workbench router")
    args, serve_args = ap.parse_known_args(argv)
    if args.num_prefill == 0 and not disaggregated:  # explicit: colocated (a template's
        if args.num_decode not in (None, 0):          # baseline at num_prefill 0)
            ap.error(f"num_decode ({args.num_decode}) needs num_prefill >= 1; num_prefill 0 "
                     "is the colocated router")
        args.num_prefill = args.num_decode = None
    disaggregated = disaggregated or any(
        v is not None for v in (args.num_prefill, args.num_decode, args.prefill_url,
                                args.decode_url))
    args.kv_transfer_config = None
    if disaggregated:  # passed through per side, not checked here (see disagg_pool)
        try:
            serve_args, args.kv_transfer_config = split_kv_transfer_config(serve_args)
        except ValueError as e:
            ap.error(str(e))
    if args.scheduling_policy is not None:
        serve_args += ["--policy", args.scheduling_policy]
    serve_args += ["--log-level", args.replica_log_level]
    serve_ns, engine = serve_parse_args([*serve_args, "--port", "0"])  # exits 2 on a bad flag
    args.api_key = serve_ns.api_key  # the replicas' key guards the router too
    tp = engine.parallel_config.tensor_parallel_size
    args.device = engine.device
    args.tp_backend = engine.parallel_config.distributed_executor_backend
    try:
        resources = _ray_placement(args)
        num, prefill, decode = RouterConfig.num_replicas, 0, 0
        if disaggregated:
            prefill, decode = _sides(args, tp)
        else:
            num = _num_replicas(args, tp)
        config = RouterConfig(
            num_replicas=num, policy=args.policy, prefix_blocks=args.prefix_blocks,
            block_size=args.prefix_block_size or engine.cache_config.block_size,
            load_bound_min=args.load_bound_min, load_bound_frac=args.load_bound_frac,
            replica_threads=args.replica_threads, ready_timeout_s=args.replica_ready_timeout_s,
            health_interval_s=args.health_interval_s, max_attempts=args.max_attempts,
            tensor_parallel_size=tp, num_prefill=prefill, num_decode=decode,
            prefill_policy=args.prefill_policy, decode_policy=args.decode_policy,
            kv_push=args.kv_push, executor=args.executor, address=args.address,
            replica_num_cpus=args.replica_num_cpus, replica_resources=resources)
    except ValueError as e:
        ap.error(str(e))
    return args, config, serve_args, engine.model_config.model


def main(argv: list[str] | None = None, disaggregated: bool = False) -> None:
    args, config, serve_args, model = parse_args(list(sys.argv[1:] if argv is None else argv),
                                                  disaggregated)
    from workbench.harness.ports import check_port_free

    check_port_free(args.host, args.port, "the router")  # before minutes of replica start-up
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per forwarded request
    import uvicorn

    from workbench.models.tokenizer import load_tokenizer
    from workbench.router.app import build_router_app
    from workbench.router.pool import ReplicaPool

    pool: ReplicaPool
    if config.executor == "ray":
        pool = _ray_pool(args, config, serve_args)
    elif config.disaggregated:
        from workbench.router.disagg_pool import disagg_pool, url_pool

        if args.prefill_url:
            pool = url_pool(args.prefill_url, args.decode_url)
        else:
            pool = disagg_pool(serve_args, config.num_prefill, config.num_decode,
                               args.kv_transfer_config, kv_push=config.kv_push,
                               threads=config.replica_threads,
                               ready_timeout_s=config.ready_timeout_s,
                               log_dir=args.replica_log_dir)
    elif args.replica_url:
        pool = ReplicaPool(urls=args.replica_url)
    else:
        pool = ReplicaPool(serve_args, config.num_replicas, threads=config.replica_threads,
                           ready_timeout_s=config.ready_timeout_s, log_dir=args.replica_log_dir)
    app = build_router_app(config, pool, load_tokenizer(model), api_key=args.api_key)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)


def _ray_pool(args: argparse.Namespace, config: RouterConfig,
              serve_args: list[str]) -> RayReplicaPool:
    """The replicas (or the P prefill + M decode instances) as Ray actors: each bundle holds
    the replica's engine process and its "mp" TP ranks (with the "ray" TP backend, rank 0 only:
    the engine places the others), on CUDA one GPU per rank held."""
    from workbench.router.disagg_pool import disagg_sides
    from workbench.router.ray_pool import RayReplicaPool

    ranks = config.tensor_parallel_size if args.tp_backend == "mp" else 1
    roles = extra = None
    if config.disaggregated:
        roles, extra = disagg_sides(serve_args, config.num_prefill, config.num_decode,
                                    args.kv_transfer_config, kv_push=config.kv_push)
    return RayReplicaPool(
        serve_args, config.num_replicas, threads=config.replica_threads,
        ready_timeout_s=config.ready_timeout_s, address=config.address,
        num_cpus=config.replica_num_cpus or config.replica_threads * ranks,
        num_gpus=ranks if args.device == "cuda" else 0, resources=config.replica_resources,
        roles=roles, replica_args=extra)


if __name__ == "__main__":
    main()
