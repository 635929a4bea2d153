"""Two `workbench serve` replicas behind `workbench router` (round robin) sharing one disk
tier (TieringOffloadingSpec): the second replica loads the KV the first one computed, and
both return the same greedy tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.router.serving import serve_router
from workbench.harness import prom
from workbench.models.tokenizer import load_tokenizer
from workbench.router.app import build_router_app
from workbench.router.config import RouterConfig
from workbench.router.pool import ReplicaPool
from workbench.testing import tiny_checkpoint

BLOCK = 16
PROMPT_LEN = 97  # 6 full 16-token blocks load, the last token is computed


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("shared-store")
    model = tiny_checkpoint(tmp / "tiny-llama", arch="llama", seed=0)
    store = tmp / "store"
    kt = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 24,
                                        "spec_name": "TieringOffloadingSpec",
                                        "disk_path": str(store)}}
    serve = ["--model", str(model), "--dtype", "float32", "--max-model-len", "256",
             "--block-size", str(BLOCK), "--num-gpu-blocks-override", "64",
             "--served-model-name", "tiny", "--kv-transfer-config", json.dumps(kt)]
    pool = ReplicaPool(serve, 2, log_dir=tmp / "logs", ready_timeout_s=180)
    app = build_router_app(RouterConfig(num_replicas=2, policy="round_robin", block_size=BLOCK,
                                        health_interval_s=0.2), pool, load_tokenizer(model))
    with serve_router(app, pool) as (url, _, _):
        yield {"url": url, "pool": pool, "store": store}


def complete(url: str, prompt: list[int], **extra: Any) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, **extra}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return list(r.json()["choices"][0]["token_ids"])


def counters(base_url: str) -> dict[str, float]:
    return prom.parse(httpx.get(f"{base_url}/metrics", timeout=30).text)


def test_a_replica_loads_what_the_other_computed(router: dict[str, Any]) -> None:
    prompt = [(7 * i) % 500 + 20 for i in range(PROMPT_LEN)]
    first = complete(router["url"], prompt)  # round robin: replica 0 computes and stores
    deadline = time.monotonic() + 30  # the disk writes run on a writer thread
    while len(list(router["store"].rglob("*.kv"))) < PROMPT_LEN // BLOCK and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    second = complete(router["url"], prompt)  # replica 1: nothing on its device or host
    assert second == first
    hits = [counters(r.base_url).get("workbench:kv_offload_disk_hits_total", 0.0)
            for r in router["pool"].replicas]
    assert sorted(hits) == [0.0, (PROMPT_LEN - 1) // BLOCK * BLOCK]


def test_bad_kv_transfer_params_is_a_400_naming_the_field(router: dict[str, Any]) -> None:
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2,
            "kv_transfer_params": {"max_load_tokens": -4}}
    r = httpx.post(f"{router['url']}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "kv_transfer_params"
    assert "max_load_tokens (-4) must be an integer >= 0" in r.json()["error"]["message"]
