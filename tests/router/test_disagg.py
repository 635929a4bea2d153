"""The disaggregated router on scripted replicas (`fakes.py`): the prefill leg's body, the
decode leg's body, failures (retry, fallback, 4xx, a decode replica dying mid-stream), the
policies per side, the records and the metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient

from tests.router.fakes import FakeClock, FakeReplica, fake_transport
from workbench.config.named_models import bundled_checkpoint
from workbench.harness import prom
from workbench.models.tokenizer import load_tokenizer
from workbench.router.app import build_router_app
from workbench.router.config import RouterConfig
from workbench.router.disagg import PREFILL_KV_TRANSFER_PARAMS, DisaggRouter, prefill_body
from workbench.router.disagg_pool import url_pool

TOK = load_tokenizer(bundled_checkpoint())
PROMPT = list(range(20, 40))  # 20 ids: one full 16-token block keys prefix_aware
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 3, "temperature": 0.0}


def decode(ids: list[int]) -> str:
    return str(TOK.decode(ids))


@contextmanager
def disagg(num_prefill: int = 2, num_decode: int = 2, **config: Any
           ) -> Iterator[tuple[TestClient, list[FakeReplica], list[FakeReplica], DisaggRouter]]:
    clock = FakeClock()
    prefill = [FakeReplica(f"p{i}", decode, latency_s=0.25, clock=clock)
               for i in range(num_prefill)]
    decoders = [FakeReplica(f"d{i}", decode, latency_s=0.5, clock=clock)
                for i in range(num_decode)]
    cfg = RouterConfig(num_prefill=num_prefill, num_decode=num_decode, block_size=16,
                       prefix_blocks=1, health_interval_s=3600.0, **config)
    pool = url_pool([r.url for r in prefill], [r.url for r in decoders])
    app = build_router_app(cfg, pool, TOK, transport=fake_transport([*prefill, *decoders]))
    with TestClient(app) as client:
        router = app.state.router
        router.clock = clock
        yield client, prefill, decoders, router


def post(client: TestClient, body: dict[str, Any], path: str = "/v1/completions",
         status: int = 200, **kw: Any) -> dict[str, Any]:
    r = client.post(path, json=body, **kw)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


def stream(client: TestClient, body: dict[str, Any], path: str = "/v1/completions"
           ) -> list[Any]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    return [x if x == "[DONE]" else json.loads(x) for x in lines]


def text_of(events: list[Any]) -> str:
    return "".join(c.get("text", "") for e in events if isinstance(e, dict)
                   for c in e.get("choices", []))


# --------------------------------------------------------------------------- the bodies
def test_prefill_body_is_the_clients_with_one_token_no_stream_and_the_params() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 50, "min_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}, "n": 1, "temperature": 0.7}
    assert prefill_body(body) == {
        "model": "m", "prompt": "hi", "max_tokens": 1, "min_tokens": 1, "stream": False,
        "n": 1, "temperature": 0.7,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                               "remote_engine_id": None, "remote_block_ids": None,
                               "remote_host": None, "remote_port": None}}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
    assert prefill_body(chat) == {**chat, "max_tokens": 1, "max_completion_tokens": 1,
                                  "stream": False,
                                  "kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS}
    assert body["max_tokens"] == 50 and "kv_transfer_params" not in body  # not modified


def test_json_request_prefills_then_decodes_with_the_returned_params() -> None:
    with disagg(1, 1) as (client, (p0,), (d0,), router):
        out = post(client, BODY, headers={"x-request-id": "req-7"})
        assert out["choices"][0]["text"] == decode([120, 121, 122])
        assert [s.body for s in p0.completions] == [{
            **BODY, "max_tokens": 1, "stream": False,
            "kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS}]
        assert [s.body for s in d0.completions] == [{**BODY,
                                                     "kv_transfer_params": p0.kv_params}]
        assert [s.request_id for s in [*p0.seen, *d0.seen]] == ["req-7", "req-7"]
        records = client.get("/router/requests").json()["requests"]
        assert records == [{
            "seq": 1, "request_id": "req-7", "stream": False, "prefill_replicas": [0],
            "prefill_outcome": "ok", "prefill_s": 0.25, "decode_replicas": [1], "pushed_to": None,
            "decode_status": 200, "decode_first_byte_s": 0.5}]


def test_stream_decodes_with_the_params_and_relays_the_decode_stream() -> None:
    with disagg(1, 1) as (client, (p0,), (d0,), router):
        body = {**BODY, "stream_options": {"include_usage": True}}
        events = stream(client, body)
        assert text_of(events) == decode([120, 121, 122]) and events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] == 3  # the decode's usage chunk
        assert [s.body for s in p0.completions] == [{
            **BODY, "max_tokens": 1, "stream": False,
            "kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS}]
        assert [s.body for s in d0.completions] == [{
            **body, "stream": True, "return_token_ids": True,
            "kv_transfer_params": p0.kv_params}]
        rid = p0.seen[0].request_id
        assert rid is not None and rid.startswith("disagg-") and d0.seen[0].request_id == rid
        (record,) = router.records
        assert (record.stream, record.prefill_s, record.decode_first_byte_s,
                record.decode_replicas) == (True, 0.25, 0.5, [1])


def test_chat_prefill_caps_max_completion_tokens_too() -> None:
    with disagg(1, 1) as (client, (p0,), (d0,), _):
        chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}],
                "max_completion_tokens": 2}
        out = post(client, chat, "/v1/chat/completions")
        assert out["object"] == "chat.completion"
        assert p0.completions[0].path == "/v1/chat/completions"
        assert p0.completions[0].body == {**chat, "max_tokens": 1, "max_completion_tokens": 1,
                                          "stream": False,
                                          "kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS}
        assert d0.completions[0].body == {**chat, "kv_transfer_params": p0.kv_params}


def test_null_params_decode_without_them() -> None:
    with disagg(1, 1) as (client, (p0,), (d0,), router):
        p0.kv_params = None  # e.g. EOS at the first token: nothing kept to read
        post(client, BODY)
        assert d0.completions[0].body == BODY
        assert (router.prefill_no_params, router.prefill_fallbacks) == (1, 0)
        assert router.records[0].prefill_outcome == "no_params"


# A client's own handshake: a decode replica told to read "request 0" from a host the client
# chose (and the prefill told to push there)
CLIENT_KVP = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "0",
              "remote_block_ids": [1, 2], "remote_host": "attacker.example",
              "remote_port": 4444}


def test_the_clients_kv_transfer_params_reach_neither_leg() -> None:
    """Both legs, JSON and stream, with the prefill's params, without them (null, fallback)
    and on a decode retry: only the router's own params ever reach a replica."""
    with disagg(1, 2, decode_policy="round_robin") as (client, (p0,), (d0, d1), router):
        body = {**BODY, "kv_transfer_params": CLIENT_KVP}
        post(client, body)  # prefill ok: the decode leg carries the prefill's params
        assert p0.completions[0].body["kv_transfer_params"] == PREFILL_KV_TRANSFER_PARAMS
        assert d0.completions[0].body == {**BODY, "kv_transfer_params": p0.kv_params}
        p0.kv_params = None  # null: the decode leg carries none
        events = stream(client, body)
        assert text_of(events) == decode([120, 121, 122])
        assert d1.completions[0].body == {**BODY, "stream": True, "return_token_ids": True}
        d0.mode = "refuse"  # a decode retry: still none of the client's
        post(client, body)
        assert d1.completions[1].body == BODY
        p0.mode = "refuse"  # no prefill replica left: the fallback decode leg has none
        post(client, body)
        assert d1.completions[2].body == BODY
        assert [p.body["kv_transfer_params"] for p in p0.completions] == \
            [PREFILL_KV_TRANSFER_PARAMS] * len(p0.completions)
        assert [r.prefill_outcome for r in router.records] == [
            "ok", "no_params", "no_params", "fallback"]


