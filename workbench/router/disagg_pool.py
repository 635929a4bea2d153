"""The disaggregated router's replicas: P prefill + M decode `workbench serve` processes, each
with its side's `--kv-transfer-config`, or servers already running (vLLM or workbench).

    disagg_pool(serve_args, 2, 1, user_kv_config)   replicas 0, 1: prefill   2: decode
        prefill: --kv-transfer-config {"kv_connector": "P2pConnector", "kv_role": "kv_producer"}
        decode:  --kv-transfer-config {"kv_connector": "P2pConnector", "kv_role": "kv_consumer"}
    url_pool(prefill_urls, decode_urls)             the same roles, nothing started
    disagg_sides(serve_args, 2, 1, user_kv_config)  the roles and per-replica flags alone
                                                    (`ray_pool.RayReplicaPool` takes them)

A `--kv-transfer-config` the user gave among the engine flags is taken out of the shared
flags (`split_kv_transfer_config`) and merged per side (`role_kv_transfer_config`): every key
of theirs is kept (kv_connector_extra_config, and kv_connector when they name one), kv_role
is set to the side's; with `kv_push` the prefill side's extra config gets `layerwise: true`
(the push sends staged slices). The JSON is passed through, not validated here: each replica's own
parser checks it when it starts (a refusal is the start failure naming the replica).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.router.pool import ReplicaPool

KV_CONNECTOR = "P2pConnector"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
FLAG = "--kv-transfer-config"


def split_kv_transfer_config(serve_args: list[str]) -> tuple[list[str], dict[str, Any] | None]:
    """(serve_args without --kv-transfer-config, the last one given as a dict, or None);
    ValueError when its value is missing, not JSON or not a JSON object."""
    rest: list[str] = []
    text: str | None = None
    i = 0
    while i < len(serve_args):
        arg = serve_args[i]
        if arg == FLAG:
            if i + 1 >= len(serve_args):
                raise ValueError(f"{FLAG} needs a JSON object")
            text = serve_args[i + 1]
            i += 2
            continue
        if arg.startswith(FLAG + "="):
            text = arg[len(FLAG) + 1:]
        else:
            rest.append(arg)
        i += 1
    if text is None:
        return rest, None
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ValueError(f"kv_transfer_config ({text!r}) is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"kv_transfer_config ({text!r}) must be a JSON object such as "
                         f'{{"kv_connector": "{KV_CONNECTOR}", "kv_connector_extra_config": '
                         "{...}} (kv_role is set per side)")
    return rest, config


def role_kv_transfer_config(user: dict[str, Any] | None, role: str,
                            kv_push: bool = False) -> dict[str, Any]:
    """The side's kv_transfer_config: `user`'s keys, kv_connector P2pConnector unless they
    name one, kv_role the side's (kv_producer for prefill, kv_consumer for decode); with
    `kv_push`, layerwise staging on the prefill side."""
    if role not in KV_ROLES:
        raise ValueError(f"role ({role!r}) must be one of {', '.join(KV_ROLES)}")
    out = {"kv_connector": KV_CONNECTOR, **(user or {}), "kv_role": KV_ROLES[role]}
    if not out["kv_connector"]:
        out["kv_connector"] = KV_CONNECTOR
    if kv_push and role == "prefill":
        extra = out.get("kv_connector_extra_config") or {}
        if isinstance(extra, dict) and extra.get("layerwise") is False:
            raise ValueError("kv_push needs kv_connector_extra_config layerwise true on the "
                             "prefill side (the push sends the staged slices); drop "
                             '"layerwise": false')
        out["kv_connector_extra_config"] = {**extra, "layerwise": True} \
            if isinstance(extra, dict) else extra
    return out


def roles(num_prefill: int, num_decode: int) -> list[str]:
    """["prefill"] x P + ["decode"] x M: prefill replicas first."""
    for name, n in (("num_prefill", num_prefill), ("num_decode", num_decode)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} ({n!r}) must be an integer >= 1")
    return ["prefill"] * num_prefill + ["decode"] * num_decode


def disagg_sides(
    serve_args: list[str], num_prefill: int, num_decode: int,
    kv_transfer_config: dict[str, Any] | None = None, kv_push: bool = False,
) -> tuple[list[str], list[list[str]]]:
    """(each replica's role, each replica's extra flags: its side's --kv-transfer-config), for
    any pool (`disagg_pool`, or `ray_pool.RayReplicaPool`); `serve_args` must not hold a
    --kv-transfer-config: pass the user's as `kv_transfer_config`."""
    if FLAG in serve_args or any(a.startswith(FLAG + "=") for a in serve_args):
        raise ValueError(f"serve_args hold {FLAG}; pass it as kv_transfer_config (merged per "
                         "side)")
    sides = roles(num_prefill, num_decode)
    extra = [[FLAG, json.dumps(role_kv_transfer_config(kv_transfer_config, role, kv_push))]
             for role in sides]
    return sides, extra


def disagg_pool(
    serve_args: list[str], num_prefill: int, num_decode: int,
    kv_transfer_config: dict[str, Any] | None = None, kv_push: bool = False, threads: int = 1,
    ready_timeout_s: float = 300.0, log_dir: str | Path | None = None,
    ports: list[int] | None = None,
) -> ReplicaPool:
    """P prefill + M decode `workbench serve` replicas of `serve_args` (which must not hold a
    --kv-transfer-config: pass the user's as `kv_transfer_config`)."""
    sides, extra = disagg_sides(serve_args, num_prefill, num_decode, kv_transfer_config, kv_push)
    return ReplicaPool(serve_args, len(sides), threads=threads, ready_timeout_s=ready_timeout_s,
                       log_dir=log_dir, ports=ports, roles=sides, replica_args=extra)


def url_pool(prefill_urls: list[str], decode_urls: list[str]) -> ReplicaPool:
    """The servers at `prefill_urls` (replicas 0..P-1) and `decode_urls` (P..P+M-1)."""
    if not prefill_urls or not decode_urls:
        raise ValueError(f"prefill_urls ({prefill_urls}) and decode_urls ({decode_urls}) must "
                         "each name at least one server")
    return ReplicaPool(urls=[*prefill_urls, *decode_urls],
                       roles=roles(len(prefill_urls), len(decode_urls)))
