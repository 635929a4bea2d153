"""API fuzzing of the disaggregation proxy with schemathesis (`tests/server/test_schemathesis.py`'s
modes and checks), through a prefill and a decode replica of the tiny checkpoint.

The proxy serves the replicas' OpenAI routes, so their schema (a replica's /openapi.json) is
its contract: every operation the proxy shares with a replica is fuzzed against the proxy with
positive, negative and "hostile" cases (a lone surrogate or a non-finite number planted in a
valid body: a 400 naming that path). Positive bodies may carry a client's own
`kv_transfer_params` (the schema allows the field): the proxy drops them, so none of them is a
5xx or a decode replica reading from a host the client chose. Afterwards: the proxy and both
replicas healthy, nothing in flight, the decode replica's KV cache empty and the prefill
replica holding nothing (every hold read, released or expired).

    .venv/bin/python -m pytest tests/router/test_disagg_schemathesis.py -q -s   # ~30 s
    WORKBENCH_FUZZ_LONG=1 ... (400 cases per operation and mode; WORKBENCH_FUZZ_SEED=...)

The case counts are the replica fuzz's (30 per operation and mode, 400 long).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from schemathesis import GenerationMode

from tests.router.serving import serve_router
from tests.server.conftest import MODEL_NAME, ServerHandle, start_server, stop_server
from tests.server.test_schemathesis import (
    EXAMPLES,
    FUZZ_ENGINE_KW,
    Tally,
    _fuzz,
    _fuzz_hostile,
    _report,
)
from workbench.config import EngineConfig
from workbench.config.named_models import bundled_checkpoint
from workbench.models.tokenizer import load_tokenizer
from workbench.router.app import build_router_app
from workbench.router.config import RouterConfig
from workbench.router.disagg_pool import url_pool
from workbench.server.app import build_app

LONG = os.environ.get("WORKBENCH_FUZZ_LONG") == "1"
# the operations of the replicas' schema that the proxy forwards (its /health, /metrics and
# /reset_prefix_cache answer for the whole pool, in the router's own format; GET
# /kv_transfer_info is a replica's own)
OPERATIONS = {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models"}
ABORT_TIMEOUT_S = 5.0  # the prefill replica frees a hold nobody read after this


@dataclass
class Proxy:
    url: str
    prefill: ServerHandle
    decode: ServerHandle


def replica(model_dir: Path, role: str, extra: dict[str, Any]) -> ServerHandle:
    config = EngineConfig.from_kwargs(str(model_dir), **FUZZ_ENGINE_KW, kv_transfer_config={
        "kv_connector": "P2pConnector", "kv_role": role, "kv_connector_extra_config": extra})
    return start_server(build_app(config, served_model_name=MODEL_NAME))


@pytest.fixture(scope="module")
def proxy() -> Iterator[Proxy]:
    model_dir = bundled_checkpoint()
    prefill = replica(model_dir, "kv_producer", {"abort_timeout_s": ABORT_TIMEOUT_S})
    decode = replica(model_dir, "kv_consumer", {})
    config = RouterConfig(num_prefill=1, num_decode=1, block_size=16, health_interval_s=1.0)
    pool = url_pool([prefill.base_url], [decode.base_url])
    app = build_router_app(config, pool, load_tokenizer(model_dir))
    try:
        with serve_router(app, pool) as (url, _, _):
            yield Proxy(url, prefill, decode)
    finally:
        stop_server(prefill)
        stop_server(decode)


def test_fuzz_the_proxy_from_the_replicas_openapi_schema(proxy: Proxy) -> None:
    schema = schemathesis.openapi.from_url(f"{proxy.decode.base_url}/openapi.json")
    ops = {op.label: op for op in (r.ok() for r in schema.get_all_operations())
           if op.label in OPERATIONS}
    assert set(ops) == OPERATIONS
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED", random.randrange(1 << 32))) if LONG \
        else None
    tallies: dict[tuple[str, str], Tally] = {}
    t0 = time.perf_counter()
    with requests.Session() as session:
        for label in sorted(ops):
            op = ops[label]
            has_input = bool(op.body) or any(True for _ in op.iter_parameters())
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and not has_input:
                    continue
                tallies[(label, mode.value)] = _fuzz(op, mode, proxy.url, session, seed)
            if op.method.upper() == "POST" and op.body:
                tallies[(label, "hostile")] = _fuzz_hostile(op, proxy.url, session, seed)
    print("\n" + _report(tallies, seed, time.perf_counter() - t0))

    failures = [f for t in tallies.values() for f in t.failures]
    assert not failures, f"{len(failures)} failing cases; the first ones:\n" + "\n\n".join(
        failures[:5])
    for label in ("POST /v1/completions", "POST /v1/chat/completions"):
        pos = tallies[(label, "positive")]
        assert pos.cases >= EXAMPLES // 2 and pos.statuses[200] >= 1, pos
        neg = tallies[(label, "negative")]
        assert neg.cases >= EXAMPLES // 2 and neg.statuses[200] == 0, neg
        hostile = tallies[(label, "hostile")]
        assert hostile.cases >= EXAMPLES // 2 and set(hostile.statuses) == {400}, hostile
    # healthy and idle afterwards: the proxy, the decode replica (nothing in flight, its KV
    # cache empty), the prefill replica's holds all read, released or expired (a decode leg
    # refused after its prefill, e.g. a prompt plus max_tokens past max_model_len, leaves its
    # hold to expire: a bounded wait past abort_timeout_s)
    assert httpx.get(f"{proxy.url}/health", timeout=10).status_code == 200
    proxy.decode.wait_idle(timeout_s=30)
    deadline = time.monotonic() + ABORT_TIMEOUT_S + 30
    while time.monotonic() < deadline:
        held = proxy.prefill.engine.submit(_held).result(timeout=30)
        if held == (0, 0.0):
            break
        time.sleep(0.2)
    assert held == (0, 0.0), f"the prefill replica still holds {held[0]} legs' blocks"
    assert proxy.prefill.engine.num_in_flight() == 0


def _held(engine: Any) -> tuple[int, float]:
    """(legs held, KV cache usage) of a prefill engine, after polling its transfers."""
    engine.poll_kv_transfers()
    return len(engine.scheduler.sending), engine.scheduler.kv_cache_manager.usage