# --------------------------------------------------------------------------- failures
def test_a_dead_prefill_replica_is_marked_dead_and_the_other_prefills() -> None:
    with disagg(2, 1, prefill_policy="round_robin") as (client, (p0, p1), (d0,), router):
        p0.mode = "refuse"
        post(client, BODY)
        assert not router.pool.replicas[0].alive and router.pool.replicas[1].alive
        assert [s.body["max_tokens"] for s in p1.completions] == [1]
        assert d0.completions[0].body == {**BODY, "kv_transfer_params": p1.kv_params}
        assert (router.prefill_retries, router.prefill_fallbacks) == (1, 0)
        assert router.records[0].prefill_replicas == [0, 1]
        post(client, BODY)  # the dead one is not tried again
        assert router.records[1].prefill_replicas == [1]


def test_a_prefill_5xx_marks_it_dead_and_retries() -> None:
    with disagg(2, 1, prefill_policy="round_robin") as (client, (p0, p1), (d0,), router):
        p0.mode = "status"
        post(client, BODY)
        assert len(p0.completions) == len(p1.completions) == 1
        assert router.pool.replicas[0].failure == "prefill answered 500: " + json.dumps(
            {"error": {"message": "p0 says 500", "type": "Error", "param": None,
                       "code": 500}}, separators=(",", ":"))
        assert d0.completions[0].body["kv_transfer_params"] == p1.kv_params


