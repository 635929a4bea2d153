"""Disaggregated serving end to end: `workbench router` with 1 prefill + 2 decode real
`workbench serve` replicas of a tiny checkpoint (P2pConnector over ZeroMQ), driven with the
real `openai` client. Greedy outputs equal a colocated request (a decode replica computing
the prompt itself); the KV is read, not recomputed (the decode replica's counters); a
prefill replica killed between its prefill and the decode's read costs a recompute, not the
request; a decode replica killed mid-stream is resumed on the other; with the prefill
replica gone every request falls back to the decode side. The prefill replica stages
layerwise, so the router may also push (`kv_push`): the decode replica then decodes from the
pushed KV without a pull. Tests run in file order: the
kills come last."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from tests.router.serving import serve_router
from workbench.harness import prom
from workbench.models.tokenizer import load_tokenizer
from workbench.router.app import build_router_app
from workbench.router.config import RouterConfig
from workbench.router.disagg import DisaggRouter
from workbench.router.disagg_pool import disagg_pool
from workbench.router.disagg_push import SideChannels
from workbench.testing import tiny_checkpoint

SERVE = ["--dtype", "float32", "--max-model-len", "384", "--block-size", "16",
         "--num-gpu-blocks-override", "256", "--served-model-name", "tiny"]
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True,
                                                             "return_token_ids": True}}
PROMPT = "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n    "


@dataclass
class Handle:
    app: FastAPI
    url: str

    @property
    def router(self) -> DisaggRouter:
        return self.app.state.router  # type: ignore[no-any-return]

    def replica(self, i: int) -> Any:
        return self.router.pool.replicas[i]

    def client(self, url: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=(url or self.url) + "/v1", api_key="none",
                             max_retries=0, timeout=120)

    def scrape(self, i: int) -> dict[str, float]:
        return prom.parse(httpx.get(self.replica(i).base_url + "/metrics", timeout=30).text)


@pytest.fixture(scope="module")
def handle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Handle]:
    tmp = tmp_path_factory.mktemp("disagg")
    model = tiny_checkpoint(tmp / "tiny-llama", arch="llama", seed=0)
    config = RouterConfig(num_prefill=1, num_decode=2, decode_policy="least_outstanding",
                          block_size=16, health_interval_s=0.2)
    pool = disagg_pool(["--model", str(model), *SERVE], 1, 2, log_dir=tmp / "logs",
                       ready_timeout_s=180, kv_push=True)
    app = build_router_app(config, pool, load_tokenizer(model))
    with serve_router(app, pool) as (url, _, _):
        yield Handle(app, url)


def colocated(handle: Handle, max_tokens: int, prompt: str = PROMPT) -> Any:
    """The reference: decode replica 2 computing the whole request itself."""
    return handle.client(handle.replica(2).base_url).completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, **GREEDY).choices[0]


def test_openai_client_through_the_disaggregated_router_equals_colocated(
        handle: Handle) -> None:
    want = colocated(handle, 24)
    prompt_ids = len(handle.router.tokenizer(PROMPT)["input_ids"])
    before = [handle.scrape(i) for i in (1, 2)]
    sent_before = handle.scrape(0).get("workbench:kv_transfer_send_bytes_total", 0)
    got = handle.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                             **GREEDY)
    assert got.choices[0].text == want.text
    assert got.choices[0].token_ids == want.token_ids  # type: ignore[attr-defined]
    assert got.usage is not None and got.usage.completion_tokens == 24
    # the decode replica read every prompt token but the last instead of computing them
    after = [handle.scrape(i) for i in (1, 2)]
    read = sum(a.get("workbench:kv_transfer_recv_tokens_total", 0)
               - b.get("workbench:kv_transfer_recv_tokens_total", 0)
               for a, b in zip(after, before, strict=True))
    assert read == prompt_ids - 1
    # the scrape takes the idle prefill replica's news: what it sent is what was read
    received = sum(a.get("workbench:kv_transfer_recv_bytes_total", 0)
                   - b.get("workbench:kv_transfer_recv_bytes_total", 0)
                   for a, b in zip(after, before, strict=True))
    assert received > 0
    assert handle.scrape(0)["workbench:kv_transfer_send_bytes_total"] - sent_before == received
    assert handle.scrape(0)["workbench:kv_transfer_held_requests"] == 0
    record = handle.router.records[-1]
    assert record.prefill_outcome == "ok" and record.prefill_replicas == [0]
    # streaming and chat, same tokens as the colocated answer
    stream = handle.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                                stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in stream if c.choices) == want.text
    chat_body = {"model": "tiny", "max_tokens": 12,
                 "messages": [{"role": "user", "content": "What is a block?"}]}
    want_chat = handle.client(handle.replica(2).base_url).chat.completions.create(
        **chat_body, **GREEDY).choices[0].message.content
    got_chat = handle.client().chat.completions.create(**chat_body, **GREEDY)
    assert got_chat.choices[0].message.content == want_chat


def test_kv_push_decodes_from_the_kv_pushed_during_the_prefill(handle: Handle) -> None:
    """The router with kv_push: the decode replica is chosen first and named in the prefill
    request; the prefill replica pushes each layer's KV there while it prefills, the decode
    replica decodes from it (no pull: nothing sent on request) and tokens stay equal."""
    prompt = PROMPT + "return parser"
    router = handle.router
    router.side_channels = SideChannels(router.client)  # as `--kv-push` starts it
    try:
        before = [handle.scrape(i) for i in (0, 1, 2)]
        seq = router._seq
        got = handle.client().completions.create(model="tiny", prompt=prompt, max_tokens=16,
                                                 **GREEDY).choices[0]
        stream = handle.client().completions.create(model="tiny", prompt=prompt,
                                                    max_tokens=16, stream=True, **GREEDY)
        streamed = "".join(c.choices[0].text for c in stream if c.choices)
        deadline = time.monotonic() + 10  # a stream's record lands when its relay closes
        while len([r for r in router.records if r.seq > seq]) < 2 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        records = [r for r in router.records if r.seq > seq]
    finally:
        router.side_channels = None
    assert [r.pushed_to for r in records] == [r.decode_replicas[0] for r in records]
    assert all(r.pushed_to in (1, 2) for r in records)
    after = [handle.scrape(i) for i in (0, 1, 2)]

    def delta(i: int, name: str) -> float:
        return after[i].get(name, 0.0) - before[i].get(name, 0.0)

    pushed = "workbench:kv_transfer_pushed_loads_total"
    assert delta(1, pushed) + delta(2, pushed) == 2
    assert delta(0, "workbench:kv_transfer_push_bytes_total") > 0
    assert delta(0, "workbench:kv_transfer_send_bytes_total") == 0  # nothing pulled
    assert delta(0, "workbench:kv_transfer_sends_total") == 2  # both buffers released
    want = colocated(handle, 16, prompt)  # after: the decode replicas' caches were cold
    assert got.token_ids == want.token_ids  # type: ignore[attr-defined]
    assert streamed == want.text


def test_a_handshake_a_replica_cannot_honour_is_a_400(handle: Handle) -> None:
    decode = handle.replica(2).base_url + "/v1/completions"
    base = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    r = httpx.post(decode, json={**base, "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status_code == 400 and "needs a prefill instance" in r.text
    r = httpx.post(decode, json={**base, "kv_transfer_params": {"do_remote_prefill": True}})
    assert r.status_code == 400 and "needs remote_engine_id" in r.text


def test_prefill_killed_before_the_read_costs_a_recompute_not_the_request(
        handle: Handle) -> None:
    """The two legs by hand: the prefill answers with its handshake, then the prefill
    replica dies; the decode replica's read is refused and it recomputes the prompt."""
    prefill = handle.replica(0)
    leg = httpx.post(prefill.base_url + "/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": PROMPT + "x = 1", "max_tokens": 1, "temperature": 0.0,
        "ignore_eos": True, "kv_transfer_params": {"do_remote_decode": True}}).json()
    kvp = leg["kv_transfer_params"]
    assert kvp["do_remote_prefill"] is True and kvp["remote_block_ids"]
    want = colocated(handle, 16, PROMPT + "x = 1")
    failed_before = handle.scrape(2).get("workbench:kv_transfer_failed_recvs_total", 0)
    os.killpg(prefill.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while prefill.alive and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not prefill.alive  # the router's health check noticed
    got = handle.client(handle.replica(2).base_url).completions.create(
        model="tiny", prompt=PROMPT + "x = 1", max_tokens=16,
        extra_body={"ignore_eos": True, "return_token_ids": True, "kv_transfer_params": kvp},
        temperature=0.0).choices[0]
    assert got.token_ids == want.token_ids  # type: ignore[attr-defined]
    assert handle.scrape(2)["workbench:kv_transfer_failed_recvs_total"] == failed_before + 1


def test_with_the_prefill_replica_gone_requests_fall_back_to_decode(handle: Handle) -> None:
    want = colocated(handle, 16)
    got = handle.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=16,
                                             **GREEDY).choices[0]
    assert got.token_ids == want.token_ids  # type: ignore[attr-defined]
    assert handle.router.records[-1].prefill_outcome == "fallback"
    flat = prom.parse(httpx.get(handle.url + "/metrics").text)
    assert flat["workbench:disagg_prefill_fallbacks_total"] >= 1


def test_a_decode_replica_killed_mid_stream_is_resumed(handle: Handle) -> None:
    n = 200
    want = colocated(handle, n)
    stream = handle.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=n,
                                                stream=True, **GREEDY)
    ids: list[int] = []
    killed = None
    for chunk in stream:
        for c in chunk.choices:
            ids += c.token_ids or []  # type: ignore[attr-defined]
        if killed is None and len(ids) >= 5:
            busy = [i for i in (1, 2) if handle.replica(i).outstanding > 0]
            assert len(busy) == 1, busy
            killed = busy[0]
            os.killpg(handle.replica(killed).pid, signal.SIGKILL)
    assert killed is not None
    assert ids == want.token_ids  # type: ignore[attr-defined]
    assert not handle.replica(killed).alive
    assert handle.router.resumed_streams == 1
