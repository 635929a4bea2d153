"""A request's `kv_transfer_params` (vLLM's per-request KV connector fields), validated.

    SamplingParams(extra_args={"kv_transfer_params": {"max_load_tokens": 256}})
    {"do_remote_decode": true}                         the prefill leg of a P2P handover
    {"do_remote_prefill": true, "remote_engine_id": .., "remote_request_id": ..,
     "remote_block_ids": [..], "remote_host": .., "remote_port": ..}   the decode leg

The engine config's side is `workbench.config.kv_transfer` (which connector, its settings).
"""

from __future__ import annotations

from typing import Any

from workbench.config.kv_transfer import positive_int

# NixlConnector's handshake fields (vLLM): the prefill request asks for do_remote_decode; its
# response carries the rest, which the decode request sends back with do_remote_prefill.
REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host",
                 "remote_port")
# the workbench's own addition: a layerwise producer that pushed the KV names the decode
# side channel it pushed to ("host:port"), so that consumer waits for the pushes to land
# `prompt_digest` (also the workbench's): sha256 of the prefill's prompt (`p2p_trust`); the
# decode instance reads only a hold whose digest is its own prompt's
KV_TRANSFER_PARAM_KEYS = ("max_load_tokens", "do_remote_decode", "do_remote_prefill",
                          *REMOTE_FIELDS, "tp_size", "pushed_to", "prompt_digest")


def kv_transfer_params(extra_args: dict[str, Any] | None) -> dict[str, Any]:
    """A request's `kv_transfer_params` (from SamplingParams.extra_args), validated."""
    params = (extra_args or {}).get("kv_transfer_params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"kv_transfer_params ({params!r}) must be a dict such as "
                         '{"max_load_tokens": 256} or {"do_remote_decode": true}')
    unknown = sorted(set(params) - set(KV_TRANSFER_PARAM_KEYS))
    if unknown:
        raise ValueError(f"kv_transfer_params has unknown key(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(KV_TRANSFER_PARAM_KEYS)}")
    if "max_load_tokens" in params:
        positive_int("kv_transfer_params", "max_load_tokens", params["max_load_tokens"], 0)
    for name in ("do_remote_decode", "do_remote_prefill"):
        if params.get(name) is not None and not isinstance(params[name], bool):
            raise ValueError(f"kv_transfer_params {name} ({params[name]!r}) must be true or "
                             "false")
    if params.get("tp_size") is not None and params["tp_size"] != 1:
        raise ValueError(f"kv_transfer_params tp_size ({params['tp_size']!r}) must be 1: "
                         "the P2pConnector hands over single-rank KV")
    if params.get("do_remote_decode") and params.get("do_remote_prefill"):
        raise ValueError("kv_transfer_params do_remote_decode and do_remote_prefill cannot "
                         "both be true (a request is either the prefill or the decode leg)")
    if params.get("do_remote_decode"):  # a push target: the decode instance's side channel
        _push_target(params)
    if params.get("do_remote_prefill"):
        missing = [k for k in REMOTE_FIELDS if params.get(k) is None]
        if missing:
            raise ValueError(f"kv_transfer_params do_remote_prefill needs {', '.join(missing)} "
                             "(the prefill instance's response carries them)")
        for name in ("remote_engine_id", "remote_request_id", "remote_host"):
            if not isinstance(params[name], str) or not params[name]:
                raise ValueError(f"kv_transfer_params {name} ({params[name]!r}) must be a "
                                 "non-empty string")
        _check_port(params["remote_port"])
        pushed = params.get("pushed_to")
        if pushed is not None and (not isinstance(pushed, str) or ":" not in pushed):
            raise ValueError(f"kv_transfer_params pushed_to ({pushed!r}) must be "
                             "'host:port' (the side channel the producer pushed to) or null")
        digest = params.get("prompt_digest")
        if digest is not None and not _is_digest(digest):
            raise ValueError(f"kv_transfer_params prompt_digest ({digest!r}) must be 64 "
                             "lowercase hex digits (the prefill's sha256) or null")
        ids = params["remote_block_ids"]
        if not isinstance(ids, list) or not ids or any(
                isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in ids):
            raise ValueError(f"kv_transfer_params remote_block_ids ({ids!r}) must be a "
                             "non-empty list of block ids (integers >= 0)")
    return params


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(
        c in "0123456789abcdef" for c in value)


def _check_port(port: Any) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
        raise ValueError(f"kv_transfer_params remote_port ({port!r}) must be an integer "
                         "in 1..65535")


def _push_target(params: dict[str, Any]) -> None:
    """A prefill request may name the decode instance's side channel (remote_host and
    remote_port, both or neither; vLLM's proxy sends them as null): a layerwise producer
    pushes the KV there while the prefill runs."""
    host, port = params.get("remote_host"), params.get("remote_port")
    if host is None and port is None:
        return
    if host is None or port is None:
        raise ValueError("kv_transfer_params with do_remote_decode need remote_host and "
                         "remote_port together (the decode instance to push the KV to) or "
                         "neither")
    if not isinstance(host, str) or not host:
        raise ValueError(f"kv_transfer_params remote_host ({host!r}) must be a non-empty "
                         "string")
    _check_port(port)