def test_no_prefill_replica_left_falls_back_to_the_decode_replica() -> None:
    with disagg(2, 1) as (client, (p0, p1), (d0,), router):
        p0.mode = p1.mode = "refuse"
        out = post(client, BODY)
        assert out["choices"][0]["text"] == decode([120, 121, 122])
        assert d0.completions[0].body == BODY  # no kv_transfer_params: it prefills itself
        events = stream(client, BODY)  # both dead now: straight to the fallback
        assert text_of(events) == decode([120, 121, 122])
        assert d0.completions[1].body == {**BODY, "stream": True, "return_token_ids": True}
        assert (router.prefill_fallbacks, router.prefill_retries) == (2, 1)
        assert [(r.prefill_outcome, r.prefill_replicas) for r in router.records] == [
            ("fallback", [0, 1]), ("fallback", [])]
        assert client.get("/health").status_code == 200  # the decode replica serves


def test_a_prefill_4xx_is_the_clients_answer() -> None:
    with disagg(1, 1) as (client, (p0,), (d0,), router):
        p0.mode, p0.status = "status", 400
        out = post(client, BODY, status=400)
        assert out["error"]["message"] == "p0 says 400"
        assert d0.completions == [] and router.pool.replicas[0].alive
        with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
            assert r.status_code == 400 and json.loads(r.read())["error"]["code"] == 400
        assert [r.prefill_outcome for r in router.records] == ["client_error"] * 2


def test_n_above_one_and_batches_are_refused_naming_the_field() -> None:
    with disagg(1, 1) as (client, (p0,), (d0,), router):
        err = post(client, {**BODY, "n": 2}, status=400)["error"]
        assert err["param"] == "n" and err["message"].startswith(
            "n (2) must be 1 with disaggregated prefill/decode")
        err = post(client, {**BODY, "prompt": [PROMPT, PROMPT]}, status=400)["error"]
        assert err["param"] == "prompt" and err["message"].startswith(
            "prompt: a batch of 2 prompts is not served with disaggregated prefill/decode")
        assert p0.seen == [] and d0.seen == [] and list(router.records) == []


def test_a_decode_replica_failing_first_retries_without_the_params() -> None:
    with disagg(1, 2, decode_policy="round_robin") as (client, (p0,), (d0, d1), router):
        d0.mode = "refuse"
        post(client, BODY)
        assert d1.completions[0].body == BODY  # the prefill's KV is not there: recompute
        assert router.records[0].decode_replicas == [1, 2]


def test_a_decode_stream_refused_first_opens_on_the_next_without_the_params() -> None:
    with disagg(1, 2, decode_policy="round_robin") as (client, (p0,), (d0, d1), router):
        d0.mode = "refuse"
        events = stream(client, BODY)
        assert text_of(events) == decode([120, 121, 122])
        assert d1.completions[0].body == {**BODY, "stream": True, "return_token_ids": True}
        assert router.restarted_requests == 1 and router.records[0].decode_replicas == [1, 2]


def test_a_decode_stream_broken_before_its_first_event_restarts_without_the_params() -> None:
    with disagg(1, 2, decode_policy="round_robin") as (client, (p0,), (d0, d1), router):
        d0.break_after = 0
        assert text_of(stream(client, BODY)) == decode([120, 121, 122])
        assert d0.completions[0].body["kv_transfer_params"] == p0.kv_params
        assert d1.completions[0].body == {**BODY, "stream": True, "return_token_ids": True}
        assert not router.pool.replicas[1].alive and router.restarted_requests == 1


def test_a_decode_replica_dying_mid_stream_is_resumed_without_the_params() -> None:
    with disagg(1, 2, decode_policy="round_robin") as (client, (p0,), (d0, d1), router):
        d0.break_after = 2
        body = {**BODY, "max_tokens": 5}
        events = stream(client, body)
        assert text_of(events) == decode([120, 121, 122, 123, 124]) and events[-1] == "[DONE]"
        assert d0.completions[0].body["kv_transfer_params"] == p0.kv_params
        resumed = d1.completions[0].body
        assert resumed["prompt"] == [*PROMPT, 120, 121] and resumed["max_tokens"] == 3
        assert "kv_transfer_params" not in resumed
        assert router.resumed_streams == 1 and router.records[0].decode_replicas == [1, 2]


# --------------------------------------------------------------------------- policies
def test_each_side_has_its_own_policy() -> None:
    with disagg(2, 2, prefill_policy="prefix_aware", decode_policy="round_robin") as (
            client, (p0, p1), (d0, d1), router):
        other = {**BODY, "prompt": list(range(60, 80))}
        for body in (BODY, other, BODY, other):
            post(client, body)
        # prefix_aware: each prompt keeps its prefill replica; round_robin alternates decodes
        assert [r.prefill_replicas for r in router.records] == [[0], [1], [0], [1]]
        assert [r.decode_replicas for r in router.records] == [[2], [3], [2], [3]]
        assert [s.body["prompt"] for s in p0.completions] == [PROMPT, PROMPT]
        assert router.decisions == {"new_key": 2, "owner": 2, "round_robin": 4}


def test_least_outstanding_decode_picks_among_decode_replicas_only() -> None:
    with disagg(1, 2) as (client, _, (d0, d1), router):
        router.pool.replicas[1].outstanding = 3  # d0 busy
        post(client, BODY)
        assert (len(d0.completions), len(d1.completions)) == (0, 1)


# --------------------------------------------------------------------------- observability
def test_metrics_count_prefills_retries_fallbacks_and_time_both_legs() -> None:
    with disagg(2, 1, prefill_policy="round_robin") as (client, (p0, p1), (d0,), router):
        post(client, BODY)
        p0.mode = "refuse"
        post(client, BODY)  # round robin: p1 ... then p0 is tried next and dies
        post(client, BODY)
        p1.mode = "refuse"
        post(client, BODY)  # p1 dies, nothing left: fallback
        flat = prom.parse(client.get("/metrics").text, buckets=True)
        assert {k: v for k, v in flat.items() if k.startswith("workbench:disagg")
                and "_bucket" not in k} == {
            'workbench:disagg_prefill_requests_total{replica="0"}': 2.0,
            'workbench:disagg_prefill_requests_total{replica="1"}': 3.0,
            "workbench:disagg_prefill_retries_total": 1.0,
            "workbench:disagg_prefill_fallbacks_total": 1.0,
            "workbench:disagg_prefill_no_params_total": 0.0,
            "workbench:disagg_kv_push_requests_total": 0.0,
            "workbench:disagg_kv_push_misses_total": 0.0,
            "workbench:disagg_prefill_seconds_count": 3.0,
            "workbench:disagg_prefill_seconds_sum": 0.75,  # 3 x 0.25 (a refusal takes 0 s)
            "workbench:disagg_decode_first_byte_seconds_count": 4.0,
            "workbench:disagg_decode_first_byte_seconds_sum": 2.0,
            'workbench:disagg_info{decode_policy="least_outstanding",kv_push="false",'
            'num_decode="1",num_prefill="2",prefill_policy="round_robin"}': 1.0}
        assert flat['workbench:disagg_prefill_seconds_bucket{le="0.1"}'] == 0.0
        assert flat['workbench:disagg_prefill_seconds_bucket{le="0.25"}'] == 3.0
        assert flat['router_requests_total{replica="2"}'] == 4.0  # the decode legs
        replicas = client.get("/router/replicas").json()
        assert (replicas["mode"], replicas["prefill_policy"], replicas["decode_policy"]) == (
            "disaggregated", "round_robin", "least_outstanding")
        assert [(r["role"], r["alive"]) for r in replicas["replicas"]] == [
            ("prefill", False), ("prefill", False), ("decode", True)]


def test_health_needs_a_live_decode_replica() -> None:
    with disagg(1, 1) as (client, _, _, router):
        assert client.get("/health").status_code == 200
        router.pool.mark_dead(router.pool.replicas[1], "test")
        assert client.get("/health").status_code == 503
        err = post(client, BODY, status=503)["error"]
        assert err["message"].startswith("no live replica could serve the request")
